// The decoder-only transformer of every model the project reads (Qwen2, Qwen3, Qwen2.5-VL's language model,
// Llama, Mistral, Gemma 3), driven by an architecture table (model/decoder_config.c): a row per Hugging Face
// family says which parts a layer has (q/k/v biases, q/k norms, its own head_dim, M-RoPE, RoPE rescaling,
// sliding windows, Gemma's norms, embedding scale and GELU), its config keys' defaults and its names. Here: the
// config, one parameter slab (fp32 or bf16) with named offsets, HF load/save, the forward pass over a packed
// batch of sequences, the KV cache and decode, and training's forward/backward.
#pragma once
#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "base/arena.h"
#include "base/dtype.h"

// A row of the architecture table.
typedef enum {
    ARCH_QWEN2,
    ARCH_QWEN3,
    ARCH_QWEN2_5_VL,
    ARCH_QWEN2_VL,
    ARCH_LLAMA,
    ARCH_MISTRAL,
    ARCH_GEMMA3,
} DecoderFamily;
typedef struct DecoderArch DecoderArch;

typedef struct {
    DecoderFamily family;  // its row (ARCH_QWEN2 in a zeroed config); the flags below are what the row's layers have
    int64_t vocab, hidden, inter, layers, heads, kv_heads, head_dim, max_pos;
    RopeFreqs rope;
    float eps;
    int tied;             // lm_head shares embed_tokens
    int64_t bos_id, eos_id;  // -1 when the config names none
    double init_std;      // initializer_range, used by decoder_init_random
    int64_t sliding_window;  // > 0: a sliding layer's queries see themselves and the sliding_window - 1 keys
                             // before (Mistral's every layer; Gemma's local layers); 0: full causal attention
    int64_t sliding_pattern; // Gemma: every sliding_pattern-th layer (l + 1 a multiple) is global, the rest slide
                             // (sliding_window_pattern); 0: every layer slides when sliding_window is set
    RopeFreqs rope_local;    // Gemma: the sliding layers' RoPE (rope_local_base_freq); theta 0: rope everywhere
    double query_scalar;     // Gemma: scores scaled by query_scalar^-1/2 (query_pre_attn_scalar); 0: head_dim
    // Gemma's layer: RMSNorms scale by (1 + w) (norm_offset 1), the attention's and the MLP's outputs are normed
    // before their residual add (post_norms), the embeddings are scaled by sqrt(hidden) (embed_scaled) and the MLP
    // is GeGLU (act GLU_GELU_TANH); everyone else's: 0, 0, 0, GLU_SILU.
    float norm_offset;
    int post_norms;
    int embed_scaled;
    GluAct act;
    int attn_bias;        // q/k/v projections have biases (Qwen2 and its VL models)
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
    int64_t score_labels; // a reward model (the family's ...ForSequenceClassification): its score head's labels (1),
                          // stored as "score.weight" (labels, C) where lm_head would be (0: a causal LM)
    DType kv_dtype;       // not from config.json: the KV cache's elements (DTYPE_F32 as zeroed; DTYPE_BF16:
                          // --kv-cache-dtype bf16, rounded as written)
} DecoderConfig;

typedef struct Lora Lora;  // model/lora.h
typedef struct DecoderQ8 DecoderQ8;  // below

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
    size_t post_attn_norm, post_mlp_norm;  // (L, C) each; Gemma's norms of o_proj's and down_proj's outputs (else
                                           // empty); its pre-MLP norm is ln2
    size_t norm;         // (C)
    size_t lm_head;      // (V, C); equals embed when tied
    // With merger_in (h) > 0, the patch merger (vision.h's VisionMerger; U h = merger_in * merger_units);
    // the forward passes do not read it.
    size_t merger_ln_q, merger_ln_q_b;  // (h), (h: Qwen2-VL's LayerNorm; else empty)
    size_t merger_w0, merger_b0;  // (U h, U h), (U h)
    size_t merger_w2, merger_b2;  // (C, U h), (C)
} DecoderLayout;

typedef struct {
    DecoderConfig cfg;
    const Backend *be;  // where the slab lives and what runs the forward (the CPU unless moved)
    DType dtype;     // of the slab: DTYPE_F32 (master weights), or DTYPE_BF16 (2 bytes a parameter)
    void *params;    // the slab: n_params elements of dtype, in be's memory
    size_t n_params;
    DecoderLayout w;
    const Lora *lora;  // LoRA adapters every pass adds (NULL: none); the base is then frozen
    const DecoderQ8 *q8;  // int8 copies of the projections that decode reads instead of the slab (NULL: none)
} Decoder;

// Int8 weights for decode (rollout.weight_dtype: int8, generate --dtype int8): Q8_0 copies (nn/q8.h) of every
// layer's projections and of lm_head, which forwards of up to SKINNY_MAX_ROWS rows (decode: memory-bound,
// each weight read once a token) read instead of the slab, at 1.06 bytes a weight; longer ones (prefill,
// training: compute-bound) read the slab. Attach with m.q8 = &q on a copy of the model struct.
#define DECODER_Q8_TENSORS 8  // wq, wk, wv, wo, wgate, wup, wdown, lm_head
struct DecoderQ8 {
    size_t off[DECODER_Q8_TENSORS];    // each tensor's slab offset (all layers)
    size_t n[DECODER_Q8_TENSORS];      // and elements
    size_t first[DECODER_Q8_TENSORS];  // its first block in `blocks`
    struct Q8Block *blocks;
    size_t n_blocks;
    struct Q8In *xq;  // a projection's input rows quantized: the scratch of one forward at a time
};
// The copies' memory for c (the memory plan counts it): 0 when c's projections cannot be quantized (an input
// width that is not a multiple of 32).
size_t decoder_q8_bytes(const DecoderConfig *c);
// Room for m's copies; dies naming `what` (the key or flag that asked for int8) when m cannot have them.
void decoder_q8_init(DecoderQ8 *q, const Decoder *m, const char *what);
// m's projections into q (after each update: the rollout reads the weights as they are now).
void decoder_q8_quantize(DecoderQ8 *q, const Decoder *m);
void decoder_q8_free(DecoderQ8 *q);
// The blocks of the quantized tensor element at slab offset off (a matrix's first row); dies when none.
const struct Q8Block *decoder_q8_at(const DecoderQ8 *q, size_t off);

// n floats of x as m's projections read them: x itself (F32 models), or rounded to bf16 into buf.
const void *decoder_operand(const Decoder *m, const float *x, int64_t n, void *buf);

// Element `off` of m's slab (an offset from m->w plus an index), in m's dtype.
static inline const void *decoder_at(const Decoder *m, size_t off) {
    return (const char *)m->params + off * dtype_size(m->dtype);
}

// A q/k/v bias at `off`, or NULL for a model without them (Qwen3).
static inline const void *decoder_bias(const Decoder *m, size_t off) {
    return m->cfg.attn_bias ? decoder_at(m, off) : NULL;
}

// One tensor as Hugging Face names it, in the slab.
typedef struct {
    char name[80];
    int ndim;
    int64_t shape[2];
    size_t off;   // element offset in the slab
    float *data;  // the tensor in an F32 slab in host memory; NULL in a 16-bit one or on a device
} DecoderTensor;

// The family's row; the architecture name config.json gives c (...ForSequenceClassification for a reward model).
const DecoderArch *decoder_arch(DecoderFamily family);
const char *decoder_arch_name(const DecoderConfig *c);
// c's family and the parts of a layer its row has (attn_bias, qk_norm, vl): for configs built in code.
void decoder_config_family(DecoderConfig *c, DecoderFamily family);
// Whether layer l slides (sliding_window, sliding_pattern), and its attention: c's heads, its score scale and
// window.
int decoder_layer_slides(const DecoderConfig *c, int64_t l);
AttnShape decoder_attn(const DecoderConfig *c, int64_t l);
// What the embedding's output is multiplied by (1 without embed_scaled; Gemma's sqrt(hidden), rounded to the
// slab's dtype as transformers rounds it to the weights')
float decoder_embed_scale(const DecoderConfig *c, DType dtype);

// Reads DIR/config.json; dies naming the file and key on anything unsupported or missing, and on a
// Qwen2.5-VL model (not yet taken by the commands) or a reward model.
void decoder_config_load(DecoderConfig *c, const char *dir);
// The same, taking a Qwen2.5-VL model's language model too (its text_config, M-RoPE's sections, the image
// pad id): for decoder_vl_logprobs. Both refuse a reward model.
void decoder_config_load_vl(DecoderConfig *c, const char *dir);
// A reward model's (dies on any other); and any config.json this file reads (a reward model's too).
void decoder_config_load_rm(DecoderConfig *c, const char *dir);
void decoder_config_read(DecoderConfig *c, const char *dir);
// Known shapes (decoder_preset_names: Qwen2.5, Qwen3, Llama 3.x, Mistral, and tiny ones); returns 0 if unknown.
int decoder_config_preset(DecoderConfig *c, const char *name);
const char *decoder_preset_names(void);
// Dies naming `where` when sizes are inconsistent.
void decoder_config_check(const DecoderConfig *c, const char *where);

void decoder_build(Decoder *m, const DecoderConfig *c, DType dtype);  // zeroed slab of DTYPE_F32 or DTYPE_BF16
// The same in be's memory.
void decoder_build_on(Decoder *m, const DecoderConfig *c, DType dtype, const Backend *be);
// A model whose slab host code may read (files, checkpoints): m itself on the CPU, else *copy with m's slab
// downloaded (decoder_free it when the result is copy). The copy has no adapters attached.
const Decoder *decoder_host(const Decoder *m, Decoder *copy);
// Fills the offsets of the parameter layout; returns the slab's length in elements.
size_t decoder_layout(const DecoderConfig *c, DecoderLayout *w);
void decoder_free(Decoder *m);
// Moves m's slab into be's memory (the host copy is freed); m's forward then runs on be.
void decoder_to_backend(Decoder *m, const Backend *be);
// The HF tensors of the model, in slab order; returns their count. `out` may be NULL.
int decoder_tensors(const Decoder *m, DecoderTensor *out);

// Loads DIR's weights into a slab of `dtype` (DTYPE_F32 or DTYPE_BF16), converting from the files' dtype.
void decoder_load(Decoder *m, const char *dir, DType dtype);
// The same for a Qwen2.5-VL model's language model (model.layers.* or model.language_model.layers.*).
void decoder_load_vl(Decoder *m, const char *dir, DType dtype);
// The same with the slab of config c (decoder_config_load_vl's, which may add merger_in: the merger's
// visual.merger.* or model.visual.merger.* tensors are loaded too).
void decoder_load_config(Decoder *m, const char *dir, DType dtype, const DecoderConfig *c);
// The dtype a checkpoint computes in by default: BF16 when its weights are stored in BF16, else F32
// (F16 files widen to fp32: the CPU has no fast fp16 products).
DType decoder_file_dtype(const char *dir);
// HF's initialisation: N(0, init_std) matrices, zero biases, unit norms. F32 models.
void decoder_init_random(Decoder *m, uint64_t seed);
// config.json + model.safetensors (F32 or BF16), each written atomically. F32 models (on any backend: a device's
// slab is staged through the host).
// config.json's object for c (Qwen2, Qwen3, or with c->vl a Qwen2.5-VL's language model in transformers 4's
// flat layout, to which the caller adds the vision_config); the caller cJSON_Deletes it.
cJSON *decoder_config_json(const DecoderConfig *c, DType dtype);
// A vision-language model's language model is saved with vl_from's vision tower beside it (transformers 4's
// names: visual.*, model.layers.*, lm_head; a merger in the slab replaces vl_from's) and vl_from's
// config.json (NULL for text models).
void decoder_save(const Decoder *m, const char *dir, DType dtype, const char *vl_from);

// A forward's batch metadata: filled on the host, uploaded in one copy per forward.
typedef struct {
    int32_t *tokens;   // (N)
    int32_t *pos;      // (N) position within its sequence
    int32_t *targets;  // (N) next token, -1 at each sequence's last row
    int32_t *n_keys;   // (N) decode: how many cached positions each row attends to
    int64_t *seq_off;  // (B+1) packed sequence offsets
    int64_t *kv_off;   // (N) decode: where each row's cache slot starts within a layer's cache
    int64_t *kv_dst;   // (N) decode: where its new key and value go
} DecoderMeta;

// One layer's activations as its forward writes them (backend memory), N rows each. Inference gives every
// layer the same views and keeps the residual stream in place (xin = xout, xn1 = xn2, qr = q, kr = k,
// h = gate); training gives each layer its own and keeps apart what the backward reads.
typedef struct {
    float *xin, *xmid, *xout;  // (N, C) the residual stream entering, after attention, leaving the layer
    float *ao, *mo;            // (N, C) o_proj's and down_proj's outputs before post_norms' norms (xmid and xout
                               // where nothing keeps them apart)
    float *xn1, *xn2;          // (N, C) the normed inputs of attention and of the MLP
    float *qr, *kr;            // (N, H*D), (N, KVH*D) the q and k projections before their norm
    float *q, *k, *v;          // after the q/k norm and RoPE
    float *att, *lse;          // (N, H*D) attention output; (N, H) its log-sum-exp, or NULL (not kept)
    float *gate, *up, *h;      // (N, I); h = act(gate) * up
    // Shared by every layer: the rows' RoPE tables (rope_local: Gemma's sliding layers'), bf16 operand buffer,
    // LoRA scratch, attention scratch.
    float *rope, *rope_local, *lora_u, *scratch;
    uint16_t *in16;
} DecoderLayerActs;

// Layer l's RoPE table among a's (rope_local for Gemma's sliding layers, else rope).
const float *decoder_layer_rope(const DecoderConfig *c, int64_t l, const DecoderLayerActs *a);

// A packed batch for decoder_forward_layers: B sequences, N = seq_off[B] rows, in the backend's memory.
typedef struct {
    int B;
    int64_t N;
    const int32_t *tokens, *pos;  // (N) ids and positions within their sequence
    const int64_t *seq_off;       // (B+1)
    const int64_t *host_seq_off;  // the same offsets in host memory, for the KV cache copies (NULL: no cache)
    const struct DecoderVlInputs *vl;  // image inputs (host memory): M-RoPE's rotation instead of pos's, and
                                     // image features in place of their rows' embeddings; NULL for text
} DecoderBatch;

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
    float *rope_local; // (N, D) the same for the sliding layers' RoPE (rope_local's; else empty)
    float *lora_u;     // (N, lora_rank) the adapters' x A^T
    DecoderLayerActs view;  // every layer's views: the buffers above, in place
    DecoderMeta dev;     // the metadata where the ops read it
    DecoderMeta host;    // the host's copy (the same memory on the CPU)
    void *host_block;  // malloc'd host copy when the workspace is on a device
    size_t meta_bytes;
} DecoderActs;

// max_keys: the longest sequence (prefill) or cache (decode) attention will see.
// dtype: the weights' (bf16 models need their projections' inputs rounded).
size_t decoder_acts_bytes(const Backend *be, const DecoderConfig *c, DType dtype, int64_t max_tokens, int64_t max_keys);
void decoder_acts_init(DecoderActs *a, const Backend *be, const DecoderConfig *c, DType dtype, int64_t max_tokens,
                     int64_t max_keys,
                     Arena *arena);
void decoder_acts_free(DecoderActs *a);  // the host copy of the metadata (the arena holds the rest)

// KV cache for generation: the keys (after RoPE) and values of n_slots sequences of up to
// max_len positions each, per layer.
typedef struct {
    int n_slots;
    int64_t max_len, row;  // row = KVH*D elements per position
    DType dtype;           // the elements' (the config's kv_dtype)
    void *k, *v;           // (L, n_slots, max_len, row)
    size_t bytes;          // of k, and of v
    int reserved;          // k and v are backend_kv_reserve's (decoder_kv_reserve), not an arena's
    int on_demand;         // their memory is committed as positions are written (decoder_kv_release: back)
} DecoderKV;

size_t decoder_kv_bytes_per_token(const DecoderConfig *c);
void decoder_kv_init(DecoderKV *kv, const DecoderConfig *c, int n_slots, int64_t max_len, Arena *arena);
// The same cache in memory of its own (backend_kv_reserve: on the CPU, committed as sequences grow);
// decoder_kv_free releases it.
void decoder_kv_reserve(DecoderKV *kv, const Backend *be, const DecoderConfig *c, int n_slots, int64_t max_len);
void decoder_kv_free(DecoderKV *kv, const Backend *be);
// Gives back the memory of the whole pages within positions [from, max_len) of slot `slot` in every layer (what
// they held is lost; reads there see zeros).
void decoder_kv_release(const Decoder *m, DecoderKV *kv, int slot, int64_t from);
// Copies positions [0, n) of slot src into slot dst in every layer (G samples sharing a prompt).
void decoder_kv_copy(const Decoder *m, DecoderKV *kv, int dst, int src, int64_t n);

// Layer l's forward over the batch into view a (its xin already holds the layer's input). With kv, each
// sequence's keys and values also go to cache slot slots[b], positions 0..len-1.
void decoder_layer_forward(const Decoder *m, int64_t l, const DecoderBatch *b, const DecoderLayerActs *a, DecoderKV *kv,
                         const int32_t *slots);
// The whole forward: the RoPE table of b->pos into views[0].rope, the embedding into views[0].xin, every
// layer l into views[l] (views[0] for all when n_views is 1), the final norm into out (N, C).
void decoder_forward_layers(const Decoder *m, const DecoderBatch *b, const DecoderLayerActs *views, int64_t n_views,
                          float *out, DecoderKV *kv, const int32_t *slots);

// A batch's image inputs (vision-language models), in host memory: every row's rotation table (M-RoPE), and the
// rows that hold image features, which replace those rows' token embeddings after the embedding lookup (and
// give the embedding table no gradient). Made by decoder_vl_inputs.
typedef struct DecoderVlInputs {
    int64_t N;                  // rows
    float *rope;                // (N, D) rope_table's layout
    int64_t n_image_rows;
    int64_t *image_rows;        // ascending
    const float **image_feats;  // (n_image_rows) each one row of the model's hidden width: the caller's
                                // features, which must outlive these inputs
    float **image_grads;        // NULL, or (n_image_rows) rows where decoder_backward adds d(loss)/d(that row's
                                // feature) (a trained merger's input; host; set by the caller, freed with in)
    int64_t *delta;             // (B) per sequence: what M-RoPE adds to a generated token's index
} DecoderVlInputs;

// The image inputs of a packed batch (tokens, seq_off (B+1)): in sequence b, the image_pad tokens among its
// first prompt_len[b] rows (its prompt; NULL: all of them) take feats[b]'s rows in order (its images' merged
// units, vision_forward's order), and the rotation is M-RoPE's over vl_rope_index's positions of the prompt
// (grids[b]: its n_images[b] images); rows after the prompt (a response) are text counting on from it, as
// decoding placed them, whatever tokens they hold. Allocates in (free with decoder_vl_inputs_free). Returns 0,
// or -1 when a prompt's pads do not match its grids.
int decoder_vl_inputs(const Decoder *m, const int32_t *tokens, const int64_t *seq_off, int B, const int64_t *prompt_len,
                    const float *const *feats, const int (*const *grids)[3], const int *n_images, int merge,
                    DecoderVlInputs *in);
void decoder_vl_inputs_free(DecoderVlInputs *in);

// tokens (N) packed, seq_off (B+1) with seq_off[0] = 0. Leaves the final hidden states (N, C) in a->xn.
// With kv, sequence b's keys and values also go to cache slot slots[b], positions 0..len-1.
void decoder_forward(const Decoder *m, const int32_t *tokens, const int64_t *seq_off, int B, DecoderActs *a,
                     DecoderKV *kv, const int32_t *slots);
// The same with image inputs (vl: the batch's rotation table and input rows, decoder_vl_inputs; CPU).
void decoder_forward_vl(const Decoder *m, const int32_t *tokens, const int64_t *seq_off, int B, DecoderActs *a,
                      DecoderKV *kv, const int32_t *slots, const DecoderVlInputs *vl);
// One new token per sequence: tokens[b] at position pos[b] of cache slot slots[b] (which holds
// positions 0..pos[b]-1). Appends its key/value to the cache and writes logits (B, V) (in be's memory).
// tokens, slots, pos, seq_off: host arrays.
void decoder_decode_step(const Decoder *m, DecoderKV *kv, const int32_t *tokens, const int32_t *slots,
                         const int32_t *pos, int B, DecoderActs *a, float *logits);
// The same with each token's rotation at rope_pos[b] instead of pos[b] (M-RoPE: pos + the prompt's delta; a
// token after the image has three equal positions); the cache is still indexed by pos.
void decoder_decode_step_at(const Decoder *m, DecoderKV *kv, const int32_t *tokens, const int32_t *slots,
                          const int32_t *pos, const int32_t *rope_pos, int B, DecoderActs *a, float *logits);
// N rows, each a token at its own position of a cache slot: row b is tokens[b] at position pos[b] of slot
// slots[b]; every position before it is in the slot's cache or a row of this batch, and no two rows share a
// (slot, position). Appends every row's key/value to the cache, then each row attends up to its own position;
// leaves the final-normed hidden states (N, C) in a->xn. Decode rows, and a prompt's rows after those its slot
// holds (prefix caching, chunked prefill), in one forward; rope_pos as decoder_decode_step_at's.
void decoder_extend(const Decoder *m, DecoderKV *kv, const int32_t *tokens, const int32_t *slots, const int32_t *pos,
                    const int32_t *rope_pos, int64_t N, DecoderActs *a);
// logits (B, V) of final-normed hidden states h (B, C) (h may be a row buffer of a, not a->in16).
void decoder_logits(const Decoder *m, const float *h, int64_t B, DecoderActs *a, float *logits);
// A reward model's scores (score_labels of them a sequence, out: host memory): the score head over each
// sequence's last row of the final hidden states (Qwen2ForSequenceClassification's pooling, without padding).
void decoder_seq_scores(const Decoder *m, const int32_t *tokens, const int64_t *seq_off, int B, DecoderActs *a,
                        float *out);
// Stop tokens: eos_token_id of config.json and generation_config.json (int or list) in DIR.
int decoder_stop_ids(const char *dir, int32_t *out, int max);
// out (N, host memory): out[i] = log p(tokens[i+1] | tokens[..i]) within each sequence; 0 at each
// sequence's last row.
void decoder_logprobs(const Decoder *m, const int32_t *tokens, const int64_t *seq_off, int B, DecoderActs *a,
                      float *out);
// The same with image inputs (a vision-language model's batch, decoder_vl_inputs; NULL: text).
void decoder_logprobs_vl(const Decoder *m, const int32_t *tokens, const int64_t *seq_off, int B, DecoderActs *a,
                       const DecoderVlInputs *vl, float *out);
// ---------------------------------------------------------------------------------------------
// training: a forward that keeps what backward needs, and the backward into a gradient slab

typedef struct {
    int64_t max_tokens, max_seq;
    const DecoderVlInputs *vl;  // image inputs of the next forward's batch, or NULL (text)
    int recompute;  // keep only each layer's input; rebuild the rest of a layer during backward
    int head_done;  // the fused forward already ran the head's backward
    float logit_scale;  // log-probs of softmax(logits * logit_scale): 1/temperature, as GRPO samples [1]
    // The batch of the last forward.
    int64_t N, n_sel;
    int B;
    int32_t *tokens, *pos;
    float *rope;  // (max_tokens, D) RoPE's cosines and sines for pos
    float *rope_local;  // (max_tokens, D) the sliding layers' (rope_local; else empty)
    int64_t *seq_off;
    int64_t *sel;         // (N) rows that have a target, in order
    int32_t *sel_target;  // (N) their targets
    float *xin;           // (L+1, max_tokens, C): the residual stream entering each layer; [L] enters the final norm
    // Per layer (L of each; one with recompute), each (max_tokens, width):
    float *xn1, *q, *k, *v, *att, *lse, *xmid, *xn2, *gate, *up;
    float *qr, *kr;  // qk_norm: the projections before their norm (none without qk_norm)
    float *ao, *mo;  // post_norms: o_proj's and down_proj's outputs before their norms (none without)
    float *xf;    // (N, C) final norm output
    float *hsel;  // (n_sel, C) its rows that have targets: the logprob head never sees the others
    // Backward scratch.
    float *h, *dx, *dxn, *dq, *dk, *dv, *datt, *dgate, *dup, *dsel, *scratch;
    float *dqr, *dkr;  // qk_norm: gradients of the projections before their norm
    float *dpost;      // post_norms: (N, C) the gradient of a post-norm's input
    uint16_t *in16, *dout16;  // (N, max(C, I)) bf16 models: a projection's operands rounded to bf16
    float *lora_u, *lora_du;  // (N, lora_rank) LoRA scratch
    DecoderLayerActs *views;    // (L) each layer's views of the buffers above (malloc'd; decoder_train_free)
    DecoderBatch batch;         // the last forward's, for recompute
    // Host memory (malloc'd): the batch's metadata as the host makes it, before its upload.
    int32_t *host_pos, *host_sel_target;
    int64_t *host_sel;
} DecoderTrain;

// max_seq: the longest sequence in any batch.
// dtype: the weights' the passes will read.
size_t decoder_train_bytes(const Backend *be, const DecoderConfig *c, DType dtype, int64_t max_tokens, int64_t max_seq,
                         int recompute);
void decoder_train_init(DecoderTrain *t, const Backend *be, const DecoderConfig *c, DType dtype, int64_t max_tokens,
                      int64_t max_seq,
                      int recompute, Arena *arena);
void decoder_train_free(DecoderTrain *t);  // the views (the arena holds the rest)
// The per-token loss interface. tokens (N) packed by seq_off (B+1); targets (N): the token whose
// log-prob row i yields, -1 for none. logp (N) = log p(targets[i] | tokens[..i] of its sequence), 0 where none.
// entropy (N), may be NULL: the entropy of row i's next-token distribution where it has a target, 0 elsewhere.
void decoder_train_forward(const Decoder *m, const int32_t *tokens, const int32_t *targets, const int64_t *seq_off,
                         int B, DecoderTrain *t, float *logp, float *entropy);
// grads (fp32) += d(sum_i dlogp[i] * logp[i] + dent[i] * entropy[i]) / d(parameters), for the last
// forward's batch; dent may be NULL. The parameters are m's slab (grads in its layout), or with LoRA
// adapters attached only the adapters (grads in their layout; the base gets no gradient).
void decoder_backward(const Decoder *m, float *grads, const float *dlogp, const float *dent, DecoderTrain *t);
// For losses whose dlogp is known before the forward (SFT: -1/n per target token): the forward
// and the head's backward in one pass over the vocabulary, saving the logits' recompute.
// decoder_backward (dlogp unused) then finishes the layers.
void decoder_train_forward_fused(const Decoder *m, float *grads, const int32_t *tokens, const int32_t *targets,
                               const int64_t *seq_off, int B, const float *dlogp, DecoderTrain *t, float *logp);
