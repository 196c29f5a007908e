// The update: its workspace (where the rollout's KV cache was), log-probs of the kept samples, and the
// epochs x mini-batches x micro-batches of the clipped-ratio loss, clip and AdamW.
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "base/json.h"
#include "base/util.h"
#include "model/lora.h"
#include "text/utf8.h"
#include "train/checkpoint.h"
#include "train/grpo/step.h"

// The update workspace serves the policy's compute copy and the reference: sized for 16-bit weights
// when either is stored in 16 bits (a bf16-sized workspace serves fp32 weights too).
static DType update_ws_dtype(const GrpoSettings *s) {
    if (grpo_has_lora(s)) return s->lora.base_dtype;  // the one set of weights: the base (adapters are fp32)
    int bf16 = compute_storage(s->precision) == DTYPE_BF16 || compute_storage(s->ref_dtype) == DTYPE_BF16;
    return bf16 ? DTYPE_BF16 : DTYPE_F32;
}

// Per row of the micro-batch: the backend's rows, drows, ent_rows, dent_rows, resp (floats) and resp_idx (int64),
// and the host's tokens, targets (int32) and resp_rows (int64).
#define WS_DEVICE_ROW (5 * sizeof(float) + sizeof(int64_t))
#define WS_HOST_ROW (2 * sizeof(int32_t) + sizeof(int64_t))

size_t grpo_update_ws_bytes(const GrpoSettings *s, const DecoderConfig *c, const Backend *be, int64_t micro,
                            int64_t max_seq) {
    int64_t rows = micro * max_seq;
    size_t act = decoder_train_bytes(be, c, update_ws_dtype(s), rows, max_seq, s->recompute);
    return act + (size_t)rows * (WS_DEVICE_ROW + WS_HOST_ROW) + (size_t)(micro + 1) * sizeof(int64_t) + 8 * 64;
}

void grpo_update_ws_init(UpdateWs *u, const GrpoSettings *s, const DecoderConfig *c, const Backend *be, Arena *a) {
    int64_t micro = s->micro_batch_size, max_seq = max_seq_len(s), rows = micro * max_seq;
    arena_reset(a);
    decoder_train_init(&u->act, be, c, update_ws_dtype(s), rows, max_seq, s->recompute, a);
    u->act.logit_scale = s->sampler.temperature > 0 ? 1.0f / s->sampler.temperature : 1.0f;  // verl: logits / T
    u->rows = arena_alloc(a, (size_t)rows * 4), u->drows = arena_alloc(a, (size_t)rows * 4);
    u->ent_rows = arena_alloc(a, (size_t)rows * 4), u->dent_rows = arena_alloc(a, (size_t)rows * 4);
    u->resp = arena_alloc(a, (size_t)rows * 4);
    u->resp_idx = arena_alloc(a, (size_t)rows * 8);
    u->tokens = xmalloc((size_t)rows * 4), u->targets = xmalloc((size_t)rows * 4);
    u->resp_rows = xmalloc((size_t)rows * 8);
    u->seq_off = xmalloc((size_t)(micro + 1) * 8);
    u->micro = micro;
}

void grpo_update_ws_free(UpdateWs *u) {
    decoder_train_free(&u->act);
    free(u->tokens), free(u->targets), free(u->resp_rows), free(u->seq_off);
}

// Which row of the packed micro-batch of kept samples [a, b) (grpo_pack's) holds each of their response tokens' log-
// prob: resp_rows, and uploaded to the backend as resp_idx. Returns their count (resp_off[b] - resp_off[a]).
static int64_t response_rows(const Backend *be, const StepBatch *sb, int64_t a, int64_t b, UpdateWs *u) {
    int64_t n = 0;
    for (int64_t k = a; k < b; k++) {
        int64_t r0 = u->seq_off[k - a] + sb->prompt_len[sb->kept[k]] - 1, len = sb->resp_off[k + 1] - sb->resp_off[k];
        for (int64_t t = 0; t < len; t++) u->resp_rows[n++] = r0 + t;
    }
    be->upload(be, u->resp_idx, u->resp_rows, (size_t)n * sizeof *u->resp_rows);
    return n;
}

// The response tokens' values of rows (the backend's, one per row) into host out (n).
static void rows_to_host(const Backend *be, UpdateWs *u, const float *rows, int64_t n, float *out) {
    be->gather_rows(be, u->resp, rows, u->resp_idx, n, 1, 1.0f);
    be->download(be, out, u->resp, (size_t)n * sizeof *out);
}

// Host values in (n, per response token) into rows (the backend's, N of them); the other rows 0.
static void host_to_rows(const Backend *be, UpdateWs *u, const float *in, int64_t n, int64_t N, float *rows) {
    be->upload(be, u->resp, in, (size_t)n * sizeof *in);
    be->zero(be, rows, (size_t)N * sizeof *rows);
    be->scatter_rows(be, rows, u->resp, u->resp_idx, n, 1, 1.0f);
}

// Per-response-token log-probs of the kept samples under model m and image features feats (per prompt; no
// gradient), into out.
void grpo_score_kept(const Run *r, const Decoder *m, const StepBatch *sb, float *const *feats, UpdateWs *u,
                     float *out) {
    for (int64_t a = 0; a < sb->n_kept; a += u->micro) {
        int64_t b = a + u->micro < sb->n_kept ? a + u->micro : sb->n_kept;
        DecoderVlInputs in;
        grpo_pack(sb, a, b, u);
        grpo_pack_images(r, m, sb, feats, NULL, a, b, u, &in);
        decoder_train_forward(m, u->tokens, u->targets, u->seq_off, (int)(b - a), &u->act, u->rows, NULL);
        grpo_unpack_images(u, &in);
        rows_to_host(m->be, u, u->rows, response_rows(m->be, sb, a, b, u), out + sb->resp_off[a]);
    }
}

// One mini-batch's gradient, micro-batch by micro-batch, into the trainer's gradient slab. Its loss
// is normalised by the whole mini-batch over all ranks (n_tok tokens, n_seq responses), so that the
// ranks' gradients add up to the single-process one (with dynamic sampling the ranks drop flat groups
// on their own, so mini-batches after the first may hold other samples than in one process). pass: the epoch
// and mini-batch, which with the step, rank and micro-batch seed clip_cov's choice.
static void accumulate_minibatch(Run *r, const Decoder *cm, StepBatch *sb, int64_t m0, int64_t m1, double n_tok,
                                 double n_seq, int on_policy, const int64_t pass[2], UpdateWs *u, GrpoLossStats *total) {
    const GrpoSettings *s = r->s;
    const Backend *be = cm->be;
    GrpoLossConfig lc = s->loss;
    if (s->use_kl_in_reward) lc.kl_coef = 0.0;
    int bonus = lc.entropy_coeff != 0.0;
    for (int64_t a = m0; a < m1 && n_tok > 0; a += u->micro) {
        int64_t b = a + u->micro < m1 ? a + u->micro : m1, t0 = sb->resp_off[a], t1 = sb->resp_off[b];
        DecoderVlInputs in;
        grpo_pack(sb, a, b, u);
        grpo_pack_images(r, cm, sb, sb->feats, sb->dfeats, a, b, u, &in);
        decoder_train_forward(cm, u->tokens, u->targets, u->seq_off, (int)(b - a), &u->act, u->rows, u->ent_rows);
        int64_t n = response_rows(be, sb, a, b, u), N = u->seq_off[b - a];
        rows_to_host(be, u, u->rows, n, sb->logp + t0);
        rows_to_host(be, u, u->ent_rows, n, sb->ent + t0);
        // On-policy (one epoch, one mini-batch): old = current, so the ratio is exactly 1.
        if (on_policy) memcpy(sb->old_logp + t0, sb->logp + t0, (size_t)(t1 - t0) * 4);
        for (int64_t k = a; k < b && on_policy && s->rollout_is; k++)  // else grpo_rollout_correction's
            rollout_is_weights(s->rollout_is == 2, s->rollout_is_threshold, sb->old_logp, sb->rollout_logp, sb->mask,
                               sb->resp_off[k], sb->resp_off[k + 1], sb->is_w);
        GrpoLossStats st;
        uint64_t seed_of[6] = {s->seed, (uint64_t)r->tr.st.iteration, (uint64_t)pass[0], (uint64_t)pass[1],
                               (uint64_t)a, (uint64_t)r->comm.rank};
        lc.cov_seed = hash_bytes(seed_of, sizeof seed_of);
        grpo_loss(&lc, sb->logp, sb->old_logp, r->has_ref ? sb->ref_logp : NULL, sb->ent, sb->mask, sb->is_w,
                  sb->kept_adv + a, sb->resp_off + a, (int)(b - a), n_tok, n_seq, sb->dlogp, bonus ? sb->dent : NULL,
                  &st);
        grpo_loss_stats_add(total, &st);
        // The trainer averages the ranks' gradients: each contributes its share times the rank count.
        float scale = (float)(r->tr.scaler.scale * r->comm.size);
        for (int64_t t = t0; t < t1; t++) sb->dlogp[t] *= scale;
        for (int64_t t = t0; bonus && t < t1; t++) sb->dent[t] *= scale;
        host_to_rows(be, u, sb->dlogp + t0, n, N, u->drows);
        if (bonus) host_to_rows(be, u, sb->dent + t0, n, N, u->dent_rows);
        decoder_backward(cm, r->tr.grads, u->drows, bonus ? u->dent_rows : NULL, &u->act);
        grpo_unpack_images(u, &in);
    }
}

// ppo_epochs passes over the mini-batches; clip + AdamW after each (a trained merger's features refreshed
// before each, as its weights move).
void grpo_update(Run *r, StepBatch *sb, int need_old, UpdateWs *u, StepStats *st) {
    const GrpoSettings *s = r->s;
    int64_t it = r->tr.st.iteration;
    grpo_loss_stats_init(&st->loss);
    // The schedule advances once per GRPO step, as verl steps its scheduler once per update_actor.
    st->lr = lr_at(s->schedule, s->adam.lr, s->warmup, r->steps, it);
    for (int64_t e = 0; e < s->ppo_epochs; e++)
        for (int64_t mb = 0; mb < sb->n_mini; mb++) {
            int64_t m0 = sb->mb_start[mb], m1 = sb->mb_start[mb + 1];
            double tot[2];  // 0 tokens: a zero-gradient step
            grpo_count_loss_tokens(sb, m0, m1, &tot[0], &tot[1]);
            comm_allreduce_f64(&r->comm, tot, 2, COMM_SUM, "mini-batch token counts");
            const Decoder *cm = trainer_begin_step(&r->tr);
            if (r->train_merger)  // the merger's weights moved with the last update
                grpo_merge_features(r, r->merger_be, &r->merger, sb->hidden, sb->units, (int)s->train_batch_size, sb->feats);
            accumulate_minibatch(r, cm, sb, m0, m1, tot[0], tot[1], !need_old, (int64_t[2]){e, mb}, u, &st->loss);
            if (r->train_merger) grpo_merger_backward(r, sb);
            double norm = trainer_apply(&r->tr, st->lr, 1);
            if (!isfinite(norm)) fprintf(stderr, "grpo: warning: step %lld: non-finite gradients; update skipped\n", (long long)it + 1);
            else st->norm_sum += norm, st->n_updates++;
            if (r->tr.st.skips_in_row >= s->max_skips)
                die("%lld consecutive updates skipped for non-finite gradients (step %lld)", (long long)r->tr.st.skips_in_row,
                    (long long)it + 1);
        }
}
