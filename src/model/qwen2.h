// Qwen2 (Qwen2ForCausalLM) and dense Qwen3 (Qwen3ForCausalLM, the same block with RMSNorm over each
// head's queries and keys before RoPE, no q/k/v biases, head_dim its own): config, one parameter slab
// (fp32 or bf16) with named offsets, HF load/save, and the forward pass over a packed batch of sequences.
#pragma once
#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "base/arena.h"
#include "base/dtype.h"

typedef struct {
    int64_t vocab, hidden, inter, layers, heads, kv_heads, head_dim, max_pos;
    double rope_theta;
    float eps;
    int tied;             // lm_head shares embed_tokens
    int64_t bos_id, eos_id;  // -1 when the config names none
    double init_std;      // initializer_range, used by qwen2_init_random
    int attn_bias;        // q/k/v projections have biases (Qwen2: always; Qwen3: attention_bias)
    int qk_norm;          // Qwen3: RMSNorm over head_dim on each head's query and key, before RoPE
    int vl;               // a Qwen2.5-VL or Qwen2-VL model's language model (0: a text model, as zeroed configs
                          // are)
    int mrope_section[3]; // with vl: M-RoPE's sections (model/vl_rope.h)
    int64_t image_pad_id; // with vl: the image pad token (image_token_id)
    int64_t merger_in;    // not from config.json: with a trained patch merger (actor.vision.train_merger), the
                          // vision tower's width, and its tensors are in the slab (0: not there, frozen)
    int64_t merger_units; // with merger_in: the patches a merged unit concatenates (merge^2)
    int merger_ln_bias;   // with merger_in: its norm is a LayerNorm with a bias (Qwen2-VL)
    int64_t lora_rank;    // not from config.json: the rank of attached LoRA adapters, which the
                          // workspaces leave room for (0: none; set by lora_attach)
    int64_t score_labels; // a reward model (Qwen2/Qwen3ForSequenceClassification): its score head's labels (1),
                          // stored as "score.weight" (labels, C) where lm_head would be (0: a causal LM)
} Qwen2Config;

typedef struct Lora Lora;  // model/lora.h
typedef struct Qwen2Q8 Qwen2Q8;  // below

// Element offsets of the tensors in any slab with the parameter layout (weights of any dtype, fp32
// gradients, Adam moments); per-layer tensors are stacked over layers: layer l of wq starts at
// wq + l*(H*D*C). The field order is the slab order.
typedef struct {
    size_t embed;        // (V, C)
    size_t ln1;          // (L, C)
    size_t wq, bq;       // (L, H*D, C), (L, H*D)
    size_t wk, bk;       // (L, KVH*D, C), (L, KVH*D)
    size_t wv, bv;       // (L, KVH*D, C), (L, KVH*D)
    size_t wo;           // (L, C, H*D)
    size_t qnorm, knorm; // (L, D) each; empty without qk_norm (like the biases without attn_bias)
    size_t ln2;          // (L, C)
    size_t wgate, wup;   // (L, I, C)
    size_t wdown;        // (L, C, I)
    size_t norm;         // (C)
    size_t lm_head;      // (V, C); equals embed when tied
    // With merger_in (h) > 0, the patch merger (vision.h's VisionMerger; U h = merger_in * merger_units);
    // the forward passes do not read it.
    size_t merger_ln_q, merger_ln_q_b;  // (h), (h: Qwen2-VL's LayerNorm; else empty)
    size_t merger_w0, merger_b0;  // (U h, U h), (U h)
    size_t merger_w2, merger_b2;  // (C, U h), (C)
} Qwen2Layout;

typedef struct {
    Qwen2Config cfg;
    const Backend *be;  // where the slab lives and what runs the forward (the CPU unless moved)
    DType dtype;     // of the slab: DTYPE_F32 (master weights), or DTYPE_BF16 (2 bytes a parameter)
    void *params;    // the slab: n_params elements of dtype, in be's memory
    size_t n_params;
    Qwen2Layout w;
    const Lora *lora;  // LoRA adapters every pass adds (NULL: none); the base is then frozen
    const Qwen2Q8 *q8;  // int8 copies of the projections that decode reads instead of the slab (NULL: none)
} Qwen2;

// Int8 weights for decode (rollout.weight_dtype: int8, generate --dtype int8): Q8_0 copies (nn/q8.h) of every
// layer's projections and of lm_head, which forwards of up to SKINNY_MAX_ROWS rows (decode: memory-bound,
// each weight read once a token) read instead of the slab, at 1.06 bytes a weight; longer ones (prefill,
// training: compute-bound) read the slab. Attach with m.q8 = &q on a copy of the model struct.
#define QWEN2_Q8_TENSORS 8  // wq, wk, wv, wo, wgate, wup, wdown, lm_head
struct Qwen2Q8 {
    size_t off[QWEN2_Q8_TENSORS];    // each tensor's slab offset (all layers)
    size_t n[QWEN2_Q8_TENSORS];      // and elements
    size_t first[QWEN2_Q8_TENSORS];  // its first block in `blocks`
    struct Q8Block *blocks;
    size_t n_blocks;
    struct Q8In *xq;  // a projection's input rows quantized: the scratch of one forward at a time
};
// The copies' memory for c (the memory plan counts it): 0 when c's projections cannot be quantized (an input
// width that is not a multiple of 32).
size_t qwen2_q8_bytes(const Qwen2Config *c);
// Room for m's copies; dies naming `what` (the key or flag that asked for int8) when m cannot have them.
void qwen2_q8_init(Qwen2Q8 *q, const Qwen2 *m, const char *what);
// m's projections into q (after each update: the rollout reads the weights as they are now).
void qwen2_q8_quantize(Qwen2Q8 *q, const Qwen2 *m);
void qwen2_q8_free(Qwen2Q8 *q);
// The blocks of the quantized tensor element at slab offset off (a matrix's first row); dies when none.
const struct Q8Block *qwen2_q8_at(const Qwen2Q8 *q, size_t off);

// n floats of x as m's projections read them: x itself (F32 models), or rounded to bf16 into buf.
const void *qwen2_operand(const Qwen2 *m, const float *x, int64_t n, void *buf);

// Element `off` of m's slab (an offset from m->w plus an index), in m's dtype.
static inline const void *qwen2_at(const Qwen2 *m, size_t off) {
    return (const char *)m->params + off * dtype_size(m->dtype);
}

// A q/k/v bias at `off`, or NULL for a model without them (Qwen3).
static inline const void *qwen2_bias(const Qwen2 *m, size_t off) { return m->cfg.attn_bias ? qwen2_at(m, off) : NULL; }

// One tensor as Hugging Face names it, in the slab.
typedef struct {
    char name[80];
    int ndim;
    int64_t shape[2];
    size_t off;   // element offset in the slab
    float *data;  // the tensor in an F32 slab in host memory; NULL in a 16-bit one or on a device
} Qwen2Tensor;

// Reads DIR/config.json; dies naming the file and key on anything unsupported or missing, and on a
// Qwen2.5-VL model (not yet taken by the commands) or a reward model.
void qwen2_config_load(Qwen2Config *c, const char *dir);
// The same, taking a Qwen2.5-VL model's language model too (its text_config, M-RoPE's sections, the image
// pad id): for qwen2_vl_logprobs. Both refuse a reward model.
void qwen2_config_load_vl(Qwen2Config *c, const char *dir);
// A reward model's (dies on any other); and any config.json this file reads (a reward model's too).
void qwen2_config_load_rm(Qwen2Config *c, const char *dir);
void qwen2_config_read(Qwen2Config *c, const char *dir);
// Known shapes: "tiny", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b". Returns 0 if unknown.
int qwen2_config_preset(Qwen2Config *c, const char *name);
const char *qwen2_preset_names(void);
// Dies naming `where` when sizes are inconsistent.
void qwen2_config_check(const Qwen2Config *c, const char *where);

void qwen2_build(Qwen2 *m, const Qwen2Config *c, DType dtype);  // zeroed slab of DTYPE_F32 or DTYPE_BF16
// The same in be's memory.
void qwen2_build_on(Qwen2 *m, const Qwen2Config *c, DType dtype, const Backend *be);
// A model whose slab host code may read (files, checkpoints): m itself on the CPU, else *copy with m's slab
// downloaded (qwen2_free it when the result is copy). The copy has no adapters attached.
const Qwen2 *qwen2_host(const Qwen2 *m, Qwen2 *copy);
// Fills the offsets of the parameter layout; returns the slab's length in elements.
size_t qwen2_layout(const Qwen2Config *c, Qwen2Layout *w);
void qwen2_free(Qwen2 *m);
// Moves m's slab into be's memory (the host copy is freed); m's forward then runs on be.
void qwen2_to_backend(Qwen2 *m, const Backend *be);
// The HF tensors of the model, in slab order; returns their count. `out` may be NULL.
int qwen2_tensors(const Qwen2 *m, Qwen2Tensor *out);

// Loads DIR's weights into a slab of `dtype` (DTYPE_F32 or DTYPE_BF16), converting from the files' dtype.
void qwen2_load(Qwen2 *m, const char *dir, DType dtype);
// The same for a Qwen2.5-VL model's language model (model.layers.* or model.language_model.layers.*).
void qwen2_load_vl(Qwen2 *m, const char *dir, DType dtype);
// The same with the slab of config c (qwen2_config_load_vl's, which may add merger_in: the merger's
// visual.merger.* or model.visual.merger.* tensors are loaded too).
void qwen2_load_config(Qwen2 *m, const char *dir, DType dtype, const Qwen2Config *c);
// The dtype a checkpoint computes in by default: BF16 when its weights are stored in BF16, else F32
// (F16 files widen to fp32: the CPU has no fast fp16 products).
DType qwen2_file_dtype(const char *dir);
// HF's initialisation: N(0, init_std) matrices, zero biases, unit norms. F32 models.
void qwen2_init_random(Qwen2 *m, uint64_t seed);
// config.json + model.safetensors (F32 or BF16), each written atomically. F32 models (on any backend: a device's
// slab is staged through the host).
// config.json's object for c (Qwen2, Qwen3, or with c->vl a Qwen2.5-VL's language model in transformers 4's
// flat layout, to which the caller adds the vision_config); the caller cJSON_Deletes it.
cJSON *qwen2_config_json(const Qwen2Config *c, DType dtype);
// A vision-language model's language model is saved with vl_from's vision tower beside it (transformers 4's
// names: visual.*, model.layers.*, lm_head; a merger in the slab replaces vl_from's) and vl_from's
// config.json (NULL for text models).
void qwen2_save(const Qwen2 *m, const char *dir, DType dtype, const char *vl_from);

// A forward's batch metadata: filled on the host, uploaded in one copy per forward.
typedef struct {
    int32_t *tokens;   // (N)
    int32_t *pos;      // (N) position within its sequence
    int32_t *targets;  // (N) next token, -1 at each sequence's last row
    int32_t *n_keys;   // (N) decode: how many cached positions each row attends to
    int64_t *seq_off;  // (B+1) packed sequence offsets
    int64_t *kv_off;   // (N) decode: where each row's cache slot starts within a layer's cache
    int64_t *kv_dst;   // (N) decode: where its new key and value go
} Qwen2Meta;

// One layer's activations as its forward writes them (backend memory), N rows each. Inference gives every
// layer the same views and keeps the residual stream in place (xin = xout, xn1 = xn2, qr = q, kr = k,
// h = gate); training gives each layer its own and keeps apart what the backward reads.
typedef struct {
    float *xin, *xmid, *xout;  // (N, C) the residual stream entering, after attention, leaving the layer
    float *xn1, *xn2;          // (N, C) the normed inputs of attention and of the MLP
    float *qr, *kr;            // (N, H*D), (N, KVH*D) the q and k projections before their norm
    float *q, *k, *v;          // after the q/k norm and RoPE
    float *att, *lse;          // (N, H*D) attention output; (N, H) its log-sum-exp, or NULL (not kept)
    float *gate, *up, *h;      // (N, I); h = silu(gate) * up
    // Shared by every layer: the rows' RoPE table, bf16 operand buffer, LoRA scratch, attention scratch.
    float *rope, *lora_u, *scratch;
    uint16_t *in16;
} Qwen2LayerActs;

// A packed batch for qwen2_forward_layers: B sequences, N = seq_off[B] rows, in the backend's memory.
typedef struct {
    int B;
    int64_t N;
    const int32_t *tokens, *pos;  // (N) ids and positions within their sequence
    const int64_t *seq_off;       // (B+1)
    const int64_t *host_seq_off;  // the same offsets in host memory, for the KV cache copies (NULL: no cache)
    const struct Qwen2VlInputs *vl;  // image inputs (host memory): M-RoPE's rotation instead of pos's, and
                                     // image features in place of their rows' embeddings; NULL for text
} Qwen2Batch;

// Workspace for a forward pass over at most max_tokens packed rows, in the backend's memory.
typedef struct {
    int64_t max_tokens;
    float *x;       // (N, C) residual stream
    float *xn;      // (N, C) normed input of the current block; the final norm's output at the end
    uint16_t *in16; // (N, max(C, I)) bf16 models: a projection's input rounded to bf16
    float *q;       // (N, H*D)
    float *k, *v;   // (N, KVH*D)
    float *att;     // (N, H*D)
    float *proj;    // (N, C)
    float *gate, *up;  // (N, I)
    float *scratch;    // attention / logprob-head scratch
    float *rope;       // (N, D) RoPE's cosines and sines for the rows' positions
    float *lora_u;     // (N, lora_rank) the adapters' x A^T
    Qwen2LayerActs view;  // every layer's views: the buffers above, in place
    Qwen2Meta dev;     // the metadata where the ops read it
    Qwen2Meta host;    // the host's copy (the same memory on the CPU)
    void *host_block;  // malloc'd host copy when the workspace is on a device
    size_t meta_bytes;
} Qwen2Acts;

// max_keys: the longest sequence (prefill) or cache (decode) attention will see.
// dtype: the weights' (bf16 models need their projections' inputs rounded).
size_t qwen2_acts_bytes(const Backend *be, const Qwen2Config *c, DType dtype, int64_t max_tokens, int64_t max_keys);
void qwen2_acts_init(Qwen2Acts *a, const Backend *be, const Qwen2Config *c, DType dtype, int64_t max_tokens,
                     int64_t max_keys,
                     Arena *arena);
void qwen2_acts_free(Qwen2Acts *a);  // the host copy of the metadata (the arena holds the rest)

// KV cache for generation: the keys (after RoPE) and values of n_slots sequences of up to
// max_len positions each, per layer.
typedef struct {
    int n_slots;
    int64_t max_len, row;  // row = KVH*D floats per position
    float *k, *v;          // (L, n_slots, max_len, row)
} Qwen2KV;

size_t qwen2_kv_bytes_per_token(const Qwen2Config *c);
void qwen2_kv_init(Qwen2KV *kv, const Qwen2Config *c, int n_slots, int64_t max_len, Arena *arena);
// Copies positions [0, n) of slot src into slot dst in every layer (G samples sharing a prompt).
void qwen2_kv_copy(const Qwen2 *m, Qwen2KV *kv, int dst, int src, int64_t n);

// Layer l's forward over the batch into view a (its xin already holds the layer's input). With kv, each
// sequence's keys and values also go to cache slot slots[b], positions 0..len-1.
void qwen2_layer_forward(const Qwen2 *m, int64_t l, const Qwen2Batch *b, const Qwen2LayerActs *a, Qwen2KV *kv,
                         const int32_t *slots);
// The whole forward: the RoPE table of b->pos into views[0].rope, the embedding into views[0].xin, every
// layer l into views[l] (views[0] for all when n_views is 1), the final norm into out (N, C).
void qwen2_forward_layers(const Qwen2 *m, const Qwen2Batch *b, const Qwen2LayerActs *views, int64_t n_views,
                          float *out, Qwen2KV *kv, const int32_t *slots);

// A batch's image inputs (vision-language models), in host memory: every row's rotation table (M-RoPE), and the
// rows that hold image features, which replace those rows' token embeddings after the embedding lookup (and
// give the embedding table no gradient). Made by qwen2_vl_inputs.
typedef struct Qwen2VlInputs {
    int64_t N;                  // rows
    float *rope;                // (N, D) rope_table's layout
    int64_t n_image_rows;
    int64_t *image_rows;        // ascending
    const float **image_feats;  // (n_image_rows) each one row of the model's hidden width: the caller's
                                // features, which must outlive these inputs
    float **image_grads;        // NULL, or (n_image_rows) rows where qwen2_backward adds d(loss)/d(that row's
                                // feature) (a trained merger's input; host; set by the caller, freed with in)
    int64_t *delta;             // (B) per sequence: what M-RoPE adds to a generated token's index
} Qwen2VlInputs;

// The image inputs of a packed batch (tokens, seq_off (B+1)): in sequence b, the image_pad tokens among its
// first prompt_len[b] rows (its prompt; NULL: all of them) take feats[b]'s rows in order (its images' merged
// units, vision_forward's order), and the rotation is M-RoPE's over vl_rope_index's positions of the prompt
// (grids[b]: its n_images[b] images); rows after the prompt (a response) are text counting on from it, as
// decoding placed them, whatever tokens they hold. Allocates in (free with qwen2_vl_inputs_free). Returns 0,
// or -1 when a prompt's pads do not match its grids.
int qwen2_vl_inputs(const Qwen2 *m, const int32_t *tokens, const int64_t *seq_off, int B, const int64_t *prompt_len,
                    const float *const *feats, const int (*const *grids)[3], const int *n_images, int merge,
                    Qwen2VlInputs *in);
void qwen2_vl_inputs_free(Qwen2VlInputs *in);

// tokens (N) packed, seq_off (B+1) with seq_off[0] = 0. Leaves the final hidden states (N, C) in a->xn.
// With kv, sequence b's keys and values also go to cache slot slots[b], positions 0..len-1.
void qwen2_forward(const Qwen2 *m, const int32_t *tokens, const int64_t *seq_off, int B, Qwen2Acts *a, Qwen2KV *kv,
                   const int32_t *slots);
// The same with image inputs (vl: the batch's rotation table and input rows, qwen2_vl_inputs; CPU).
void qwen2_forward_vl(const Qwen2 *m, const int32_t *tokens, const int64_t *seq_off, int B, Qwen2Acts *a,
                      Qwen2KV *kv, const int32_t *slots, const Qwen2VlInputs *vl);
// One new token per sequence: tokens[b] at position pos[b] of cache slot slots[b] (which holds
// positions 0..pos[b]-1). Appends its key/value to the cache and writes logits (B, V) (in be's memory).
// tokens, slots, pos, seq_off: host arrays.
void qwen2_decode_step(const Qwen2 *m, Qwen2KV *kv, const int32_t *tokens, const int32_t *slots, const int32_t *pos,
                       int B, Qwen2Acts *a, float *logits);
// The same with each token's rotation at rope_pos[b] instead of pos[b] (M-RoPE: pos + the prompt's delta; a
// token after the image has three equal positions); the cache is still indexed by pos.
void qwen2_decode_step_at(const Qwen2 *m, Qwen2KV *kv, const int32_t *tokens, const int32_t *slots,
                          const int32_t *pos, const int32_t *rope_pos, int B, Qwen2Acts *a, float *logits);
// logits (B, V) of final-normed hidden states h (B, C) (h may be a row buffer of a, not a->in16).
void qwen2_logits(const Qwen2 *m, const float *h, int64_t B, Qwen2Acts *a, float *logits);
// A reward model's scores (score_labels of them a sequence, out: host memory): the score head over each
// sequence's last row of the final hidden states (Qwen2ForSequenceClassification's pooling, without padding).
void qwen2_seq_scores(const Qwen2 *m, const int32_t *tokens, const int64_t *seq_off, int B, Qwen2Acts *a, float *out);
// Stop tokens: eos_token_id of config.json and generation_config.json (int or list) in DIR.
int qwen2_stop_ids(const char *dir, int32_t *out, int max);
// out (N, host memory): out[i] = log p(tokens[i+1] | tokens[..i]) within each sequence; 0 at each
// sequence's last row.
void qwen2_logprobs(const Qwen2 *m, const int32_t *tokens, const int64_t *seq_off, int B, Qwen2Acts *a, float *out);
// The same with image inputs (a vision-language model's batch, qwen2_vl_inputs; NULL: text).
void qwen2_logprobs_vl(const Qwen2 *m, const int32_t *tokens, const int64_t *seq_off, int B, Qwen2Acts *a,
                       const Qwen2VlInputs *vl, float *out);
// ---------------------------------------------------------------------------------------------
// training: a forward that keeps what backward needs, and the backward into a gradient slab

typedef struct {
    int64_t max_tokens, max_seq;
    const Qwen2VlInputs *vl;  // image inputs of the next forward's batch, or NULL (text)
    int recompute;  // keep only each layer's input; rebuild the rest of a layer during backward
    int head_done;  // the fused forward already ran the head's backward
    float logit_scale;  // log-probs of softmax(logits * logit_scale): 1/temperature, as GRPO samples [1]
    // The batch of the last forward.
    int64_t N, n_sel;
    int B;
    int32_t *tokens, *pos;
    float *rope;  // (max_tokens, D) RoPE's cosines and sines for pos
    int64_t *seq_off;
    int64_t *sel;         // (N) rows that have a target, in order
    int32_t *sel_target;  // (N) their targets
    float *xin;           // (L+1, max_tokens, C): the residual stream entering each layer; [L] enters the final norm
    // Per layer (L of each; one with recompute), each (max_tokens, width):
    float *xn1, *q, *k, *v, *att, *lse, *xmid, *xn2, *gate, *up;
    float *qr, *kr;  // qk_norm: the projections before their norm (none without qk_norm)
    float *xf;    // (N, C) final norm output
    float *hsel;  // (n_sel, C) its rows that have targets: the logprob head never sees the others
    // Backward scratch.
    float *h, *dx, *dxn, *dq, *dk, *dv, *datt, *dgate, *dup, *dsel, *scratch;
    float *dqr, *dkr;  // qk_norm: gradients of the projections before their norm
    uint16_t *in16, *dout16;  // (N, max(C, I)) bf16 models: a projection's operands rounded to bf16
    float *lora_u, *lora_du;  // (N, lora_rank) LoRA scratch
    Qwen2LayerActs *views;    // (L) each layer's views of the buffers above (malloc'd; qwen2_train_free)
    Qwen2Batch batch;         // the last forward's, for recompute
    // Host memory (malloc'd): the batch's metadata as the host makes it, before its upload.
    int32_t *host_pos, *host_sel_target;
    int64_t *host_sel;
} Qwen2Train;

// max_seq: the longest sequence in any batch.
// dtype: the weights' the passes will read.
size_t qwen2_train_bytes(const Backend *be, const Qwen2Config *c, DType dtype, int64_t max_tokens, int64_t max_seq,
                         int recompute);
void qwen2_train_init(Qwen2Train *t, const Backend *be, const Qwen2Config *c, DType dtype, int64_t max_tokens,
                      int64_t max_seq,
                      int recompute, Arena *arena);
void qwen2_train_free(Qwen2Train *t);  // the views (the arena holds the rest)
// The per-token loss interface. tokens (N) packed by seq_off (B+1); targets (N): the token whose
// log-prob row i yields, -1 for none. logp (N) = log p(targets[i] | tokens[..i] of its sequence), 0 where none.
// entropy (N), may be NULL: the entropy of row i's next-token distribution where it has a target, 0 elsewhere.
void qwen2_train_forward(const Qwen2 *m, const int32_t *tokens, const int32_t *targets, const int64_t *seq_off,
                         int B, Qwen2Train *t, float *logp, float *entropy);
// grads (fp32) += d(sum_i dlogp[i] * logp[i] + dent[i] * entropy[i]) / d(parameters), for the last
// forward's batch; dent may be NULL. The parameters are m's slab (grads in its layout), or with LoRA
// adapters attached only the adapters (grads in their layout; the base gets no gradient).
void qwen2_backward(const Qwen2 *m, float *grads, const float *dlogp, const float *dent, Qwen2Train *t);
// For losses whose dlogp is known before the forward (SFT: -1/n per target token): the forward
// and the head's backward in one pass over the vocabulary, saving the logits' recompute.
// qwen2_backward (dlogp unused) then finishes the layers.
void qwen2_train_forward_fused(const Qwen2 *m, float *grads, const int32_t *tokens, const int32_t *targets,
                               const int64_t *seq_off, int B, const float *dlogp, Qwen2Train *t, float *logp);
