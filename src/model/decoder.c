#include "model/decoder.h"

#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "model/lora.h"
#include "nn/q8.h"
#include "nn/skinny.h"

// ---------------------------------------------------------------------------------------------
// forward

// The batch metadata block of N rows: tokens, pos, targets, n_keys (int32), then seq_off (N+1),
// kv_off, kv_dst (int64), from `base` (NULL: only measure); returns its size in bytes.
static size_t meta_layout(DecoderMeta *b, int64_t N, char *base) {
    size_t off = 0;
#define TAKE(field, count) LAYOUT_TAKE(base, &off, b->field, count)
    TAKE(tokens, N);
    TAKE(pos, N);
    TAKE(targets, N);
    TAKE(n_keys, N);
    TAKE(seq_off, N + 1);
    TAKE(kv_off, N);
    TAKE(kv_dst, N);
#undef TAKE
    return off;
}

// Lays out the workspace from `base` (NULL: only measure); returns its size in bytes.
static size_t acts_layout(DecoderActs *a, const Backend *be, const DecoderConfig *c, DType dtype, int64_t N,
                          int64_t max_keys, char *base) {
    int64_t C = c->hidden, Q = c->heads * c->head_dim, KV = c->kv_heads * c->head_dim, I = c->inter;
    size_t att = be->attention_scratch(be, max_keys, 0), lp = be->logprob_scratch(be, c->vocab, C, dtype), off = 0;
    int64_t in16 = dtype == DTYPE_BF16 ? N * (C > I ? C : I) : 0;
#define TAKE(field, count) LAYOUT_TAKE(base, &off, a->field, count)
    TAKE(x, N * C);
    TAKE(xn, N * C);
    TAKE(in16, in16);
    TAKE(q, N * Q);
    TAKE(k, N * KV);
    TAKE(v, N * KV);
    TAKE(att, N * Q);
    TAKE(proj, N * C);
    TAKE(gate, N * I);
    TAKE(up, N * I);
    TAKE(scratch, att > lp ? att : lp);
    TAKE(rope, N * c->head_dim);
    TAKE(rope_local, c->rope_local.theta > 0 ? N * c->head_dim : 0);
    TAKE(lora_u, N * c->lora_rank);
#undef TAKE
    a->meta_bytes = meta_layout(&a->dev, N, base ? base + off : NULL);
    off += a->meta_bytes;
    if (!in16) a->in16 = NULL;  // F32 weights: none
    // Every layer in place: the o projection's sum in proj, then the MLP's back into x.
    a->view = (DecoderLayerActs){.xin = a->x, .xmid = a->proj, .xout = a->x, .ao = a->proj, .mo = a->x,
                               .xn1 = a->xn, .xn2 = a->xn, .qr = a->q, .kr = a->k, .q = a->q, .k = a->k, .v = a->v,
                               .att = a->att, .gate = a->gate, .up = a->up, .h = a->gate, .rope = a->rope,
                               .rope_local = a->rope_local, .lora_u = a->lora_u, .scratch = a->scratch,
                               .in16 = a->in16};
    return off;
}

size_t decoder_acts_bytes(const Backend *be, const DecoderConfig *c, DType dtype, int64_t max_tokens,
                          int64_t max_keys) {
    DecoderActs a;
    return acts_layout(&a, be, c, dtype, max_tokens, max_keys, NULL);
}

void decoder_acts_init(DecoderActs *a, const Backend *be, const DecoderConfig *c, DType dtype, int64_t max_tokens,
                     int64_t max_keys, Arena *arena) {
    memset(a, 0, sizeof *a);
    a->max_tokens = max_tokens;
    acts_layout(a, be, c, dtype, max_tokens, max_keys,
                arena_alloc(arena, decoder_acts_bytes(be, c, dtype, max_tokens, max_keys)));
    a->host = a->dev;
    if (arena->on_device) {  // the host fills its own copy, uploaded once per forward
        a->host_block = xmalloc(a->meta_bytes);
        meta_layout(&a->host, max_tokens, a->host_block);
    }
}

void decoder_acts_free(DecoderActs *a) {
    free(a->host_block);
    a->host_block = NULL;
}

// The host's metadata to the device (nothing to do on the CPU, where they are the same memory).
static void meta_upload(const Decoder *m, DecoderActs *a) {
    if (a->host_block) m->be->upload(m->be, a->dev.tokens, a->host_block, a->meta_bytes);
}

size_t decoder_kv_bytes_per_token(const DecoderConfig *c) {
    return (size_t)(2 * c->layers * c->kv_heads * c->head_dim) * dtype_size(c->kv_dtype);
}

// The cache's shape, k and v not yet placed.
static DecoderKV kv_shape(const DecoderConfig *c, int n_slots, int64_t max_len) {
    int64_t row = c->kv_heads * c->head_dim;
    return (DecoderKV){.n_slots = n_slots, .max_len = max_len, .row = row, .dtype = c->kv_dtype,
                       .bytes = (size_t)(c->layers * n_slots * max_len * row) * dtype_size(c->kv_dtype)};
}

void decoder_kv_init(DecoderKV *kv, const DecoderConfig *c, int n_slots, int64_t max_len, Arena *arena) {
    *kv = kv_shape(c, n_slots, max_len);
    kv->k = arena_alloc(arena, kv->bytes);
    kv->v = arena_alloc(arena, kv->bytes);
}

void decoder_kv_reserve(DecoderKV *kv, const Backend *be, const DecoderConfig *c, int n_slots, int64_t max_len) {
    *kv = kv_shape(c, n_slots, max_len);
    kv->reserved = 1;
    kv->k = backend_kv_reserve(be, kv->bytes, &kv->on_demand);
    kv->v = backend_kv_reserve(be, kv->bytes, &kv->on_demand);
}

void decoder_kv_free(DecoderKV *kv, const Backend *be) {
    if (!kv->reserved) return;
    backend_kv_free(be, kv->k, kv->bytes);
    backend_kv_free(be, kv->v, kv->bytes);
    kv->k = kv->v = NULL;
}

// Element offset of layer l's slot `slot` (position 0) in the cache.
static int64_t kv_offset(const DecoderKV *kv, int64_t layer, int slot) {
    return ((layer * kv->n_slots + slot) * kv->max_len) * kv->row;
}

// The address of element `at` of k or v.
static void *kv_at(const DecoderKV *kv, void *base, int64_t at) {
    return (char *)base + (size_t)at * dtype_size(kv->dtype);
}

// n elements of k and v (fp32) into the cache from element `at`, in its dtype.
static void kv_store(const Backend *be, const DecoderKV *kv, int64_t at, const float *k, const float *v,
                     int64_t n) {
    if (kv->dtype == DTYPE_F32) {
        be->copy(be, kv_at(kv, kv->k, at), k, (size_t)n * sizeof *k);
        be->copy(be, kv_at(kv, kv->v, at), v, (size_t)n * sizeof *v);
        return;
    }
    be->round_operand(be, kv->dtype, k, kv_at(kv, kv->k, at), n);
    be->round_operand(be, kv->dtype, v, kv_at(kv, kv->v, at), n);
}

void decoder_kv_release(const Decoder *m, DecoderKV *kv, int slot, int64_t from) {
    if (!kv->on_demand || from >= kv->max_len) return;
    size_t bytes = (size_t)((kv->max_len - from) * kv->row) * dtype_size(kv->dtype);
    for (int64_t l = 0; l < m->cfg.layers; l++) {
        backend_kv_release(m->be, kv_at(kv, kv->k, kv_offset(kv, l, slot) + from * kv->row), bytes);
        backend_kv_release(m->be, kv_at(kv, kv->v, kv_offset(kv, l, slot) + from * kv->row), bytes);
    }
}

void decoder_kv_copy(const Decoder *m, DecoderKV *kv, int dst, int src, int64_t n) {
    size_t bytes = (size_t)(n * kv->row) * dtype_size(kv->dtype);
    for (int64_t l = 0; l < m->cfg.layers; l++) {
        m->be->copy(m->be, kv_at(kv, kv->k, kv_offset(kv, l, dst)), kv_at(kv, kv->k, kv_offset(kv, l, src)), bytes);
        m->be->copy(m->be, kv_at(kv, kv->v, kv_offset(kv, l, dst)), kv_at(kv, kv->v, kv_offset(kv, l, src)), bytes);
    }
}

const void *decoder_operand(const Decoder *m, const float *x, int64_t n, void *buf) {
    if (m->dtype == DTYPE_F32) return x;
    m->be->round_operand(m->be, m->dtype, x, buf, n);
    return buf;
}

// out (N, OC) = x (N, C) @ W^T + bias, W the matrix at slab offset w: for decode's few rows from m's int8
// copy when it has one (x quantized), else from the slab (x as its projections read it: xo).
static void project(const Decoder *m, float *out, const float *x, const void *xo, size_t w, const void *bias, int64_t N,
                    int64_t C, int64_t OC) {
    if (m->q8 && N <= SKINNY_MAX_ROWS) q8_matmul(out, x, decoder_q8_at(m->q8, w), bias, m->dtype, N, C, OC, m->q8->xq);
    else m->be->matmul_forward(m->be, out, xo, decoder_at(m, w), bias, m->dtype, N, C, OC);
}

const float *decoder_layer_rope(const DecoderConfig *c, int64_t l, const DecoderLayerActs *a) {
    return c->rope_local.theta > 0 && decoder_layer_slides(c, l) ? a->rope_local : a->rope;
}

// The halves of a transformer block, over N rows of layer l's views: shared by prefill, decode and
// training (which differ in the attention between them and in where the views point).
static void qkv_block(const Decoder *m, int64_t l, int64_t N, const DecoderLayerActs *a) {
    const Backend *be = m->be;
    const DecoderConfig *c = &m->cfg;
    const DecoderLayout *w = &m->w;
    DType dt = m->dtype;
    int64_t C = c->hidden, D = c->head_dim, Q = c->heads * D, KV = c->kv_heads * D;
    float eps = c->eps, off = c->norm_offset;
    be->rmsnorm_forward(be, a->xn1, a->xin, decoder_at(m, w->ln1 + l * C), dt, N, C, eps, off);
    const void *xn = decoder_operand(m, a->xn1, N * C, a->in16);
    project(m, a->qr, a->xn1, xn, w->wq + l * Q * C, decoder_bias(m, w->bq + l * Q), N, C, Q);
    project(m, a->kr, a->xn1, xn, w->wk + l * KV * C, decoder_bias(m, w->bk + l * KV), N, C, KV);
    project(m, a->v, a->xn1, xn, w->wv + l * KV * C, decoder_bias(m, w->bv + l * KV), N, C, KV);
    lora_forward(m->be, m->lora, LORA_Q, l, a->xn1, N, a->qr, a->lora_u);
    lora_forward(m->be, m->lora, LORA_K, l, a->xn1, N, a->kr, a->lora_u);
    lora_forward(m->be, m->lora, LORA_V, l, a->xn1, N, a->v, a->lora_u);
    if (c->qk_norm) {  // each head's query and key: rows of D
        be->rmsnorm_forward(be, a->q, a->qr, decoder_at(m, w->qnorm + l * D), dt, N * c->heads, D, eps, off);
        be->rmsnorm_forward(be, a->k, a->kr, decoder_at(m, w->knorm + l * D), dt, N * c->kv_heads, D, eps, off);
    }
    const float *rope = decoder_layer_rope(c, l, a);
    be->rope_forward(be, a->q, rope, N, (int)c->heads, (int)D);
    be->rope_forward(be, a->k, rope, N, (int)c->kv_heads, (int)D);
}

// a->att (attention output) -> o_proj (its post-norm) + residual into xmid, then the MLP (its post-norm) +
// residual into xout.
static void out_mlp_block(const Decoder *m, int64_t l, int64_t N, const DecoderLayerActs *a) {
    const Backend *be = m->be;
    const DecoderConfig *c = &m->cfg;
    const DecoderLayout *w = &m->w;
    DType dt = m->dtype;
    int64_t C = c->hidden, I = c->inter, Q = c->heads * c->head_dim;
    float eps = c->eps, off = c->norm_offset;
    const void *att = decoder_operand(m, a->att, N * Q, a->in16);
    project(m, a->ao, a->att, att, w->wo + l * C * Q, NULL, N, Q, C);
    lora_forward(m->be, m->lora, LORA_O, l, a->att, N, a->ao, a->lora_u);
    if (c->post_norms)
        be->rmsnorm_forward(be, a->xmid, a->ao, decoder_at(m, w->post_attn_norm + l * C), dt, N, C, eps, off);
    be->residual_forward(be, a->xmid, a->xin, N * C);
    be->rmsnorm_forward(be, a->xn2, a->xmid, decoder_at(m, w->ln2 + l * C), dt, N, C, eps, off);
    const void *xn = decoder_operand(m, a->xn2, N * C, a->in16);
    project(m, a->gate, a->xn2, xn, w->wgate + l * I * C, NULL, N, C, I);
    project(m, a->up, a->xn2, xn, w->wup + l * I * C, NULL, N, C, I);
    lora_forward(m->be, m->lora, LORA_GATE, l, a->xn2, N, a->gate, a->lora_u);
    lora_forward(m->be, m->lora, LORA_UP, l, a->xn2, N, a->up, a->lora_u);
    be->glu_forward(be, a->h, a->gate, a->up, N * I, c->act);
    const void *h = decoder_operand(m, a->h, N * I, a->in16);
    project(m, a->mo, a->h, h, w->wdown + l * C * I, NULL, N, I, C);
    lora_forward(m->be, m->lora, LORA_DOWN, l, a->h, N, a->mo, a->lora_u);
    if (c->post_norms)
        be->rmsnorm_forward(be, a->xout, a->mo, decoder_at(m, w->post_mlp_norm + l * C), dt, N, C, eps, off);
    be->residual_forward(be, a->xout, a->xmid, N * C);
}

int decoder_layer_slides(const DecoderConfig *c, int64_t l) {
    return c->sliding_window > 0 && (c->sliding_pattern == 0 || (l + 1) % c->sliding_pattern != 0);
}

AttnShape decoder_attn(const DecoderConfig *c, int64_t l) {
    AttnShape a = attn_shape((int)c->heads, (int)c->kv_heads, (int)c->head_dim,
                             decoder_layer_slides(c, l) ? c->sliding_window : 0);
    if (c->query_scalar > 0) a.scale = (float)(1.0 / sqrt(c->query_scalar));
    return a;
}

float decoder_embed_scale(const DecoderConfig *c, DType dtype) {
    float s = c->embed_scaled ? (float)sqrt((double)c->hidden) : 1.0f;
    return dtype == DTYPE_BF16 ? bf16_to_f32(f32_to_bf16(s)) : s;
}

// Whole-batch steps of every forward: the rows' RoPE tables (pos: in the backend's memory) and embeddings (x:
// times Gemma's scale).
static void rope_tables(const Decoder *m, const int32_t *pos, int64_t N, float *rope, float *rope_local) {
    const DecoderConfig *c = &m->cfg;
    m->be->rope_table(m->be, rope, pos, N, (int)c->head_dim, c->rope);
    if (c->rope_local.theta > 0) m->be->rope_table(m->be, rope_local, pos, N, (int)c->head_dim, c->rope_local);
}

static void embed(const Decoder *m, float *x, const int32_t *tokens, int64_t N) {
    const DecoderConfig *c = &m->cfg;
    m->be->embedding_forward(m->be, x, tokens, decoder_at(m, m->w.embed), m->dtype, N, c->hidden);
    if (c->embed_scaled) m->be->scale(m->be, x, (size_t)(N * c->hidden), decoder_embed_scale(c, m->dtype));
}

static void check_workspace(const Decoder *m, const DecoderActs *a, int64_t N, const char *what) {
    if (N > a->max_tokens)
        die("internal: %s of %lld rows, workspace holds %lld", what, (long long)N, (long long)a->max_tokens);
    if (m->dtype != DTYPE_F32 && !a->in16) die("internal: a %s model in an F32 workspace", dtype_name(m->dtype));
}

void decoder_layer_forward(const Decoder *m, int64_t l, const DecoderBatch *b, const DecoderLayerActs *a, DecoderKV *kv,
                         const int32_t *slots) {
    const Backend *be = m->be;
    const DecoderConfig *c = &m->cfg;
    int64_t KV = c->kv_heads * c->head_dim;
    qkv_block(m, l, b->N, a);
    for (int s = 0; kv && s < b->B; s++) {  // the prompt's keys and values start its cache slot
        int64_t lo = b->host_seq_off[s], n = (b->host_seq_off[s + 1] - lo) * KV;
        kv_store(be, kv, kv_offset(kv, l, slots[s]), a->k + lo * KV, a->v + lo * KV, n);
    }
    be->attention_forward(be, a->att, a->lse, a->q, a->k, a->v, b->seq_off, b->B, b->N, decoder_attn(c, l),
                          a->scratch);
    out_mlp_block(m, l, b->N, a);
}

void decoder_forward_layers(const Decoder *m, const DecoderBatch *b, const DecoderLayerActs *views, int64_t n_views,
                          float *out, DecoderKV *kv, const int32_t *slots) {
    const Backend *be = m->be;
    const DecoderConfig *c = &m->cfg;
    const DecoderVlInputs *vl = b->vl;
    if (vl && vl->N != b->N) die("internal: image inputs of %lld rows for %lld", (long long)vl->N, (long long)b->N);
    if (vl)
        be->upload(be, views[0].rope, vl->rope, (size_t)(b->N * c->head_dim) * sizeof(float));
    else
        rope_tables(m, b->pos, b->N, views[0].rope, views[0].rope_local);
    embed(m, views[0].xin, b->tokens, b->N);
    for (int64_t i = 0; vl && i < vl->n_image_rows; i++)  // image features in place of the pads' embeddings
        be->upload(be, views[0].xin + vl->image_rows[i] * c->hidden, vl->image_feats[i],
                   (size_t)c->hidden * sizeof(float));
    for (int64_t l = 0; l < c->layers; l++) decoder_layer_forward(m, l, b, &views[n_views == 1 ? 0 : l], kv, slots);
    const float *last = views[n_views == 1 ? 0 : c->layers - 1].xout;
    be->rmsnorm_forward(be, out, last, decoder_at(m, m->w.norm), m->dtype, b->N, c->hidden, c->eps, c->norm_offset);
}

// The forward over the batch batch_fill put in a->host: positions, the upload, then every layer (vl: image
// inputs, or NULL).
static void forward(const Decoder *m, int B, DecoderActs *a, DecoderKV *kv, const int32_t *slots,
                    const DecoderVlInputs *vl) {
    const DecoderMeta *h = &a->host;
    int64_t N = h->seq_off[B];
    for (int b = 0; b < B; b++)
        for (int64_t i = h->seq_off[b]; i < h->seq_off[b + 1]; i++) h->pos[i] = (int32_t)(i - h->seq_off[b]);
    meta_upload(m, a);
    DecoderBatch batch = {.B = B, .N = N, .tokens = a->dev.tokens, .pos = a->dev.pos, .seq_off = a->dev.seq_off,
                        .host_seq_off = h->seq_off};
    batch.vl = vl;
    decoder_forward_layers(m, &batch, &a->view, 1, a->xn, kv, slots);
}

// The batch's tokens and sequence offsets into a's host metadata.
static void batch_fill(const Decoder *m, DecoderActs *a, const int32_t *tokens, const int64_t *seq_off, int B) {
    int64_t N = seq_off[B];
    check_workspace(m, a, N, "forward");
    memcpy(a->host.tokens, tokens, (size_t)N * sizeof *tokens);
    memcpy(a->host.seq_off, seq_off, (size_t)(B + 1) * sizeof *seq_off);
}

void decoder_forward(const Decoder *m, const int32_t *tokens, const int64_t *seq_off, int B, DecoderActs *a,
                     DecoderKV *kv, const int32_t *slots) {
    batch_fill(m, a, tokens, seq_off, B);
    forward(m, B, a, kv, slots, NULL);
}

void decoder_forward_vl(const Decoder *m, const int32_t *tokens, const int64_t *seq_off, int B, DecoderActs *a,
                      DecoderKV *kv, const int32_t *slots, const DecoderVlInputs *vl) {
    batch_fill(m, a, tokens, seq_off, B);
    forward(m, B, a, kv, slots, vl);
}

// Each row's log-prob of the next token of its sequence into out (host), over the forward with image inputs vl
// (or NULL).
static void logprobs(const Decoder *m, const int32_t *tokens, const int64_t *seq_off, int B, DecoderActs *a,
                     const DecoderVlInputs *vl, float *out) {
    const Backend *be = m->be;
    int64_t N = seq_off[B];
    batch_fill(m, a, tokens, seq_off, B);
    for (int b = 0; b < B; b++)
        for (int64_t i = seq_off[b]; i < seq_off[b + 1]; i++)
            a->host.targets[i] = i + 1 < seq_off[b + 1] ? tokens[i + 1] : -1;
    forward(m, B, a, NULL, NULL, vl);
    // The log-probs land in a->proj (free by now), then come to the host.
    be->logprob_forward(be, a->proj, NULL, a->xn, decoder_at(m, m->w.lm_head), m->dtype, a->dev.targets, N,
                        m->cfg.hidden,
                        m->cfg.vocab, a->scratch);
    be->download(be, out, a->proj, (size_t)N * sizeof *out);
}

void decoder_logprobs(const Decoder *m, const int32_t *tokens, const int64_t *seq_off, int B, DecoderActs *a,
                      float *out) {
    logprobs(m, tokens, seq_off, B, a, NULL, out);
}


void decoder_logprobs_vl(const Decoder *m, const int32_t *tokens, const int64_t *seq_off, int B, DecoderActs *a,
                       const DecoderVlInputs *vl, float *out) {
    logprobs(m, tokens, seq_off, B, a, vl, out);
}

void decoder_decode_step(const Decoder *m, DecoderKV *kv, const int32_t *tokens, const int32_t *slots,
                         const int32_t *pos, int B, DecoderActs *a, float *logits) {
    decoder_decode_step_at(m, kv, tokens, slots, pos, pos, B, a, logits);
}

void decoder_decode_step_at(const Decoder *m, DecoderKV *kv, const int32_t *tokens, const int32_t *slots,
                          const int32_t *pos, const int32_t *rope_pos, int B, DecoderActs *a, float *logits) {
    decoder_extend(m, kv, tokens, slots, pos, rope_pos, B, a);
    decoder_logits(m, a->xn, B, a, logits);
}

void decoder_extend(const Decoder *m, DecoderKV *kv, const int32_t *tokens, const int32_t *slots, const int32_t *pos,
                    const int32_t *rope_pos, int64_t N, DecoderActs *a) {
    const Backend *be = m->be;
    const DecoderConfig *c = &m->cfg;
    int64_t KV = c->kv_heads * c->head_dim;
    check_workspace(m, a, N, "extend batch");
    DecoderMeta *h = &a->host;
    memcpy(h->tokens, tokens, (size_t)N * sizeof *tokens);
    memcpy(h->pos, rope_pos, (size_t)N * sizeof *pos);  // the rotation's; the cache offsets below use pos
    for (int64_t b = 0; b < N; b++) {  // offsets within a layer's cache: the slot, and the new position in it
        h->n_keys[b] = pos[b] + 1;
        h->kv_off[b] = kv_offset(kv, 0, slots[b]);
        h->kv_dst[b] = h->kv_off[b] + pos[b] * KV;
    }
    meta_upload(m, a);
    rope_tables(m, a->dev.pos, N, a->rope, a->rope_local);
    embed(m, a->x, a->dev.tokens, N);
    for (int64_t l = 0; l < c->layers; l++) {
        qkv_block(m, l, N, &a->view);
        void *k0 = kv_at(kv, kv->k, kv_offset(kv, l, 0)), *v0 = kv_at(kv, kv->v, kv_offset(kv, l, 0));
        // append every row's key/value, then each row attends over its slot up to its own position
        be->kv_append(be, k0, v0, kv->dtype, a->k, a->v, a->dev.kv_dst, (int)N, KV);
        be->attention_decode_forward(be, a->att, a->q, k0, v0, kv->dtype, a->dev.kv_off, a->dev.n_keys, (int)N,
                                     decoder_attn(c, l), a->scratch);
        out_mlp_block(m, l, N, &a->view);
    }
    be->rmsnorm_forward(be, a->xn, a->x, decoder_at(m, m->w.norm), m->dtype, N, c->hidden, c->eps, c->norm_offset);
}

void decoder_logits(const Decoder *m, const float *h, int64_t B, DecoderActs *a, float *logits) {
    const DecoderConfig *c = &m->cfg;
    const void *x = decoder_operand(m, h, B * c->hidden, a->in16);
    project(m, logits, h, x, m->w.lm_head, NULL, B, c->hidden, c->score_labels ? c->score_labels : c->vocab);
}

void decoder_seq_scores(const Decoder *m, const int32_t *tokens, const int64_t *seq_off, int B, DecoderActs *a,
                        float *out) {
    const Backend *be = m->be;
    const DecoderConfig *c = &m->cfg;
    if (!c->score_labels) die("internal: decoder_seq_scores on a model without a score head");
    decoder_forward(m, tokens, seq_off, B, a, NULL, NULL);
    // each sequence's last row (verl's: the last attended token), through kv_dst, which only decode reads
    for (int b = 0; b < B; b++) a->host.kv_dst[b] = seq_off[b + 1] - 1;
    if (a->dev.kv_dst != a->host.kv_dst)
        be->upload(be, a->dev.kv_dst, a->host.kv_dst, (size_t)B * sizeof *a->host.kv_dst);
    be->gather_rows(be, a->proj, a->xn, a->dev.kv_dst, B, c->hidden, 1.0f);
    decoder_logits(m, a->proj, B, a, a->q);
    be->download(be, out, a->q, (size_t)B * (size_t)c->score_labels * sizeof *out);
}

