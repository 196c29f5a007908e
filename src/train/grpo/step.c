// One GRPO step, as the design's diagram: rollout, rewards, advantages, reference and old log-probs, update,
// metrics; and the rollout itself.
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

// Samples prompts idx[0..n) x G with the rollout engine on the policy's weights `m`, in the workspace;
// prompt i is seeded as the batch's prompt pos[i]; feats[i]: its image features (prompt_features).
void grpo_generate(Run *r, const Decoder *m, const PromptData *d, const int64_t *idx, const int64_t *pos, int n, int G,
                   const SamplerConfig *sampler, float *const *feats, RolloutSample *out) {
    const GrpoSettings *s = r->s;
    RolloutPrompt *p = xcalloc((size_t)n, sizeof *p);
    DecoderVlInputs *in = xcalloc((size_t)n + 1, sizeof *in);
    for (int i = 0; i < n; i++) {
        const PromptSample *x = &d->s[idx[i]];
        p[i] = (RolloutPrompt){.ids = x->ids, .n = x->len, .max_new_tokens = (int)s->max_response_length};
        if (r->has_vl)
            p[i].vl = vl_prompt_inputs(m, x->ids, x->len, x->images, x->n_images, feats[i], r->vl.proc.merge, &in[i]);
    }
    RolloutConfig rc = {.sampler = *sampler, .seed = hash_bytes(&(uint64_t[2]){s->seed, r->tr.st.iteration}, 16),
                        .stop_ids = r->stop_ids, .n_stop_ids = r->n_stop, .stop_strings = s->stop,
                        .n_stop_strings = s->n_stop, .share_prefill = 1, .prefill_tokens = ROLLOUT_PREFILL,
                        .workspace = &r->workspace, .seed_index = pos};
    const cJSON **kwargs = NULL;
    if (r->has_tools) {  // each prompt's tools_kwargs reach its tool calls
        kwargs = xcalloc((size_t)n, sizeof *kwargs);
        for (int i = 0; i < n; i++) kwargs[i] = d->s[idx[i]].tools_kwargs;
        r->hook.kwargs = kwargs;
        rc.max_turns = s->max_turns, rc.tool_fn = tools_rollout_turns, rc.tool_user = &r->hook;
    }
    RolloutStats st;
    rollout_generate(m, &r->tok, &rc, p, n, G, out, &st, NULL, NULL);
    r->hook.kwargs = NULL;
    free(kwargs);
    for (int i = 0; i < n; i++) decoder_vl_inputs_free(&in[i]);
    free(in);
    free(p);
}

// The stream positions of a batch of n prompts (this rank's share) starting at position base: this rank's share of
// every mini-batch, local prompt i being the batch's prompt pos[i] - base.
static void prompt_positions(const Run *r, int64_t n, int64_t base, int64_t *pos) {
    int64_t mini = r->s->mini_batch_size / r->s->G;  // this rank's prompts per mini-batch
    for (int64_t i = 0; i < n; i++) pos[i] = base + i / mini * mini * r->comm.size + r->comm.rank * mini + i % mini;
}

// Dynamic sampling (DAPO's filter_groups): generation batches of data.gen_batch_size prompts on the weights m,
// each scored, until every rank holds its share of data.train_batch_size groups that pass the filter; those first
// in order make sb (samples and rewards; the surplus is dropped, as verl's trainer drops it) and their prompts idx.
// Returns the generation batches taken; dies past algorithm.filter_groups.max_num_gen_batches.
static int64_t sample_until_full(Run *r, Stream *stream, const Decoder *m, StepBatch *sb, int64_t *idx, StepStats *st) {
    const GrpoSettings *s = r->s;
    int64_t P = s->train_batch_size, n = s->gen_batch_size, G = s->G, have = 0, b = 0;
    int64_t *gidx = xmalloc((size_t)n * sizeof *gidx), *gpos = xmalloc((size_t)n * sizeof *gpos);
    float *reward = xmalloc((size_t)(P * G) * sizeof *reward);
    int *correct = xmalloc((size_t)(P * G) * sizeof *correct);
    for (;; b++) {
        if (s->max_num_gen_batches && b == s->max_num_gen_batches) {
            double kept = (double)have;
            comm_allreduce_f64(&r->comm, &kept, 1, COMM_SUM, "dynamic sampling");
            die("dynamic sampling: %lld generation batches of %lld prompts gave %.0f of the %lld groups a step needs "
                "whose algorithm.filter_groups.metric differs within the group (algorithm.filter_groups."
                "max_num_gen_batches %lld): the prompts are too easy or too hard for the model; raise it (0: no limit)",
                (long long)b, (long long)(n * r->comm.size), kept, (long long)r->P_global,
                (long long)s->max_num_gen_batches);
        }
        prompt_positions(r, n, r->tr.st.prompts_seen + b * n * r->comm.size, gpos);
        for (int64_t i = 0; i < n; i++) gidx[i] = stream_at(stream, gpos[i]);
        StepBatch gb = {.n_samples = n * G};
        gb.samples = xcalloc((size_t)gb.n_samples, sizeof *gb.samples);
        float **feats = grpo_prompt_features(r, &r->train, gidx, (int)n, s->train_files, NULL);
        for (int64_t i = 0; i < n; i++) gpos[i] -= r->tr.st.prompts_seen;  // the rollout's seeds: batch b's positions
        grpo_generate(r, m, &r->train, gidx, gpos, (int)n, (int)G, &s->sampler, feats, gb.samples);
        grpo_features_free(feats, n);
        grpo_score_rewards(r, gidx, &gb, st);
        for (int64_t g = 0; g < n; g++) {
            int pass = grpo_group_passes(s, &gb, g);
            sb->n_dropped_groups += !pass;
            if (!pass || have == P) continue;
            idx[have] = gidx[g];
            memcpy(sb->samples + have * G, gb.samples + g * G, (size_t)G * sizeof *gb.samples);
            memset(gb.samples + g * G, 0, (size_t)G * sizeof *gb.samples);  // moved
            memcpy(reward + have * G, gb.reward + g * G, (size_t)G * sizeof *reward);
            memcpy(correct + have * G, gb.correct + g * G, (size_t)G * sizeof *correct);
            have++;
        }
        grpo_step_batch_free(&gb, n);
        double least = (double)have;
        comm_allreduce_f64(&r->comm, &least, 1, COMM_MIN, "dynamic sampling");
        if (least >= (double)P) break;
    }
    grpo_batch_alloc(r, idx, sb);
    memcpy(sb->reward, reward, (size_t)(P * G) * sizeof *reward);
    memcpy(sb->correct, correct, (size_t)(P * G) * sizeof *correct);
    free(reward), free(correct), free(gidx), free(gpos);
    return b + 1;
}

// One GRPO step, as the design's diagram: rollout, rewards, advantages, reference and old
// log-probs, update, metrics. The rollout and the update take turns in r->workspace.
void grpo_step(Run *r, Stream *stream) {
    const GrpoSettings *s = r->s;
    int64_t P = s->train_batch_size;
    StepStats st = {.t0 = time_now(), .n_gen_batches = 1};
    StepBatch sb = {.n_samples = P * s->G};
    int64_t *idx = xmalloc((size_t)P * sizeof *idx), *pos = xmalloc((size_t)P * sizeof *pos);

    // 0. the Adam moments leave memory until the update needs them (actor.offload_optimizer)
    trainer_offload(&r->tr);
    st.t_offload = time_now();
    // 1. rollout on the policy's own (compute) weights, or int8 copies of them made now, KV cache in the workspace;
    // with dynamic sampling, batches of it until the step's groups pass the filter (their rewards scored)
    const Decoder *policy = trainer_weights(&r->tr);
    Decoder rollout = *policy;
    if (s->rollout_int8) decoder_q8_quantize(&r->q8, policy), rollout.q8 = &r->q8;
    sb.samples = xcalloc((size_t)sb.n_samples, sizeof *sb.samples);
    ToolSet before = r->tools;
    if (s->dynamic_sampling) {
        st.n_gen_batches = sample_until_full(r, stream, &rollout, &sb, idx, &st);
        sb.feats = grpo_prompt_features(r, &r->train, idx, (int)P, s->train_files, &sb);  // the kept prompts'
    } else {
        prompt_positions(r, P, 0, pos);
        for (int64_t i = 0; i < P; i++) idx[i] = stream_at(stream, r->tr.st.prompts_seen + pos[i]);
        sb.feats = grpo_prompt_features(r, &r->train, idx, (int)P, s->train_files, &sb);  // once per prompt a step
        grpo_generate(r, &rollout, &r->train, idx, pos, (int)P, s->G, &s->sampler, sb.feats, sb.samples);
    }
    r->tr.st.prompts_seen += st.n_gen_batches * s->gen_batch_size * r->comm.size;
    st.tool_calls = r->tools.calls - before.calls, st.tool_errors = r->tools.errors - before.errors;
    st.t_tools = r->tools.seconds - before.seconds;
    st.rss_rollout = grpo_rss_gib("VmRSS:");
    st.t_roll = time_now();
    // 2. rewards, and which samples enter the loss
    if (!s->dynamic_sampling) grpo_score_rewards(r, idx, &sb, &st);
    grpo_count_samples(&sb, &st);
    grpo_select_kept(s, &sb);
    st.t_rew = time_now();
    // Dynamic sampling can leave ranks with different numbers of mini-batches: all take the largest.
    double n_mini = (double)sb.n_mini;
    comm_allreduce_f64(&r->comm, &n_mini, 1, COMM_MAX, "mini-batch count");
    for (; sb.n_mini < (int64_t)n_mini; sb.n_mini++) sb.mb_start[sb.n_mini + 1] = sb.n_kept;

    // 3. reference log-probs (frozen initial policy); old log-probs before any update when needed.
    // From here on the workspace holds training activations.
    UpdateWs u;
    grpo_update_ws_init(&u, s, &r->tr.master.cfg, r->tr.be, &r->workspace);
    int need_old = s->ppo_epochs > 1 || sb.n_mini > 1 || s->use_kl_in_reward || s->rollout_rs.n ||
                   (s->rollout_is && s->rollout_is_batch_normalize);
    float **ref_feats = sb.ref_feats ? sb.ref_feats : sb.feats;
    if (r->has_ref && sb.n_kept) {
        grpo_score_kept(r, &r->ref, &sb, ref_feats, &u, sb.ref_logp);
        st.t_ref = time_now();
    }
    if (need_old && sb.n_kept) grpo_score_kept(r, policy, &sb, sb.feats, &u, sb.old_logp), st.t_old = time_now();
    if (s->use_kl_in_reward) st.kl_reward = grpo_kl_into_reward(s, &sb);
    if (need_old) grpo_rollout_correction(r, &sb, &st);
    // 4. advantages
    grpo_compute_advantages(r, &sb);
    // 5. update: epochs x mini-batches x micro-batches, clip + AdamW per mini-batch
    grpo_update(r, &sb, need_old, &u, &st);
    if (!need_old) grpo_probs_diff(&sb, &st);  // on-policy: the old log-probs are the update's first
    if (!need_old && s->rollout_is) grpo_is_stats(s, &sb, &st);
    grpo_update_ws_free(&u);
    st.t_end = time_now();
    r->tr.st.iteration++;

    // 6. metrics
    grpo_write_metrics(r, &sb, &st);
    if (r->dump) grpo_dump_samples(r, &sb, idx);
    grpo_step_batch_free(&sb, P);
    free(idx);
    free(pos);
}
