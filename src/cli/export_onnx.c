// grpo export --format onnx: the decoder with its KV cache as Hugging Face Optimum exports a causal LM (the folder
// transformers.js loads: onnx/model.onnx beside config.json, generation_config.json and the tokenizer), in plain
// opset-17 operators so any ONNX runtime or compiler takes it; a VL model as transformers.js's image-text-to-text
// sessions (embed_tokens, decoder_model_merged: inputs_embeds and M-RoPE's (3, B, S) position_ids,
// vision_encoder) and the static graph of the image itself (vision_encoder_image), below.
//
// The graph, B sequences of S new tokens after P cached ones (T = P + S):
//   input_ids (B, S), attention_mask (B, T), position_ids (B, S), past_key_values.l.key/value (B, KVH, P, D)
//   -> logits (B, S, V), present.l.key/value (B, KVH, T, D)
// A reward model's, Optimum's text classifier (no cache; positions counted from the mask):
//   input_ids (B, S), attention_mask (B, S) -> logits (B, labels) at each row's last kept token
// Rows are flattened to (B*S, width) between the attentions, so each projection is one Gemm on the stored
// (out, in) matrix (transB). f16 stores the matrices in half precision and computes in fp32 (a Cast after each
// weight), so its inputs and outputs are fp32 as the f32 file's are.
#include "cli/export_onnx.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/util.h"
#include "io/image.h"
#include "io/onnx.h"
#include "model/vl_processor.h"

#define INLINE_MAX ((size_t)2000000000)  // protobuf's messages stop at 2 GiB: weights past 2 GB go beside

typedef struct {
    Onnx *g;
    const Decoder *m;
    OnnxType wtype;          // the matrices' type in the file
    const char *shape_bs;    // (B, S) of input_ids (inputs_embeds), as an int64 vector
    const char *seq;         // S, a scalar
    const char *cos, *sin;   // (B, 1, S, D): the RoPE tables (and of Gemma's sliding layers)
    const char *cos_local, *sin_local;
    const char *mask, *mask_window;  // (B, 1, S, T): 0 where a query sees a key, else -1e30
    int cached;              // the layers read past_key_values and write present (0: a reward model's graph)
} Graph;

static const char *ints(Graph *G, int n, ...) {
    int64_t v[ONNX_MAX_DIMS];
    if (n > ONNX_MAX_DIMS) die("internal: an ONNX shape of %d values", n);
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) v[i] = va_arg(ap, int64_t);
    va_end(ap);
    return onnx_ints(G->g, n, v);
}

// Nodes of one and two inputs and no attributes, each a fresh value. Calls are never nested in another's
// arguments (their order of evaluation, and so the file's node order, would be the compiler's).
static const char *op1(Graph *G, const char *op, const char *a) {
    return onnx_node(G->g, NULL, op, NULL, a, NULL);
}

static const char *op2(Graph *G, const char *op, const char *a, const char *b) {
    return onnx_node(G->g, NULL, op, NULL, a, b, NULL);
}

// A (rows, cols) matrix of the slab at off, stored as the file's type, read as fp32.
static const char *matrix(Graph *G, const char *name, size_t off, int64_t rows, int64_t cols) {
    int64_t dims[2] = {rows, cols};
    const char *w = onnx_weight(G->g, name, decoder_at(G->m, off), G->m->dtype, G->wtype, 2, dims);
    return G->wtype == ONNX_FLOAT ? w : onnx_node(G->g, NULL, "Cast", "to=1", w, NULL);
}

// n values of the slab at off, plus `add` (Gemma's norms scale by 1 + w), as fp32.
static const char *vector(Graph *G, const char *name, size_t off, int64_t n, float add) {
    float *v = xmalloc((size_t)n * sizeof *v);
    dtype_to_f32(G->m->dtype, decoder_at(G->m, off), v, (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] += add;
    const char *t = onnx_floats(G->g, name, v, n);
    free(v);
    return t;
}

// x (rows, in) @ W^T (+ bias): W the (out, in) matrix `name`.weight at w; its bias at b when has_bias.
static const char *linear(Graph *G, const char *x, const char *name, size_t w, int has_bias, size_t b, int64_t out,
                          int64_t in) {
    char *n = xprintf("%s.weight", name);
    const char *W = matrix(G, n, w, out, in);
    free(n);
    if (!has_bias) return onnx_node(G->g, NULL, "Gemm", "transB=1", x, W, NULL);
    n = xprintf("%s.bias", name);
    const char *B = vector(G, n, b, out, 0);
    free(n);
    return onnx_node(G->g, NULL, "Gemm", "transB=1", x, W, B, NULL);
}

// RMSNorm over x's last axis with the weight vector w (fp32): x / sqrt(mean(x^2) + eps) * w.
static const char *rmsnorm(Graph *G, const char *x, const char *w, float eps) {
    const char *sq = op2(G, "Mul", x, x);
    const char *ms = onnx_node(G->g, NULL, "ReduceMean", "axes=-1, keepdims=1", sq, NULL);
    const char *rms = op1(G, "Sqrt", op2(G, "Add", ms, onnx_scalar(G->g, eps)));
    return op2(G, "Mul", op2(G, "Div", x, rms), w);
}

// RMSNorm by the slab's weight vector `name`.weight at off (n wide).
static const char *norm(Graph *G, const char *x, const char *name, size_t off, int64_t n) {
    char *wn = xprintf("%s.weight", name);
    const char *w = vector(G, wn, off, n, G->m->cfg.norm_offset);
    free(wn);
    return rmsnorm(G, x, w, G->m->cfg.eps);
}

// x (..., D) rotated: x cos + rotate_half(x) sin, rotate_half(x) = [-x2, x1] of its halves.
static const char *rope(Graph *G, const char *x, int64_t D, const char *cos, const char *sin) {
    Onnx *g = G->g;
    const char *axis = ints(G, 1, (int64_t)-1), *zero = ints(G, 1, (int64_t)0);
    const char *half = ints(G, 1, D / 2), *end = ints(G, 1, D);
    const char *x1 = onnx_node(g, NULL, "Slice", NULL, x, zero, half, axis, NULL);
    const char *x2 = onnx_node(g, NULL, "Slice", NULL, x, half, end, axis, NULL);
    const char *rot = onnx_node(g, NULL, "Concat", "axis=-1", op1(G, "Neg", x2), x1, NULL);
    const char *a = op2(G, "Mul", x, cos);
    return op2(G, "Add", a, op2(G, "Mul", rot, sin));
}

// The (B, 1, S, D) cos and sin tables of f's angles at position_ids ((3, B, S) of a VL model's: M-RoPE).
static void rope_tables(Graph *G, RopeFreqs f, const char **cos, const char **sin) {
    Onnx *g = G->g;
    int D = (int)G->m->cfg.head_dim;
    float *inv = xmalloc((size_t)D / 2 * sizeof *inv);
    for (int j = 0; j < D / 2; j++) inv[j] = (float)rope_inv_freq(f, j, D);
    const char *freq = onnx_floats(g, NULL, inv, D / 2);
    free(inv);
    const char *pos = onnx_node(g, NULL, "Cast", "to=1", "position_ids", NULL);
    pos = op2(G, "Unsqueeze", pos, ints(G, 1, (int64_t)-1));
    const char *ang = op2(G, "Mul", pos, freq);
    if (G->m->cfg.vl) {  // M-RoPE: pair j's angle from the position row (time, row, column) of its section
        const int *sec = G->m->cfg.mrope_section;
        float *pick = xcalloc((size_t)3 * D / 2, sizeof *pick);
        for (int j = 0; j < D / 2; j++) pick[(j < sec[0] ? 0 : j < sec[0] + sec[1] ? 1 : 2) * D / 2 + j] = 1;
        const char *sel = onnx_floats(g, NULL, pick, 3 * D / 2);
        free(pick);
        sel = op2(G, "Reshape", sel, ints(G, 4, (int64_t)3, (int64_t)1, (int64_t)1, (int64_t)D / 2));
        ang = onnx_node(g, NULL, "ReduceSum", "keepdims=0", op2(G, "Mul", ang, sel), ints(G, 1, (int64_t)0), NULL);
    }
    ang = onnx_node(g, NULL, "Concat", "axis=-1", ang, ang, NULL);
    const char *one = ints(G, 1, (int64_t)1);
    *cos = op2(G, "Unsqueeze", op1(G, "Cos", ang), one);
    *sin = op2(G, "Unsqueeze", op1(G, "Sin", ang), one);
}

// The additive masks the layers use: query i (cache position T - S + i) sees key j when j <= its position and
// the attention mask keeps the key; mask_window: and j is within the window (model/decoder.h's sliding_window).
static void masks(Graph *G) {
    Onnx *g = G->g;
    const DecoderConfig *c = &G->m->cfg;
    int full = 0, window = 0;
    for (int64_t l = 0; l < c->layers; l++) {
        window |= decoder_layer_slides(c, l);
        full |= !decoder_layer_slides(c, l);
    }
    const char *zero = onnx_int(g, 0), *one = onnx_int(g, 1);
    const char *T = op1(G, "Squeeze", onnx_node(g, NULL, "Shape", "start=1", "attention_mask", NULL));
    const char *S = G->seq;
    const char *keys = onnx_node(g, NULL, "Range", NULL, zero, T, one, NULL);
    const char *queries = onnx_node(g, NULL, "Range", NULL, op2(G, "Sub", T, S), T, one, NULL);
    queries = op2(G, "Unsqueeze", queries, ints(G, 1, (int64_t)1));  // (S, 1)
    const char *keep = onnx_node(g, NULL, "Cast", "to=9", "attention_mask", NULL);
    keep = op2(G, "Unsqueeze", keep, ints(G, 2, (int64_t)1, (int64_t)2));  // (B, 1, 1, T)
    const char *causal = op2(G, "LessOrEqual", keys, queries);  // (S, T)
    const char *ok = onnx_scalar(g, 0), *masked = onnx_scalar(g, -1e30f);
    if (full) G->mask = onnx_node(g, NULL, "Where", NULL, op2(G, "And", keep, causal), ok, masked, NULL);
    if (window) {
        const char *from = op2(G, "Sub", queries, onnx_int(g, c->sliding_window));
        const char *near = op2(G, "And", causal, op2(G, "Greater", keys, from));
        G->mask_window = onnx_node(g, NULL, "Where", NULL, op2(G, "And", keep, near), ok, masked, NULL);
    }
}

// One head group's projection (B*S, heads*D) as (B, heads, S, D), its norm (Qwen3, Gemma) and RoPE.
static const char *heads(Graph *G, const char *x, int64_t n, const char *norm_w, const char *cos,
                         const char *sin) {
    const char *dims = ints(G, 2, n, G->m->cfg.head_dim);
    const char *shape = onnx_node(G->g, NULL, "Concat", "axis=0", G->shape_bs, dims, NULL);
    x = op2(G, "Reshape", x, shape);
    if (norm_w) x = rmsnorm(G, x, norm_w, G->m->cfg.eps);
    x = onnx_node(G->g, NULL, "Transpose", "perm=0,2,1,3", x, NULL);
    return cos ? rope(G, x, G->m->cfg.head_dim, cos, sin) : x;
}

// Attention of layer l: q (B, H, S, D) over the cache's keys and values k, v (B, KVH, T, D), the H/KVH query
// heads of a key head as one (B, KVH, H/KVH * S, D) block of rows (so no key is repeated); out (B*S, H*D).
static const char *attention(Graph *G, int64_t l, const char *q, const char *k, const char *v) {
    Onnx *g = G->g;
    const DecoderConfig *c = &G->m->cfg;
    int64_t D = c->head_dim, H = c->heads, KVH = c->kv_heads;
    AttnShape at = decoder_attn(c, l);
    q = op2(G, "Mul", q, onnx_scalar(g, at.scale));
    q = op2(G, "Reshape", q, ints(G, 4, (int64_t)0, KVH, (int64_t)-1, D));
    const char *kt = onnx_node(g, NULL, "Transpose", "perm=0,1,3,2", k, NULL);
    const char *s = op2(G, "MatMul", q, kt);
    s = op2(G, "Reshape", s, ints(G, 4, (int64_t)0, H, (int64_t)-1, (int64_t)0));  // (B, H, S, T)
    s = op2(G, "Add", s, at.window ? G->mask_window : G->mask);
    s = onnx_node(g, NULL, "Softmax", "axis=-1", s, NULL);
    s = op2(G, "Reshape", s, ints(G, 4, (int64_t)0, KVH, (int64_t)-1, (int64_t)0));
    const char *o = op2(G, "MatMul", s, v);
    o = op2(G, "Reshape", o, ints(G, 4, (int64_t)0, H, (int64_t)-1, D));  // (B, H, S, D)
    o = onnx_node(g, NULL, "Transpose", "perm=0,2,1,3", o, NULL);
    return op2(G, "Reshape", o, ints(G, 2, (int64_t)-1, H * D));
}

// The MLP's activation of gate, times up: SiLU, or Gemma's GELU in its tanh form,
// x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
static const char *glu(Graph *G, const char *gate, const char *up) {
    Onnx *g = G->g;
    const char *act;
    if (G->m->cfg.act == GLU_SILU) {
        act = op2(G, "Mul", gate, op1(G, "Sigmoid", gate));
    } else {
        const char *x3 = op2(G, "Mul", op2(G, "Mul", gate, gate), gate);
        const char *in = op2(G, "Add", gate, op2(G, "Mul", x3, onnx_scalar(g, 0.044715f)));
        in = op2(G, "Mul", in, onnx_scalar(g, 0.7978845608028654f));
        const char *t = op1(G, "Tanh", in);
        t = op2(G, "Add", t, onnx_scalar(g, 1.0f));
        act = op2(G, "Mul", op2(G, "Mul", gate, onnx_scalar(g, 0.5f)), t);
    }
    return op2(G, "Mul", act, up);
}

// Layer l on x (B*S, C): attention over the cache (its present keys and values as the graph's outputs), the MLP.
static const char *layer(Graph *G, int64_t l, const char *x) {
    Onnx *g = G->g;
    const DecoderConfig *c = &G->m->cfg;
    const DecoderLayout *w = &G->m->w;
    int64_t C = c->hidden, I = c->inter, D = c->head_dim, H = c->heads, KVH = c->kv_heads;
    int64_t Q = H * D, KV = KVH * D;
    int local = decoder_layer_slides(c, l) && c->rope_local.theta > 0;
    char p[96], name[128];
    snprintf(p, sizeof p, "model.layers.%lld.", (long long)l);
#define NAME(s) (snprintf(name, sizeof name, "%s%s", p, s), name)
    const char *h = norm(G, x, NAME("input_layernorm"), w->ln1 + l * C, C);
    int bias = c->attn_bias;
    const char *q = linear(G, h, NAME("self_attn.q_proj"), w->wq + l * Q * C, bias, w->bq + l * Q, Q, C);
    const char *k = linear(G, h, NAME("self_attn.k_proj"), w->wk + l * KV * C, bias, w->bk + l * KV, KV, C);
    const char *v = linear(G, h, NAME("self_attn.v_proj"), w->wv + l * KV * C, bias, w->bv + l * KV, KV, C);
    const char *qn = NULL, *kn = NULL;
    if (c->qk_norm) {
        qn = vector(G, NAME("self_attn.q_norm.weight"), w->qnorm + l * D, D, c->norm_offset);
        kn = vector(G, NAME("self_attn.k_norm.weight"), w->knorm + l * D, D, c->norm_offset);
    }
    const char *cos = local ? G->cos_local : G->cos, *sin = local ? G->sin_local : G->sin;
    q = heads(G, q, H, qn, cos, sin);
    k = heads(G, k, KVH, kn, cos, sin);
    v = heads(G, v, KVH, NULL, NULL, NULL);
    char past_k[64], past_v[64], present_k[64], present_v[64];
    snprintf(past_k, sizeof past_k, "past_key_values.%lld.key", (long long)l);
    snprintf(past_v, sizeof past_v, "past_key_values.%lld.value", (long long)l);
    snprintf(present_k, sizeof present_k, "present.%lld.key", (long long)l);
    snprintf(present_v, sizeof present_v, "present.%lld.value", (long long)l);
    if (G->cached) {
        k = onnx_node(g, present_k, "Concat", "axis=2", past_k, k, NULL);  // (B, KVH, T, D)
        v = onnx_node(g, present_v, "Concat", "axis=2", past_v, v, NULL);
    }
    const char *o = attention(G, l, q, k, v);
    o = linear(G, o, NAME("self_attn.o_proj"), w->wo + l * C * Q, 0, 0, C, Q);
    if (c->post_norms) o = norm(G, o, NAME("post_attention_layernorm"), w->post_attn_norm + l * C, C);
    x = op2(G, "Add", x, o);
    const char *ln2 = c->post_norms ? "pre_feedforward_layernorm" : "post_attention_layernorm";
    h = norm(G, x, NAME(ln2), w->ln2 + l * C, C);
    const char *gate = linear(G, h, NAME("mlp.gate_proj"), w->wgate + l * I * C, 0, 0, I, C);
    const char *up = linear(G, h, NAME("mlp.up_proj"), w->wup + l * I * C, 0, 0, I, C);
    const char *mo = linear(G, glu(G, gate, up), NAME("mlp.down_proj"), w->wdown + l * C * I, 0, 0, C, I);
    if (c->post_norms) mo = norm(G, mo, NAME("post_feedforward_layernorm"), w->post_mlp_norm + l * C, C);
#undef NAME
    return op2(G, "Add", x, mo);
}

// The graph's inputs and outputs, Optimum's names and symbolic axes (a VL model's language model,
// transformers.js's decoder_model_merged: inputs_embeds for input_ids, three rows of position_ids; a reward
// model's, Optimum's text classifier: input_ids and attention_mask -> logits (B, labels)).
static void graph_io(Onnx *g, const DecoderConfig *c) {
    char logits[64], embeds[64];
    if (c->score_labels) {
        onnx_io(g, 0, "input_ids", ONNX_INT64, "batch_size,sequence_length");
        onnx_io(g, 0, "attention_mask", ONNX_INT64, "batch_size,sequence_length");
        snprintf(logits, sizeof logits, "batch_size,%lld", (long long)c->score_labels);
        onnx_io(g, 1, "logits", ONNX_FLOAT, logits);
        return;
    }
    snprintf(embeds, sizeof embeds, "batch_size,sequence_length,%lld", (long long)c->hidden);
    if (c->vl)
        onnx_io(g, 0, "inputs_embeds", ONNX_FLOAT, embeds);
    else
        onnx_io(g, 0, "input_ids", ONNX_INT64, "batch_size,sequence_length");
    onnx_io(g, 0, "attention_mask", ONNX_INT64, "batch_size,total_sequence_length");
    const char *positions = c->vl ? "3,batch_size,sequence_length" : "batch_size,sequence_length";
    onnx_io(g, 0, "position_ids", ONNX_INT64, positions);
    snprintf(logits, sizeof logits, "batch_size,sequence_length,%lld", (long long)c->vocab);
    onnx_io(g, 1, "logits", ONNX_FLOAT, logits);
    const char *kinds[2] = {"key", "value"};
    for (int64_t l = 0; l < c->layers; l++) {
        for (int i = 0; i < 2; i++) {
            char name[64], shape[96];
            long long kvh = c->kv_heads, D = c->head_dim;
            snprintf(shape, sizeof shape, "batch_size,%lld,past_sequence_length,%lld", kvh, D);
            snprintf(name, sizeof name, "past_key_values.%lld.%s", (long long)l, kinds[i]);
            onnx_io(g, 0, name, ONNX_FLOAT, shape);
            snprintf(shape, sizeof shape, "batch_size,%lld,total_sequence_length,%lld", kvh, D);
            snprintf(name, sizeof name, "present.%lld.%s", (long long)l, kinds[i]);
            onnx_io(g, 1, name, ONNX_FLOAT, shape);
        }
    }
}

// A reward model's position_ids, from its attention mask: each kept token's place among the kept ones (so a
// left-padded sequence is scored as it is alone; right padding gives transformers' positions).
static void mask_positions(Graph *G) {
    const char *zero = onnx_int(G->g, 0), *one = onnx_int(G->g, 1);
    const char *kept = onnx_node(G->g, NULL, "CumSum", NULL, "attention_mask", one, NULL);
    const char *pos = op2(G, "Sub", kept, one);
    onnx_node(G->g, "position_ids", "Max", NULL, pos, zero, NULL);
}

// A reward model's logits (B, labels): the score head on x (B*S, C, final-normed) at each row's last kept token,
// as transformers' ...ForSequenceClassification pools them (its last non-pad token).
static void classifier_head(Graph *G, const char *x) {
    Onnx *g = G->g;
    const DecoderConfig *c = &G->m->cfg;
    const char *head = matrix(G, "score.weight", G->m->w.lm_head, c->score_labels, c->hidden);
    const char *scores = onnx_node(g, NULL, "Gemm", "transB=1", x, head, NULL);
    const char *shape = onnx_node(g, NULL, "Concat", "axis=0", G->shape_bs, ints(G, 1, c->score_labels), NULL);
    scores = op2(G, "Reshape", scores, shape);  // (B, S, labels)
    const char *zero = onnx_int(g, 0), *one = onnx_int(g, 1);
    const char *places = onnx_node(g, NULL, "Range", NULL, zero, G->seq, one, NULL);
    const char *kept = op2(G, "Mul", "attention_mask", places);
    const char *last = onnx_node(g, NULL, "ArgMax", "axis=1 keepdims=1", kept, NULL);  // (B, 1)
    onnx_node(g, "logits", "GatherND", "batch_dims=1", scores, last, NULL);
}

static void decoder_graph(Onnx *g, const Decoder *m, OnnxType wtype) {
    const DecoderConfig *c = &m->cfg;
    const DecoderLayout *w = &m->w;
    Graph G = {.g = g, .m = m, .wtype = wtype, .cached = !c->score_labels};
    graph_io(g, c);
    const char *in = c->vl ? "inputs_embeds" : "input_ids";
    G.shape_bs = onnx_node(g, NULL, "Shape", "end=2", in, NULL);
    G.seq = op1(&G, "Squeeze", onnx_node(g, NULL, "Shape", "start=1 end=2", in, NULL));
    if (!G.cached) mask_positions(&G);
    rope_tables(&G, c->rope, &G.cos, &G.sin);
    if (c->rope_local.theta > 0) rope_tables(&G, c->rope_local, &G.cos_local, &G.sin_local);
    masks(&G);
    const char *embed = NULL, *x = in;
    if (!c->vl || c->tied) embed = matrix(&G, "model.embed_tokens.weight", w->embed, c->vocab, c->hidden);
    if (!c->vl) x = op2(&G, "Gather", embed, "input_ids");
    x = op2(&G, "Reshape", x, ints(&G, 2, (int64_t)-1, c->hidden));
    if (c->embed_scaled) x = op2(&G, "Mul", x, onnx_scalar(g, decoder_embed_scale(c, m->dtype)));
    for (int64_t l = 0; l < c->layers; l++) x = layer(&G, l, x);
    x = norm(&G, x, "model.norm", w->norm, c->hidden);
    if (!G.cached) {
        classifier_head(&G, x);
        return;
    }
    const char *head = c->tied ? embed : matrix(&G, "lm_head.weight", w->lm_head, c->vocab, c->hidden);
    const char *logits = onnx_node(g, NULL, "Gemm", "transB=1", x, head, NULL);
    const char *shape = onnx_node(g, NULL, "Concat", "axis=0", G.shape_bs, ints(&G, 1, (int64_t)-1), NULL);
    onnx_node(g, "logits", "Reshape", NULL, logits, shape, NULL);
}

// A VL model's embedding (transformers.js's embed_tokens): input_ids -> inputs_embeds.
static void embed_graph(Onnx *g, const Decoder *m, OnnxType wtype) {
    const DecoderConfig *c = &m->cfg;
    Graph G = {.g = g, .m = m, .wtype = wtype};
    char shape[64];
    snprintf(shape, sizeof shape, "batch_size,sequence_length,%lld", (long long)c->hidden);
    onnx_io(g, 0, "input_ids", ONNX_INT64, "batch_size,sequence_length");
    onnx_io(g, 1, "inputs_embeds", ONNX_FLOAT, shape);
    const char *embed = matrix(&G, "model.embed_tokens.weight", m->w.embed, c->vocab, c->hidden);
    onnx_node(g, "inputs_embeds", "Gather", NULL, embed, "input_ids", NULL);
}

// ---- The vision tower of a Qwen2.5-VL / Qwen2-VL model, for one image size (a static graph):
//   pixel_values (N, 3 * temporal * patch^2), the processor's patches, and image_grid_thw (1, 3) (Qwen2-VL:
//   grid_thw), which transformers.js feeds and the graph does not read (its grid is fixed)
//   -> image_features (N / merge^2, out_hidden)
// The windows' order, the 2-D rotations and the windows' masks are constants of the grid.

// A matrix (rows, cols) of the tower's (fp32), stored as the file's type, read as fp32.
static const char *fmatrix(Graph *G, const char *name, const float *w, int64_t rows, int64_t cols) {
    int64_t dims[2] = {rows, cols};
    const char *t = onnx_weight(G->g, name, w, DTYPE_F32, G->wtype, 2, dims);
    return G->wtype == ONNX_FLOAT ? t : onnx_node(G->g, NULL, "Cast", "to=1", t, NULL);
}

// x (rows, in) @ W^T + b for the tower's Linear `name` (W (out, in), b (out)).
static const char *flinear(Graph *G, const char *x, const char *name, const float *w, const float *b, int64_t out,
                           int64_t in) {
    char *n = xprintf("%s.weight", name);
    const char *W = fmatrix(G, n, w, out, in);
    free(n);
    n = xprintf("%s.bias", name);
    const char *B = onnx_floats(G->g, n, b, out);
    free(n);
    return onnx_node(G->g, NULL, "Gemm", "transB=1", x, W, B, NULL);
}

// The tower's norm `name` of x (rows, C): RMSNorm, or with a bias (Qwen2-VL) LayerNorm.
static const char *fnorm(Graph *G, const char *x, const char *name, const float *w, const float *b, int64_t C,
                         float eps) {
    char *n = xprintf("%s.weight", name);
    const char *W = onnx_floats(G->g, n, w, C);
    free(n);
    if (!b) return rmsnorm(G, x, W, eps);
    n = xprintf("%s.bias", name);
    const char *B = onnx_floats(G->g, n, b, C);
    free(n);
    char *attrs = xprintf("axis=-1 epsilon=%.9e", (double)eps);
    const char *y = onnx_node(G->g, NULL, "LayerNormalization", attrs, x, W, B, NULL);
    free(attrs);
    return y;
}

// The (N, N) additive mask of the segments seg[0..n_seg] (rows): 0 within one, -1e30 across; made in the graph
// from each row's segment (the file holds N values, not N^2).
static const char *segment_mask(Graph *G, const int64_t *seg, int n_seg, int64_t N) {
    int64_t *id = xmalloc((size_t)N * sizeof *id);
    for (int a = 0; a < n_seg; a++)
        for (int64_t i = seg[a]; i < seg[a + 1]; i++) id[i] = a;
    const char *ids = onnx_ints(G->g, (int)N, id);
    free(id);
    const char *rows = op2(G, "Unsqueeze", ids, ints(G, 1, (int64_t)1));
    const char *cols = op2(G, "Unsqueeze", ids, ints(G, 1, (int64_t)0));
    const char *same = op2(G, "Equal", rows, cols);
    const char *ok = onnx_scalar(G->g, 0), *masked = onnx_scalar(G->g, -1e30f);
    return onnx_node(G->g, NULL, "Where", NULL, same, ok, masked, NULL);
}

// Block l of the tower on x (N, C) in window order; mask: its attention's (NULL: the whole image).
static const char *vision_block(Graph *G, const Vision *v, int l, const char *x, const char *cos, const char *sin,
                                const char *mask, int64_t N) {
    const VisionConfig *c = &v->cfg;
    const VisionBlock *b = &v->blocks[l];
    int64_t C = c->hidden, H = c->heads, D = C / H, I = c->intermediate;
    char p[64], name[128];
    snprintf(p, sizeof p, "visual.blocks.%d.", l);
#define NAME(s) (snprintf(name, sizeof name, "%s%s", p, s), name)
    const char *h = fnorm(G, x, NAME("norm1"), b->norm1, b->norm1_b, C, c->eps);
    const char *qkv = flinear(G, h, NAME("attn.qkv"), b->qkv_w, b->qkv_b, 3 * C, C);
    qkv = op2(G, "Reshape", qkv, ints(G, 4, N, (int64_t)3, H, D));
    qkv = onnx_node(G->g, NULL, "Transpose", "perm=1,2,0,3", qkv, NULL);  // (3, H, N, D)
    const char *q = onnx_node(G->g, NULL, "Gather", "axis=0", qkv, onnx_int(G->g, 0), NULL);
    const char *k = onnx_node(G->g, NULL, "Gather", "axis=0", qkv, onnx_int(G->g, 1), NULL);
    const char *val = onnx_node(G->g, NULL, "Gather", "axis=0", qkv, onnx_int(G->g, 2), NULL);
    q = rope(G, q, D, cos, sin);
    k = rope(G, k, D, cos, sin);
    q = op2(G, "Mul", q, onnx_scalar(G->g, 1.0f / sqrtf((float)D)));
    const char *kt = onnx_node(G->g, NULL, "Transpose", "perm=0,2,1", k, NULL);
    const char *s = op2(G, "MatMul", q, kt);  // (H, N, N)
    if (mask) s = op2(G, "Add", s, mask);
    s = onnx_node(G->g, NULL, "Softmax", "axis=-1", s, NULL);
    const char *o = op2(G, "MatMul", s, val);
    o = onnx_node(G->g, NULL, "Transpose", "perm=1,0,2", o, NULL);
    o = op2(G, "Reshape", o, ints(G, 2, N, C));
    o = flinear(G, o, NAME("attn.proj"), b->proj_w, b->proj_b, C, C);
    x = op2(G, "Add", x, o);
    h = fnorm(G, x, NAME("norm2"), b->norm2, b->norm2_b, C, c->eps);
    const char *a;
    if (c->qwen2) {  // fc1, quick_gelu (x sigmoid(1.702 x)), fc2
        a = flinear(G, h, NAME("mlp.fc1"), b->up_w, b->up_b, I, C);
        const char *z = op1(G, "Sigmoid", op2(G, "Mul", a, onnx_scalar(G->g, 1.702f)));
        a = op2(G, "Mul", a, z);
        o = flinear(G, a, NAME("mlp.fc2"), b->down_w, b->down_b, C, I);
    } else {  // SwiGLU with biases
        const char *gate = flinear(G, h, NAME("mlp.gate_proj"), b->gate_w, b->gate_b, I, C);
        const char *up = flinear(G, h, NAME("mlp.up_proj"), b->up_w, b->up_b, I, C);
        a = op2(G, "Mul", op2(G, "Mul", gate, op1(G, "Sigmoid", gate)), up);
        o = flinear(G, a, NAME("mlp.down_proj"), b->down_w, b->down_b, C, I);
    }
#undef NAME
    return op2(G, "Add", x, o);
}

// The (N, D) cos and sin tables in rotate-half layout from vision_rope's rows (cos h, cos w, sin h, sin w).
static void vision_tables(Graph *G, const float *cs, int64_t N, int64_t D, const char **cos, const char **sin) {
    float *c = xmalloc((size_t)(N * D) * sizeof *c), *s = xmalloc((size_t)(N * D) * sizeof *s);
    for (int64_t r = 0; r < N; r++)
        for (int64_t j = 0; j < D; j++) {
            c[r * D + j] = cs[r * D + j % (D / 2)];
            s[r * D + j] = cs[r * D + D / 2 + j % (D / 2)];
        }
    const char *shape = ints(G, 2, N, D);
    *cos = op2(G, "Reshape", onnx_floats(G->g, NULL, c, N * D), shape);
    *sin = op2(G, "Reshape", onnx_floats(G->g, NULL, s, N * D), shape);
    free(c);
    free(s);
}

// One pass of Pillow's bicubic resize along `axis` (-1: the columns, -2: the rows) of x (3, H, W) in double, as
// its 8-bit resample computes it: the fixed-point weights as a dense matrix, (2^21 + sum) >> 22, clipped.
static const char *resize_pass(Graph *G, const char *x, int axis, int in, int out) {
    int *bounds;
    int32_t *kk;
    int ks = image_bicubic_coeffs(in, out, &bounds, &kk);
    double *k = xcalloc((size_t)in * out, sizeof *k);  // (in, out) for the columns, (out, in) for the rows
    for (int o = 0; o < out; o++)
        for (int i = 0; i < bounds[2 * o + 1]; i++) {
            int src = bounds[2 * o] + i;
            k[axis == -1 ? (size_t)src * out + o : (size_t)o * in + src] = kk[(size_t)o * ks + i];
        }
    const char *m = onnx_doubles(G->g, k, (int64_t)in * out);
    const char *dims = axis == -1 ? ints(G, 2, (int64_t)in, (int64_t)out) : ints(G, 2, (int64_t)out, (int64_t)in);
    m = op2(G, "Reshape", m, dims);
    free(k);
    free(bounds);
    free(kk);
    const char *sum = axis == -1 ? op2(G, "MatMul", x, m) : op2(G, "MatMul", m, x);
    double half = 1 << (IMAGE_PRECISION_BITS - 1), one = 1 << IMAGE_PRECISION_BITS, lo = 0, hi = 255;
    sum = op2(G, "Add", sum, onnx_doubles(G->g, &half, 1));
    sum = op1(G, "Floor", op2(G, "Div", sum, onnx_doubles(G->g, &one, 1)));
    return op2(G, "Max", op2(G, "Min", sum, onnx_doubles(G->g, &hi, 1)), onnx_doubles(G->g, &lo, 1));
}

// The processor's patches (N, 3 * temporal * patch^2) of the graph's input "image" (1, 3, height, width), RGB
// values 0..255 in float32 (NCHW): Pillow's bicubic resize to rh x rw, rescale (double, then float32),
// normalise, each patch's (channel, frame, y, x) values in rows of the merge order (model/vl_processor.h).
static const char *image_patches(Graph *G, const VlProcessor *p, int width, int height, int rh, int rw) {
    Onnx *g = G->g;
    const char *x = op2(G, "Reshape", "image", ints(G, 3, (int64_t)3, (int64_t)height, (int64_t)width));
    x = onnx_node(g, NULL, "Cast", "to=11", x, NULL);
    if (rw != width) x = resize_pass(G, x, -1, width, rw);  // Pillow leaves an unchanged axis alone
    if (rh != height) x = resize_pass(G, x, -2, height, rh);
    x = op2(G, "Mul", x, onnx_doubles(g, &p->rescale, 1));
    x = onnx_node(g, NULL, "Cast", "to=1", x, NULL);
    const char *c3 = ints(G, 3, (int64_t)3, (int64_t)1, (int64_t)1);
    x = op2(G, "Sub", x, op2(G, "Reshape", onnx_floats(g, NULL, p->mean, 3), c3));
    x = op2(G, "Div", x, op2(G, "Reshape", onnx_floats(g, NULL, p->std, 3), c3));
    int64_t P = p->patch, M = p->merge, T = p->temporal, gh = rh / P, gw = rw / P;
    const char *frame = op2(G, "Unsqueeze", x, ints(G, 1, (int64_t)1));  // (3, 1, rh, rw): the image, T times
    x = frame;
    for (int64_t t = 1; t < T; t++) x = onnx_node(g, NULL, "Concat", "axis=1", x, frame, NULL);
    int64_t split[8] = {3, T, gh / M, M, P, gw / M, M, P};  // (c, t, bh, mh, y, bw, mw, x)
    x = op2(G, "Reshape", x, onnx_ints(g, 8, split));
    x = onnx_node(g, NULL, "Transpose", "perm=2,5,3,6,0,1,4,7", x, NULL);  // (bh, bw, mh, mw, c, t, y, x)
    return op2(G, "Reshape", x, ints(G, 2, gh * gw, (int64_t)vl_patch_dim(p)));
}

// The tower and its merger for the grid of one image (t = 1), from the patches (pixel_values), or with p from the
// image itself (image_patches).
static void vision_graph(Onnx *g, const Vision *v, const int grid[3], const VlProcessor *p, const int image[2],
                         OnnxType wtype) {
    const VisionConfig *c = &v->cfg;
    Graph G = {.g = g, .wtype = wtype};
    int64_t U = (int64_t)c->merge * c->merge, N = (int64_t)grid[0] * grid[1] * grid[2], units = N / U;
    int64_t C = c->hidden, D = C / c->heads, patch_dim = vl_patch_dim(p);
    char shape[64];
    const char *pixels = "pixel_values";
    if (image) {
        snprintf(shape, sizeof shape, "1,3,%d,%d", image[1], image[0]);
        onnx_io(g, 0, "image", ONNX_FLOAT, shape);
        pixels = image_patches(&G, p, image[0], image[1], grid[1] * p->patch, grid[2] * p->patch);
    } else {
        snprintf(shape, sizeof shape, "%lld,%lld", (long long)N, (long long)patch_dim);
        onnx_io(g, 0, "pixel_values", ONNX_FLOAT, shape);
        onnx_io(g, 0, c->qwen2 ? "grid_thw" : "image_grid_thw", ONNX_INT64, "1,3");  // transformers.js's names
    }
    snprintf(shape, sizeof shape, "%lld,%d", (long long)units, c->out_hidden);
    onnx_io(g, 1, "image_features", ONNX_FLOAT, shape);
    int64_t *index = xmalloc((size_t)units * sizeof *index), *seg = xmalloc((size_t)(units + 2) * sizeof *seg);
    int n_seg = vision_windows(c, grid, index, seg);
    int64_t *perm = xmalloc((size_t)N * sizeof *perm), *back = xmalloc((size_t)N * sizeof *back);
    for (int64_t u = 0; u < units; u++)  // row u*U + k of the window order is the image's patch index[u]*U + k
        for (int64_t k = 0; k < U; k++) {
            perm[u * U + k] = index[u] * U + k;
            back[index[u] * U + k] = u * U + k;
        }
    float *cs = xmalloc((size_t)(N * D) * sizeof *cs);
    vision_rope(c, grid, index, cs);
    const char *cos, *sin;
    vision_tables(&G, cs, N, D, &cos, &sin);
    for (int a = 0; a <= n_seg; a++) seg[a] *= U;  // in patches
    // an image is one frame: the full-attention blocks see all of it, the others their windows
    const char *windows = c->qwen2 ? NULL : segment_mask(&G, seg, n_seg, N);
    const char *x = fmatrix(&G, "visual.patch_embed.proj.weight", v->patch_w, C, patch_dim);
    x = onnx_node(g, NULL, "Gemm", "transB=1", pixels, x, NULL);
    x = onnx_node(g, NULL, "Gather", "axis=0", x, onnx_ints(g, (int)N, perm), NULL);
    for (int l = 0; l < c->depth; l++) {
        int full = c->qwen2;
        for (int i = 0; i < c->n_fullatt; i++) full |= c->fullatt[i] == l;
        x = vision_block(&G, v, l, x, cos, sin, full ? NULL : windows, N);
    }
    x = onnx_node(g, NULL, "Gather", "axis=0", x, onnx_ints(g, (int)N, back), NULL);  // the image's order
    const VisionMerger *w = &v->merger;
    x = fnorm(&G, x, "visual.merger.ln_q", w->ln_q, w->ln_q_b, C, c->eps);
    x = op2(&G, "Reshape", x, ints(&G, 2, units, U * C));
    x = flinear(&G, x, "visual.merger.mlp.0", w->w0, w->b0, U * C, U * C);
    const char *e = op1(&G, "Erf", op2(&G, "Mul", x, onnx_scalar(g, 0.70710678118654752f)));  // exact GELU
    e = op2(&G, "Mul", op2(&G, "Mul", x, onnx_scalar(g, 0.5f)), op2(&G, "Add", e, onnx_scalar(g, 1.0f)));
    x = flinear(&G, e, "visual.merger.mlp.2", w->w2, w->b2, c->out_hidden, U * C);
    onnx_node(g, "image_features", "Identity", NULL, x, NULL);
    free(index);
    free(seg);
    free(perm);
    free(back);
    free(cs);
}

// g as out/onnx/<base>.onnx (f16: <base>_fp16.onnx), its weights in the file's "_data" companion when external or
// past 2 GB; *external_name (malloc'd): that graph's file name when it has one, else NULL.
static void write_graph(const Onnx *g, const char *out, const char *base, int f16, int external,
                        char **external_name) {
    char *name = xprintf("%s%s.onnx", base, f16 ? "_fp16" : ""), *data = xprintf("%s_data", name);
    char *sub = path_join(out, "onnx");
    dir_create(sub);
    char *path = path_join(sub, name);
    external = external || onnx_weight_bytes(g) > INLINE_MAX;
    onnx_write(g, path, external ? data : NULL, 1);
    *external_name = external ? xstrdup(name) : NULL;
    free(name);
    free(data);
    free(sub);
    free(path);
}

void export_onnx_grid(const VlProcessor *p, int width, int height, int grid[3]) {
    int rh, rw;
    char err[160];
    if (vl_smart_resize(height, width, p->patch * p->merge, p->min_pixels, p->max_pixels, &rh, &rw, err,
                        sizeof err))
        die("option --image-size: %s", err);
    grid[0] = 1;
    grid[1] = rh / p->patch;
    grid[2] = rw / p->patch;
}

// The files beside the graph that transformers.js (and a tokenizer) reads, copied from the model when it has them.
static const char *const SIDE_FILES[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                         "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json",
                                         "generation_config.json", "preprocessor_config.json", NULL};

// A VL model's config as transformers.js reads it: Qwen2.5-VL's language model under text_config (its
// model_type "<type>_text"), Qwen2-VL's at the top level; what the model's config has in one place is copied to
// the other.
static void vl_config(cJSON *cfg) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(cfg, "model_type");
    cJSON *text = cJSON_GetObjectItemCaseSensitive(cfg, "text_config");
    int made = !cJSON_IsObject(text);
    if (made) {
        text = cJSON_Duplicate(cfg, 1);
        if (!text || !cJSON_AddItemToObject(cfg, "text_config", text)) die("out of memory");
        static const char *const drop[] = {"vision_config", "model_type", "architectures",
                                           "transformers.js_config"};
        for (size_t i = 0; i < sizeof drop / sizeof *drop; i++)
            cJSON_DeleteItemFromObjectCaseSensitive(text, drop[i]);
    }
    if (!cJSON_HasObjectItem(text, "model_type")) {
        char *name = xprintf("%s_text", cJSON_IsString(type) ? type->valuestring : "qwen2_5_vl");
        if (!cJSON_AddStringToObject(text, "model_type", name)) die("out of memory");
        free(name);
    }
    for (const cJSON *e = made ? NULL : text->child; e; e = e->next) {
        if (cJSON_HasObjectItem(cfg, e->string) || !strcmp(e->string, "model_type")) continue;
        cJSON *dup = cJSON_Duplicate(e, 1);
        if (!dup || !cJSON_AddItemToObject(cfg, e->string, dup)) die("out of memory");
    }
}

// config.json as the model's, its transformers.js_config naming the graphs that have external data (the
// external[0..n) names; and no other: one the model's config named may be gone).
static void write_config(const char *dir, const char *out, char *const *external, int n, int vl) {
    char *from = path_join(dir, "config.json"), *to = path_join(out, "config.json");
    cJSON *cfg = json_load_file(from, FILE_MAX_JSON);
    if (vl) vl_config(cfg);
    cJSON *js = cJSON_GetObjectItemCaseSensitive(cfg, "transformers.js_config");
    if (!cJSON_IsObject(js)) {
        cJSON_DeleteItemFromObjectCaseSensitive(cfg, "transformers.js_config");
        js = cJSON_AddObjectToObject(cfg, "transformers.js_config");
    }
    if (!js) die("out of memory");
    cJSON_DeleteItemFromObjectCaseSensitive(js, "use_external_data_format");
    cJSON *ext = NULL;
    for (int i = 0; i < n; i++) {
        if (!external[i]) continue;
        if (!ext) ext = cJSON_AddObjectToObject(js, "use_external_data_format");
        if (!ext || !cJSON_AddNumberToObject(ext, external[i], 1)) die("out of memory");
    }
    json_save_file(to, cfg);
    cJSON_Delete(cfg);
    free(from);
    free(to);
}

// generation_config.json when the model has none: its bos and eos (those it has).
static void write_generation_config(const DecoderConfig *c, const char *out) {
    char *to = path_join(out, "generation_config.json");
    cJSON *gen = cJSON_CreateObject();
    if (!gen || (c->bos_id >= 0 && !cJSON_AddNumberToObject(gen, "bos_token_id", (double)c->bos_id)) ||
        (c->eos_id >= 0 && !cJSON_AddNumberToObject(gen, "eos_token_id", (double)c->eos_id)))
        die("out of memory");
    json_save_file(to, gen);
    cJSON_Delete(gen);
    free(to);
}

// preprocessor_config.json when a VL model has none: the processor grpo exported with (its defaults).
static void write_preprocessor_config(const VlProcessor *p, const char *out) {
    char *to = path_join(out, "preprocessor_config.json");
    cJSON *j = cJSON_CreateObject();
    double mean[3] = {p->mean[0], p->mean[1], p->mean[2]}, std[3] = {p->std[0], p->std[1], p->std[2]};
    if (!j || !cJSON_AddStringToObject(j, "image_processor_type", "Qwen2VLImageProcessor") ||
        !cJSON_AddNumberToObject(j, "min_pixels", (double)p->min_pixels) ||
        !cJSON_AddNumberToObject(j, "max_pixels", (double)p->max_pixels) ||
        !cJSON_AddNumberToObject(j, "patch_size", p->patch) ||
        !cJSON_AddNumberToObject(j, "temporal_patch_size", p->temporal) ||
        !cJSON_AddNumberToObject(j, "merge_size", p->merge) ||
        !cJSON_AddNumberToObject(j, "rescale_factor", p->rescale) ||
        !cJSON_AddItemToObject(j, "image_mean", cJSON_CreateDoubleArray(mean, 3)) ||
        !cJSON_AddItemToObject(j, "image_std", cJSON_CreateDoubleArray(std, 3)))
        die("out of memory");
    json_save_file(to, j);
    cJSON_Delete(j);
    free(to);
}

// A graph one export writes, and its file's name (base).
typedef struct {
    const char *base;
    Onnx g;
} NamedGraph;

size_t export_onnx(const Decoder *m, const char *dir, const char *out, int f16, int external,
                   const OnnxVision *vis) {
    OnnxType wtype = f16 ? ONNX_FLOAT16 : ONNX_FLOAT;
    NamedGraph gs[4];
    memset(gs, 0, sizeof gs);
    gs[0].base = m->cfg.vl ? "decoder_model_merged" : "model";
    int n = 1;
    decoder_graph(&gs[0].g, m, wtype);
    if (m->cfg.vl) {  // transformers.js's sessions of an image-text-to-text model, and the image's own graph
        if (!vis) die("internal: a VL model's ONNX without its vision tower");
        gs[n].base = "embed_tokens";
        embed_graph(&gs[n++].g, m, wtype);
        int image[2] = {vis->width, vis->height};
        for (int from_image = 0; from_image < 2; from_image++) {
            gs[n].base = from_image ? "vision_encoder_image" : "vision_encoder";
            vision_graph(&gs[n++].g, vis->v, vis->grid, vis->p, from_image ? image : NULL, wtype);
        }
    }
    size_t bytes = 0;
    for (int i = 0; i < n; i++) {
        onnx_check_range(&gs[i].g);  // every graph before anything is written
        bytes += onnx_weight_bytes(&gs[i].g);
    }
    char *ext[4] = {NULL, NULL, NULL, NULL};
    for (int i = 0; i < n; i++) write_graph(&gs[i].g, out, gs[i].base, f16, external, &ext[i]);
    write_config(dir, out, ext, n, m->cfg.vl);
    for (int i = 0; SIDE_FILES[i]; i++) {
        char *from = path_join(dir, SIDE_FILES[i]), *to = path_join(out, SIDE_FILES[i]);
        if (file_exists(from)) file_copy(from, to);
        free(from);
        free(to);
    }
    char *gen = path_join(dir, "generation_config.json"), *pre = path_join(dir, "preprocessor_config.json");
    if (!file_exists(gen) && !m->cfg.score_labels) write_generation_config(&m->cfg, out);
    if (m->cfg.vl && !file_exists(pre)) write_preprocessor_config(vis->p, out);
    dir_fsync(out);
    free(gen);
    free(pre);
    for (int i = 0; i < n; i++) {
        free(ext[i]);
        onnx_free(&gs[i].g);
    }
    return bytes;
}
