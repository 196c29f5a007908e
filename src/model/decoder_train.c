// Training: decoder.c's forward over per-layer activation views that the backward reads, the
// log-prob head over the rows that have targets, and the backward into a gradient slab.
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "model/lora.h"
#include "model/decoder.h"
#include "nn/ops.h"

// Lays out the training workspace from `base` (NULL: only measure); returns its size in bytes.
static size_t train_layout(DecoderTrain *t, const Backend *be, const DecoderConfig *c, DType dtype, int64_t N,
                           int64_t max_seq, int recompute, char *base) {
    int64_t C = c->hidden, Q = c->heads * c->head_dim, KV = c->kv_heads * c->head_dim, I = c->inter;
    int64_t Lk = recompute ? 1 : c->layers;  // layers whose activations are kept
    size_t att = be->attention_scratch(be, max_seq, 1), lp = be->logprob_scratch(be, c->vocab, C, dtype), off = 0;
    int64_t in16 = dtype == DTYPE_BF16 ? N * (C > I ? C : I) : 0;
#define TAKE(field, count) LAYOUT_TAKE(base, &off, t->field, count)
    TAKE(tokens, N);
    TAKE(pos, N);
    TAKE(rope, N * c->head_dim);
    TAKE(rope_local, c->rope_local.theta > 0 ? N * c->head_dim : 0);
    TAKE(seq_off, N + 1);
    TAKE(sel, N);
    TAKE(sel_target, N);
    TAKE(xin, (c->layers + 1) * N * C);
    TAKE(xn1, Lk * N * C);
    TAKE(q, Lk * N * Q);
    TAKE(k, Lk * N * KV);
    TAKE(v, Lk * N * KV);
    TAKE(att, Lk * N * Q);
    TAKE(qr, c->qk_norm ? Lk * N * Q : 0);
    TAKE(kr, c->qk_norm ? Lk * N * KV : 0);
    TAKE(dqr, c->qk_norm ? N * Q : 0);
    TAKE(dkr, c->qk_norm ? N * KV : 0);
    TAKE(ao, c->post_norms ? Lk * N * C : 0);
    TAKE(mo, c->post_norms ? Lk * N * C : 0);
    TAKE(dpost, c->post_norms ? N * C : 0);
    TAKE(lse, Lk * N * c->heads);
    TAKE(xmid, Lk * N * C);
    TAKE(xn2, Lk * N * C);
    TAKE(gate, Lk * N * I);
    TAKE(up, Lk * N * I);
    TAKE(xf, N * C);
    TAKE(hsel, N * C);
    TAKE(h, N * I);
    TAKE(dx, N * C);
    TAKE(dxn, N * C);
    TAKE(dq, N * Q);
    TAKE(dk, N * KV);
    TAKE(dv, N * KV);
    TAKE(datt, N * Q);
    TAKE(dgate, N * I);
    TAKE(dup, N * I);
    TAKE(dsel, N * C);
    TAKE(scratch, att > lp ? att : lp);
    TAKE(in16, in16);
    TAKE(dout16, in16);
    TAKE(lora_u, N * c->lora_rank);
    TAKE(lora_du, N * c->lora_rank);
#undef TAKE
    if (!in16) t->in16 = t->dout16 = NULL;  // F32 weights: none
    return off;
}

size_t decoder_train_bytes(const Backend *be, const DecoderConfig *c, DType dtype, int64_t max_tokens, int64_t max_seq,
                         int recompute) {
    DecoderTrain t;
    return train_layout(&t, be, c, dtype, max_tokens, max_seq, recompute, NULL);
}

// Layer l's views: one set per layer, or the single set that recompute rebuilds layer by layer; the
// residual stream (xin) is kept for every layer either way.
static DecoderLayerActs layer_view(const DecoderConfig *c, const DecoderTrain *t, int64_t l) {
    int64_t M = t->max_tokens, C = c->hidden, Q = c->heads * c->head_dim, KV = c->kv_heads * c->head_dim;
    int64_t I = c->inter, s = t->recompute ? 0 : l;
    float *q = t->q + s * M * Q, *k = t->k + s * M * KV;
    float *xmid = t->xmid + s * M * C, *xout = t->xin + (l + 1) * M * C;
    return (DecoderLayerActs){
        .xin = t->xin + l * M * C, .xout = xout, .xmid = xmid,
        .ao = c->post_norms ? t->ao + s * M * C : xmid, .mo = c->post_norms ? t->mo + s * M * C : xout,
        .xn1 = t->xn1 + s * M * C, .xn2 = t->xn2 + s * M * C,
        .qr = c->qk_norm ? t->qr + s * M * Q : q, .kr = c->qk_norm ? t->kr + s * M * KV : k, .q = q, .k = k,
        .v = t->v + s * M * KV, .att = t->att + s * M * Q, .lse = t->lse + s * M * c->heads,
        .gate = t->gate + s * M * I, .up = t->up + s * M * I, .h = t->h,
        .rope = t->rope, .rope_local = t->rope_local, .lora_u = t->lora_u, .scratch = t->scratch, .in16 = t->in16,
    };
}

void decoder_train_init(DecoderTrain *t, const Backend *be, const DecoderConfig *c, DType dtype, int64_t max_tokens,
                      int64_t max_seq, int recompute, Arena *arena) {
    memset(t, 0, sizeof *t);
    t->max_tokens = max_tokens;
    t->max_seq = max_seq;
    t->recompute = recompute;
    t->logit_scale = 1.0f;
    train_layout(t, be, c, dtype, max_tokens, max_seq, recompute,
                 arena_alloc(arena, decoder_train_bytes(be, c, dtype, max_tokens, max_seq, recompute)));
    t->views = xmalloc((size_t)c->layers * sizeof *t->views);
    for (int64_t l = 0; l < c->layers; l++) t->views[l] = layer_view(c, t, l);
    t->host_pos = xmalloc((size_t)max_tokens * sizeof *t->host_pos);
    t->host_sel_target = xmalloc((size_t)max_tokens * sizeof *t->host_sel_target);
    t->host_sel = xmalloc((size_t)max_tokens * sizeof *t->host_sel);
}

void decoder_train_free(DecoderTrain *t) {
    free(t->views);
    free(t->host_pos);
    free(t->host_sel_target);
    free(t->host_sel);
    t->views = NULL;
    t->host_pos = t->host_sel_target = NULL;
    t->host_sel = NULL;
}

// Everything up to the logprob head: the layers, the final norm, and the rows that have targets.
static void forward_body(const Decoder *m, const int32_t *tokens, const int32_t *targets, const int64_t *seq_off, int B,
                         DecoderTrain *t) {
    const DecoderConfig *c = &m->cfg;
    int64_t N = seq_off[B], C = c->hidden;
    if (N > t->max_tokens) die("internal: training forward over %lld tokens, workspace holds %lld", (long long)N,
                               (long long)t->max_tokens);
    if (m->dtype != DTYPE_F32 && !t->in16) die("internal: a %s model in an F32 workspace", dtype_name(m->dtype));
    t->N = N;
    t->B = B;
    t->head_done = 0;
    // The batch's metadata is made on the host (host_meta) and uploaded to the workspace.
    int32_t *pos = t->host_pos, *sel_target = t->host_sel_target;
    int64_t *sel = t->host_sel;
    t->n_sel = 0;
    for (int b = 0; b < B; b++) {
        if (seq_off[b + 1] - seq_off[b] > t->max_seq)
            die("internal: sequence of %lld tokens, workspace sized for %lld", (long long)(seq_off[b + 1] - seq_off[b]),
                (long long)t->max_seq);
        for (int64_t i = seq_off[b]; i < seq_off[b + 1]; i++) {
            pos[i] = (int32_t)(i - seq_off[b]);
            if (targets[i] >= 0) {
                sel[t->n_sel] = i;
                sel_target[t->n_sel++] = targets[i];
            }
        }
    }
    const Backend *be = m->be;
    be->upload(be, t->tokens, tokens, (size_t)N * sizeof *tokens);
    be->upload(be, t->seq_off, seq_off, (size_t)(B + 1) * sizeof *seq_off);
    be->upload(be, t->pos, pos, (size_t)N * sizeof *pos);
    be->upload(be, t->sel, sel, (size_t)t->n_sel * sizeof *sel);
    be->upload(be, t->sel_target, sel_target, (size_t)t->n_sel * sizeof *sel_target);

    t->batch = (DecoderBatch){.B = B, .N = N, .tokens = t->tokens, .pos = t->pos, .seq_off = t->seq_off,
                            .host_seq_off = NULL};  // no KV cache in training
    t->batch.vl = t->vl;
    decoder_forward_layers(m, &t->batch, t->views, c->layers, t->xf, NULL, NULL);
    // logits * s = (h * s) W^T: the temperature folds into the head's input rows.
    m->be->gather_rows(m->be, t->hsel, t->xf, t->sel, t->n_sel, C, t->logit_scale);
}

// The head's outputs come in the compact order of sel; spread them back over the rows (0 elsewhere).
static void scatter_logp(const Decoder *m, const DecoderTrain *t, const float *lp, float *logp) {
    m->be->zero(m->be, logp, (size_t)t->N * sizeof *logp);
    m->be->scatter_rows(m->be, logp, lp, t->sel, t->n_sel, 1, 1.0f);
}

void decoder_train_forward(const Decoder *m, const int32_t *tokens, const int32_t *targets, const int64_t *seq_off,
                         int B, DecoderTrain *t, float *logp, float *entropy) {
    forward_body(m, tokens, targets, seq_off, B, t);
    float *lp = t->h, *ent = entropy ? t->dup : NULL;  // backward scratch, free until backward runs
    m->be->logprob_forward(m->be, lp, ent, t->hsel, decoder_at(m, m->w.lm_head), m->dtype, t->sel_target, t->n_sel,
                           m->cfg.hidden, m->cfg.vocab, t->scratch);
    scatter_logp(m, t, lp, logp);
    if (entropy) scatter_logp(m, t, ent, entropy);
}

// The base's gradient at slab offset `off`, or NULL when the base is frozen (adapters attached: grads
// then holds the adapters' gradients).
static float *base_grad(const Decoder *m, float *grads, size_t off) { return m->lora ? NULL : grads + off; }

// The head's backward: dlogp, dent (N) in row order -> t->dsel (n_sel, C) and the LM head's gradient
// in grads. With lp (n_sel) it also writes the head's forward output.
static void head_backward(const Decoder *m, float *grads, const float *dlogp, const float *dent, DecoderTrain *t,
                          float *lp) {
    const Backend *be = m->be;
    float *dlp = t->dgate, *de = dent ? t->dup : NULL;  // free until the last layer's backward
    be->gather_rows(be, dlp, dlogp, t->sel, t->n_sel, 1, 1.0f);
    if (de) be->gather_rows(be, de, dent, t->sel, t->n_sel, 1, 1.0f);
    be->zero(be, t->dsel, (size_t)(t->n_sel * m->cfg.hidden) * sizeof *t->dsel);
    be->logprob_backward(be, t->dsel, base_grad(m, grads, m->w.lm_head), lp, dlp, de, t->hsel,
                         decoder_at(m, m->w.lm_head), m->dtype, t->sel_target, t->n_sel, m->cfg.hidden, m->cfg.vocab,
                         t->scratch);
}

void decoder_train_forward_fused(const Decoder *m, float *grads, const int32_t *tokens, const int32_t *targets,
                               const int64_t *seq_off, int B, const float *dlogp, DecoderTrain *t, float *logp) {
    forward_body(m, tokens, targets, seq_off, B, t);
    float *lp = t->h;
    head_backward(m, grads, dlogp, NULL, t, lp);
    scatter_logp(m, t, lp, logp);
    t->head_done = 1;
}

// The backward of one projection: dout (N, OC) fp32 is rounded to m's dtype here; in (N, C) is its input
// as the forward multiplied it (decoder_operand). dinp (N, C) +=, the weight's and bias's gradients in grads +=.
static void proj_backward(const Decoder *m, float *grads, DecoderTrain *t, float *dinp, size_t wo, size_t bo,
                          int has_bias, const float *dout, const void *in, int64_t C, int64_t OC) {
    int64_t N = t->N;
    const void *d = decoder_operand(m, dout, N * OC, t->dout16);
    float *db = has_bias ? base_grad(m, grads, bo) : NULL;
    m->be->matmul_backward(m->be, dinp, base_grad(m, grads, wo), db, d, in, decoder_at(m, wo), m->dtype, N, C, OC);
}

// Zeroes n floats of backend memory (a gradient buffer the next op adds into).
static void zero_floats(const Decoder *m, float *p, int64_t n) { m->be->zero(m->be, p, (size_t)n * sizeof *p); }

// The backward of a post-norm (Gemma's, weight at slab offset w, input in): d(loss)/d(in) from t->dx (the norm's
// output adds to the residual stream, whose gradient t->dx is) into t->dpost, which it returns; without
// post_norms, t->dx itself.
static float *post_norm_backward(const Decoder *m, float *grads, DecoderTrain *t, size_t w, const float *in) {
    const DecoderConfig *c = &m->cfg;
    if (!c->post_norms) return t->dx;
    zero_floats(m, t->dpost, t->N * c->hidden);
    m->be->rmsnorm_backward(m->be, t->dpost, base_grad(m, grads, w), t->dx, in, decoder_at(m, w), m->dtype, t->N,
                            c->hidden, c->eps, c->norm_offset);
    return t->dpost;
}

// t->dx holds d(loss)/d(layer l's output); leaves d(loss)/d(its input) there.
static void layer_backward(const Decoder *m, float *grads, int64_t l, DecoderTrain *t) {
    const Backend *be = m->be;
    const DecoderConfig *c = &m->cfg;
    const DecoderLayout *w = &m->w;
    DType dt = m->dtype;
    int64_t N = t->N, C = c->hidden, D = c->head_dim, Q = c->heads * D, KV = c->kv_heads * D, I = c->inter;
    int H = (int)c->heads, KVH = (int)c->kv_heads;
    float eps = c->eps, off = c->norm_offset;
    const DecoderLayerActs *a = &t->views[l];
    if (t->recompute) decoder_layer_forward(m, l, &t->batch, a, NULL, NULL);
    // MLP: x_out = xmid + [post-norm](down(act(gate) * up))
    float *dmo = post_norm_backward(m, grads, t, w->post_mlp_norm + l * C, a->mo);
    be->glu_forward(be, t->h, a->gate, a->up, N * I, c->act);
    zero_floats(m, t->dgate, N * I);
    const void *h = decoder_operand(m, t->h, N * I, t->in16);
    proj_backward(m, grads, t, t->dgate, w->wdown + l * C * I, 0, 0, dmo, h, I, C);
    lora_backward(be, m->lora, grads, LORA_DOWN, l, t->h, dmo, N, t->dgate, t->lora_u, t->lora_du);
    be->glu_backward(be, t->dgate, t->dup, t->dgate, a->gate, a->up, N * I, c->act);
    zero_floats(m, t->dxn, N * C);
    const void *x = decoder_operand(m, a->xn2, N * C, t->in16);  // gate and up share their input
    proj_backward(m, grads, t, t->dxn, w->wgate + l * I * C, 0, 0, t->dgate, x, C, I);
    proj_backward(m, grads, t, t->dxn, w->wup + l * I * C, 0, 0, t->dup, x, C, I);
    lora_backward(be, m->lora, grads, LORA_GATE, l, a->xn2, t->dgate, N, t->dxn, t->lora_u, t->lora_du);
    lora_backward(be, m->lora, grads, LORA_UP, l, a->xn2, t->dup, N, t->dxn, t->lora_u, t->lora_du);
    be->rmsnorm_backward(be, t->dx, base_grad(m, grads, w->ln2 + l * C), t->dxn, a->xmid,
                         decoder_at(m, w->ln2 + l * C), dt, N, C, eps, off);
    // Attention: xmid = xin + [post-norm](o_proj(att))
    float *dao = post_norm_backward(m, grads, t, w->post_attn_norm + l * C, a->ao);
    zero_floats(m, t->datt, N * Q);
    const void *att = decoder_operand(m, a->att, N * Q, t->in16);
    proj_backward(m, grads, t, t->datt, w->wo + l * C * Q, 0, 0, dao, att, Q, C);
    lora_backward(be, m->lora, grads, LORA_O, l, a->att, dao, N, t->datt, t->lora_u, t->lora_du);
    be->attention_backward(be, t->dq, t->dk, t->dv, t->datt, a->att, a->lse, a->q, a->k, a->v, t->seq_off, t->B, N,
                           decoder_attn(c, l), t->scratch);
    const float *rope = decoder_layer_rope(c, l, a);
    be->rope_backward(be, t->dq, rope, N, H, (int)D);
    be->rope_backward(be, t->dk, rope, N, KVH, (int)D);
    float *dq = t->dq, *dk = t->dk;  // d(loss)/d(the projections' outputs)
    if (c->qk_norm) {
        zero_floats(m, t->dqr, N * Q);
        zero_floats(m, t->dkr, N * KV);
        be->rmsnorm_backward(be, t->dqr, base_grad(m, grads, w->qnorm + l * D), t->dq, a->qr,
                             decoder_at(m, w->qnorm + l * D), dt, N * H, D, eps, off);
        be->rmsnorm_backward(be, t->dkr, base_grad(m, grads, w->knorm + l * D), t->dk, a->kr,
                             decoder_at(m, w->knorm + l * D), dt, N * KVH, D, eps, off);
        dq = t->dqr;
        dk = t->dkr;
    }
    zero_floats(m, t->dxn, N * C);
    x = decoder_operand(m, a->xn1, N * C, t->in16);  // q, k and v share theirs
    int bias = c->attn_bias;
    proj_backward(m, grads, t, t->dxn, w->wq + l * Q * C, w->bq + l * Q, bias, dq, x, C, Q);
    proj_backward(m, grads, t, t->dxn, w->wk + l * KV * C, w->bk + l * KV, bias, dk, x, C, KV);
    proj_backward(m, grads, t, t->dxn, w->wv + l * KV * C, w->bv + l * KV, bias, t->dv, x, C, KV);
    lora_backward(be, m->lora, grads, LORA_Q, l, a->xn1, dq, N, t->dxn, t->lora_u, t->lora_du);
    lora_backward(be, m->lora, grads, LORA_K, l, a->xn1, dk, N, t->dxn, t->lora_u, t->lora_du);
    lora_backward(be, m->lora, grads, LORA_V, l, a->xn1, t->dv, N, t->dxn, t->lora_u, t->lora_du);
    be->rmsnorm_backward(be, t->dx, base_grad(m, grads, w->ln1 + l * C), t->dxn, a->xin,
                         decoder_at(m, w->ln1 + l * C), dt, N, C, eps, off);
}

void decoder_backward(const Decoder *m, float *grads, const float *dlogp, const float *dent, DecoderTrain *t) {
    const Backend *be = m->be;
    const DecoderConfig *c = &m->cfg;
    int64_t N = t->N, C = c->hidden;
    if (!t->head_done) head_backward(m, grads, dlogp, dent, t, NULL);
    t->head_done = 0;
    // The head's rows back to their places (the others get no gradient), the temperature folded in.
    zero_floats(m, t->dxn, N * C);
    be->scatter_rows(be, t->dxn, t->dsel, t->sel, t->n_sel, C, t->logit_scale);
    zero_floats(m, t->dx, N * C);
    be->rmsnorm_backward(be, t->dx, base_grad(m, grads, m->w.norm), t->dxn, t->views[c->layers - 1].xout,
                         decoder_at(m, m->w.norm), m->dtype, N, C, c->eps, c->norm_offset);
    for (int64_t l = c->layers - 1; l >= 0; l--) layer_backward(m, grads, l, t);
    // image rows were features, not embeddings: the table gets nothing from them, a trained merger their rows
    float *row = t->vl && t->vl->image_grads ? xmalloc((size_t)C * sizeof *row) : NULL;
    for (int64_t i = 0; t->vl && i < t->vl->n_image_rows; i++) {
        float *dx = t->dx + t->vl->image_rows[i] * C;
        if (row) {
            be->download(be, row, dx, (size_t)C * sizeof *row);
            for (int64_t j = 0; j < C; j++) t->vl->image_grads[i][j] += row[j];
        }
        be->zero(be, dx, (size_t)C * sizeof(float));
    }
    free(row);
    if (m->lora) return;  // the table is frozen
    if (c->embed_scaled) be->scale(be, t->dx, (size_t)(N * C), decoder_embed_scale(c, m->dtype));
    be->embedding_backward(be, grads + m->w.embed, t->dx, t->tokens, N, C);
}
