// The run: settings resolved from the configuration, the model, data, rewards and reference loaded, files
// opened, validation, the loop of steps, stopping on a signal and the end.
#define _XOPEN_SOURCE 700
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
#include "nn/skinny.h"
#include "text/utf8.h"
#include "train/checkpoint.h"
#include "train/grpo/step.h"

int grpo_has_lora(const GrpoSettings *s) { return s->lora.spec.rank > 0 || s->lora.adapter; }

// The unbiased pass@k of a prompt with c of n samples correct (Chen et al. 2021): 1 - C(n - c, k) / C(n, k).
static double pass_at_k(int n, int c, int k) {
    if (n - c < k) return 1.0;
    double none = 1.0;
    for (int i = n - c + 1; i <= n; i++) none *= 1.0 - (double)k / i;
    return 1.0 - none;
}

// Whether the most frequent extracted answer among a prompt's n samples (the first of equals; samples without one
// do not vote) is correct: maj@n.
static int majority_correct(const RewardDetail *det, int n) {
    int best = -1, best_votes = 0;
    for (int i = 0; i < n; i++) {
        int votes = 0;
        for (int j = 0; j < n && det[i].pred[0]; j++) votes += !strcmp(det[i].pred, det[j].pred);
        if (votes > best_votes) best = i, best_votes = votes;
    }
    return best >= 0 && det[best].correct == 1;
}

// The validation (rollout.val_kwargs): val_n samples of every validation prompt (each rank its contiguous share),
// scored by the rewards, summed per data_source in v (every rank's, added up) and, with trainer.dump_samples, each
// written to OUT/val_samples.jsonl.
static void validate(Run *r, int64_t step, ValStats *v) {
    const GrpoSettings *s = r->s;
    const Decoder *m = trainer_weights(&r->tr);
    int64_t v0 = r->val.n * r->comm.rank / r->comm.size, n = r->val.n * (r->comm.rank + 1) / r->comm.size - v0;
    int G = s->val_n;
    int64_t *idx = xmalloc((size_t)(n + 1) * sizeof *idx);
    for (int64_t i = 0; i < n; i++) idx[i] = v0 + i;
    RolloutSample *out = xcalloc((size_t)(n * G + 1), sizeof *out);
    RewardDetail *det = xcalloc((size_t)G, sizeof *det);
    float **feats = grpo_prompt_features(r, &r->val, idx, (int)n, s->val_files, NULL);
    if (n > 0) grpo_generate(r, m, &r->val, idx, idx, (int)n, G, &s->val_sampler, feats, out);
    grpo_features_free(feats, n);
    const PromptSample **xs = xmalloc((size_t)(n * G + 1) * sizeof *xs);
    double *models = xmalloc((size_t)(n * G + 1) * sizeof *models);
    for (int64_t i = 0; i < n * G; i++) xs[i] = &r->val.s[v0 + i / G];
    grpo_model_rewards(r, xs, out, n * G, models, NULL);
    FILE *dump = NULL;
    char *dump_path = path_join(s->out_dir, "val_samples.jsonl");
    if (s->dump_samples && !(dump = fopen(dump_path, "a"))) die("cannot open %s for writing: %s", dump_path, strerror(errno));
    for (int64_t i = 0; i < n; i++) {
        const PromptSample *x = &r->val.s[v0 + i];
        int c = 0;
        double reward = 0;
        for (int j = 0; j < G; j++) {
            RolloutSample *o = &out[i * G + j];
            char *text = rollout_sample_final_text(o);
            char *msgs = grpo_score_sample(r, x, o, text, models[i * G + j], &det[j]);
            c += det[j].correct == 1;
            reward += det[j].total;
            if (dump) {
                fprintf(dump, "{\"step\": %lld, \"prompt_index\": %lld, \"sample\": %d, \"data_source\": ",
                        (long long)step, (long long)(v0 + i), j);
                if (x->data_source) json_write_string(dump, x->data_source, strlen(x->data_source));
                else fputs("null", dump);
                fprintf(dump, ", \"response\": ");
                Buf clean = {0};
                utf8_append_lossy(&clean, text, strlen(text));
                json_write_string(dump, clean.data ? clean.data : "", clean.len);
                buf_free(&clean);
                fprintf(dump, ", \"reward\": %.9g, \"correct\": %d, \"pred\": ", det[j].total, det[j].correct);
                json_write_string(dump, det[j].pred, strlen(det[j].pred));
                fputs("}\n", dump);
            }
            free(text);
            free(msgs);
            rollout_sample_free(o);
        }
        double *sum[2] = {val_stats_row(v, x->data_source), val_stats_total(v)};  // its source's, and all
        for (int t = 0; t < 2; t++) {
            sum[t][VAL_PROMPTS] += 1;
            sum[t][VAL_ACC] += (double)c / G;
            sum[t][VAL_REWARD] += reward / G;
            sum[t][VAL_MAJ] += majority_correct(det, G);
            for (int k = 0; k < v->n_k; k++) sum[t][VAL_PASS + k] += pass_at_k(G, c, v->ks[k]);
        }
    }
    if (dump) file_close(dump, dump_path);
    free(dump_path);
    free(xs), free(models);
    free(det);
    free(out);
    free(idx);
    comm_allreduce_f64(&r->comm, v->sum, (size_t)(v->n_src + 1) * VAL_N(v), COMM_SUM, "validation counts");
}

// actor.lora.* and model.adapter: the adapter's own adapter_config.json decides r, alpha and the targets;
// the keys, when set, must agree with it.
static void resolve_lora(GrpoSettings *s, const GrpoConfig *c) {
    const GrpoActorConfig *a = &c->actor;
    TrainerLora *lo = &s->lora;
    *lo = (TrainerLora){.spec = {a->lora.rank, a->lora.alpha, 0}, .base_dtype = a->lora.base_dtype,
                        .adapter = c->model.adapter, .seed = c->trainer.seed};
    for (int i = 0; i < a->lora.target_modules.n; i++)
        lora_targets_add(&lo->spec.targets, a->lora.target_modules.items[i]);  // checked by grpo_config_load
    if (!lo->spec.targets) lora_targets_add(&lo->spec.targets, "all-linear");
    if (lo->adapter)
        lora_spec_from_adapter(&lo->spec, lo->adapter, "actor.lora.rank", a->lora.target_modules.n > 0,
                               "actor.lora.target_modules");
}

void grpo_settings_resolve(GrpoSettings *s, const GrpoConfig *c) {
    const GrpoActorConfig *a = &c->actor;
    *s = (GrpoSettings){
        .config = c, .model_dir = c->model.path,
        .train_files = (const char *const *)c->data.train_file.items, .n_train_files = c->data.train_file.n,
        .val_files = (const char *const *)c->data.val_file.items, .n_val_files = c->data.val_file.n,
        .filter_overlong = c->data.filter_overlong_prompts, .by_data_source = c->reward.by_data_source,
        .out_dir = c->trainer.out_dir, .device = c->trainer.device, .prompt_key = c->data.prompt_key, .answer_key = c->data.answer_key,
        .image_key = c->data.image_key, .min_pixels = c->data.min_pixels, .max_pixels = c->data.max_pixels,
        .chat_template = c->data.chat_template, .enable_thinking = c->data.enable_thinking,
        .chat_template_kwargs = c->data.chat_template_kwargs,
        .train_batch_size = c->data.train_batch_size, .G = (int)c->rollout.n,
        .gen_batch_size = c->data.gen_batch_size ? c->data.gen_batch_size : c->data.train_batch_size,
        .max_num_gen_batches = c->algorithm.max_num_gen_batches,
        .max_prompt_length = c->data.max_prompt_length, .max_response_length = c->data.max_response_length,
        .sampler = {(float)c->rollout.temperature, (int)c->rollout.top_k, (float)c->rollout.top_p},
        .val_sampler = {(float)c->rollout.val_kwargs.temperature, (int)c->rollout.val_kwargs.top_k,
                        (float)c->rollout.val_kwargs.top_p},
        .val_n = (int)c->rollout.val_kwargs.n,
        .rollout_int8 = c->rollout.weight_dtype == 1,
        .norm_adv_by_std = c->algorithm.norm_adv_by_std, .dynamic_sampling = c->algorithm.dynamic_sampling,
        .use_kl_in_reward = c->algorithm.use_kl_in_reward, .mask_truncated = c->algorithm.mask_truncated,
        .filter_acc = c->algorithm.filter_metric == GRPO_FILTER_ACC,
        .adv_estimator = (AdvEstimator)c->algorithm.adv_estimator,
        .rollout_is = c->algorithm.rollout_correction.rollout_is,
        .rollout_is_threshold = c->algorithm.rollout_correction.rollout_is_threshold,
        .rollout_is_batch_normalize = c->algorithm.rollout_correction.rollout_is_batch_normalize,
        .overlong_buffer = c->reward.overlong_buffer.len, .overlong_penalty = c->reward.overlong_buffer.penalty_factor,
        .ppo_epochs = a->ppo_epochs,
        // verl counts mini-batches in prompts (each brings its G responses) and micro-batches in responses.
        .mini_batch_size = (a->mini_batch_size ? a->mini_batch_size : c->data.train_batch_size) * c->rollout.n,
        .adam = {a->lr, a->beta1, a->beta2, a->adam_eps, a->weight_decay}, .grad_clip = a->grad_clip,
        .schedule = a->lr_schedule, .warmup = a->lr_warmup_steps, .steps = c->trainer.steps, .epochs = c->data.epochs,
        .precision = a->precision, .ref_dtype = c->model.ref_dtype, .save_dtype = c->trainer.save_dtype,
        .loss_scale = a->loss_scale, .loss_scale_window = a->loss_scale_window, .max_skips = c->trainer.max_skips,
        .recompute = a->recompute, .offload_optimizer = a->offload_optimizer,
        .offload_params = a->offload_params, .shuffle = c->data.shuffle,
        .seed = c->trainer.seed, .train_merger = a->vision.train_merger,
        .save_every = c->trainer.save_every, .keep = c->trainer.keep, .val_every = c->trainer.val_every,
        .val_before_train = c->trainer.val_before_train, .dump_samples = c->trainer.dump_samples,
        .resume = c->trainer.resume, .overwrite = c->trainer.overwrite,
        .stop = (const char *const *)c->rollout.stop.items, .n_stop = c->rollout.stop.n,
        .tools_file = c->rollout.multi_turn.tools_file, .max_turns = (int)c->rollout.multi_turn.max_turns,
        .max_parallel_calls = (int)c->rollout.multi_turn.max_parallel_calls,
        .tool_timeout_s = c->rollout.multi_turn.tool_timeout_s, .tool_memory_mb = c->rollout.multi_turn.tool_memory_mb,
        .dist_timeout_s = c->dist.timeout_s, .zero = (int)c->dist.zero, .pin_cpu = c->dist.pin_cpu,
        .topk_ratio = c->compression.type == GRPO_COMPRESSION_TOPK ? c->compression.ratio : 0.0,
    };
    if (c->reward.reward_model.model_path && c->reward.reward_model.weight != 0) {  // a zero weight loads nothing
        s->rm_path = c->reward.reward_model.model_path, s->rm_weight = c->reward.reward_model.weight;
        s->rm_dtype = c->reward.reward_model.dtype, s->rm_micro = c->reward.reward_model.micro_batch_size;
        int64_t len = c->reward.reward_model.max_length;
        s->rm_max_length = len ? len : max_seq_len(s) + 256;
        s->rm_length_asked = len != 0;
    }
    const GrpoRewardConfig *rw = &c->reward;
    if (rw->judge.model_path && rw->judge.weight != 0) {
        s->judge = (RewardJudgeConfig){.model_path = rw->judge.model_path, .rubric = rw->judge.rubric,
                                       .regex = rw->judge.regex, .dtype = rw->judge.dtype,
                                       .max_length = rw->judge.max_length, .length_asked = rw->judge.max_length != 0,
                                       .max_new_tokens = rw->judge.max_new_tokens,
                                       .max_batch = rw->judge.micro_batch_size,
                                       .failure_score = rw->judge.failure_score};
        if (!s->judge.max_length) s->judge.max_length = max_seq_len(s) + 512 + rw->judge.max_new_tokens;
        s->judge_weight = rw->judge.weight;
    }
    s->micro_batch_size = a->micro_batch_size ? a->micro_batch_size : s->mini_batch_size;
    const char *rs = c->algorithm.rollout_correction.rollout_rs;
    char why[256];
    if (rs && !rollout_rs_parse(rs, c->algorithm.rollout_correction.rollout_rs_threshold, &s->rollout_rs, why,
                                sizeof why))
        die("algorithm.rollout_correction.rollout_rs: %s", why);  // the configuration's check has said it first
    resolve_lora(s, c);
    // KL in the loss (verl use_kl_loss) or folded into the reward (use_kl_in_reward), never both.
    s->loss = (GrpoLossConfig){
        .mode = (PolicyLossMode)a->policy_loss.loss_mode, .tau_pos = a->tau_pos, .tau_neg = a->tau_neg,
        .clip_low = a->clip_ratio_low, .clip_high = a->clip_ratio_high, .clip_c = a->clip_ratio_c,
        .kl_coef = a->use_kl_loss ? a->kl_loss_coef : c->algorithm.use_kl_in_reward ? c->algorithm.kl_coef : 0.0,
        .kl = (KlEstimator)(a->use_kl_loss ? a->kl_loss_type : c->algorithm.kl_penalty),
        .agg = (LossAgg)a->loss_agg_mode, .norm_len = (double)c->data.max_response_length,
        .entropy_coeff = a->entropy_coeff, .clip_cov_ratio = a->policy_loss.clip_cov_ratio,
        .clip_cov_lb = a->policy_loss.clip_cov_lb, .clip_cov_ub = a->policy_loss.clip_cov_ub,
        .kl_cov_ratio = a->policy_loss.kl_cov_ratio, .ppo_kl_coef = a->policy_loss.ppo_kl_coef};
    const GrpoRewardConfig *rc = &c->reward;
    RewardSpec *sp = s->rewards;
    // reward.by_data_source: both rules, each row scored by its own (a zero weight stands for 1)
    int by_source = rc->by_data_source;
    if (rc->gsm8k.weight != 0 || by_source) {
        reward_spec_defaults(sp, REWARD_GSM8K);
        sp->weight = rc->gsm8k.weight != 0 ? rc->gsm8k.weight : 1.0;
        sp->score = rc->gsm8k.score, sp->format_score = rc->gsm8k.format_score;
        sp->flexible = rc->gsm8k.method == GRPO_GSM8K_FLEXIBLE, sp->clip_chars = rc->gsm8k.clip_chars;
        sp->strip_think = rc->strip_think;
        sp++;
    }
    if (rc->boxed.weight != 0 || by_source) {
        reward_spec_defaults(sp, REWARD_BOXED);
        sp->weight = rc->boxed.weight != 0 ? rc->boxed.weight : 1.0;
        sp->score = rc->boxed.score, sp->format_score = rc->boxed.format_score;
        sp->strip_think = rc->strip_think;
        sp++;
    }
    if (rc->format.weight != 0) {
        reward_spec_defaults(sp, REWARD_FORMAT);
        sp->weight = rc->format.weight, sp->pattern = rc->format.regex, sp->dotall = rc->format.dotall;
        sp++;
    }
    if (rc->exact.weight != 0) {
        reward_spec_defaults(sp, REWARD_EXACT);
        sp->weight = rc->exact.weight;
        sp->strip_think = rc->strip_think;
        sp++;
    }
    if (rc->program.weight != 0) {
        reward_spec_defaults(sp, REWARD_PROGRAM);
        sp->weight = rc->program.weight, sp->command = rc->program.command;
        sp->timeout_s = rc->program.timeout_s, sp->grace_s = rc->program.grace_s;
        sp->memory_mb = rc->program.memory_mb;
        sp++;
    }
    s->n_rewards = (int)(sp - s->rewards);
}

// OUT/config.yaml: the resolved configuration as YAML, so the run can be repeated with --config and
// `grpo report` can show it.
static void save_config(const GrpoSettings *s) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) die("out of memory");
    grpo_config_print_yaml(s->config, f);
    if (fclose(f) != 0) die("out of memory");
    char *path = path_join(s->out_dir, "config.yaml");
    AtomicFile af;
    atomic_file_open(&af, path);
    atomic_file_write(&af, text, len);
    atomic_file_commit(&af);
    free(path);
    free(text);
}

// This rank's share of the settings: its prompts per step and responses per mini-batch.
static GrpoSettings rank_share(const GrpoSettings *s, const Comm *comm) {
    GrpoSettings l = *s;
    int64_t N = comm->size, mini_prompts = s->mini_batch_size / s->G;
    if (s->train_batch_size % N || mini_prompts % N)
        die("under mpirun -np %lld, data.train_batch_size (%lld) and the mini-batch (%lld prompts) must be multiples of "
            "the rank count: a prompt's group never spans ranks", (long long)N, (long long)s->train_batch_size,
            (long long)mini_prompts);
    if (N > 1 && s->train_batch_size % mini_prompts)
        die("under mpirun, data.train_batch_size (%lld) must be a multiple of actor.mini_batch_size (%lld)",
            (long long)s->train_batch_size, (long long)mini_prompts);
    if (N > 1 && s->dump_samples) die("trainer.dump_samples needs a single process (each rank holds only its samples)");
    l.train_batch_size /= N;
    l.gen_batch_size /= N;  // a multiple of the mini-batch (grpo_config_load), so of N
    l.mini_batch_size /= N;
    if (l.micro_batch_size > l.mini_batch_size) l.micro_batch_size = l.mini_batch_size;
    return l;
}

// The run's model (trainer), tokenizer, data, stop tokens, rewards and reference: all but its files.
static void run_load(Run *r) {
    const GrpoSettings *s = r->s;
    DecoderConfig lm;
    decoder_config_load_vl(&lm, s->model_dir);
    if (lm.vl && (s->rm_path || s->judge.model_path))  // their templates would get image parts
        die("%s: a vision-language policy with reward.reward_model or reward.judge: not yet (they read text only)",
            s->model_dir);
    if ((r->has_vl = lm.vl)) {  // the vision tower is frozen: loaded once, fp32, never trained
        vl_model_load(&r->vl, s->model_dir, &lm);
        vl_set_pixels(&r->vl.proc, s->min_pixels, s->max_pixels, "data.min_pixels / data.max_pixels");
        r->merger = r->vl.vision.merger;
    } else if (s->train_merger) {
        die("%s: actor.vision.train_merger needs a vision-language model", s->model_dir);
    }
    r->train_merger = s->train_merger;  // then the merger is trained with the language model, in its slab
    trainer_init(&r->tr, r->be, s->model_dir, s->adam, s->grad_clip, s->precision, s->loss_scale,
                 s->loss_scale_window, &s->lora, r->train_merger ? &r->vl.vision.cfg : NULL, s->offload_params);
    trainer_set_dist(&r->tr, &r->comm, s->zero, s->topk_ratio);
    const DecoderConfig *c = &r->tr.master.cfg;
    if (r->train_merger) {
        const float *p = r->tr.master.params;
        const DecoderLayout *w = &r->tr.master.w;
        r->merger = (VisionMerger){p + w->merger_ln_q, c->merger_ln_bias ? p + w->merger_ln_q_b : NULL,
                                   p + w->merger_w0, p + w->merger_b0, p + w->merger_w2, p + w->merger_b2};
    }
    r->merger_be = r->train_merger ? r->tr.be : r->vl.be;
    char *tj = path_join(s->model_dir, "tokenizer.json");
    if (!file_exists(tj)) die("%s: grpo train needs a tokenizer.json in the model directory", s->model_dir);
    tokenizer_load(&r->tok, tj);
    if (!s->enable_thinking) chat_template_set(&r->tok.chat, "enable_thinking", cJSON_CreateFalse());
    cJSON *kwargs = cJSON_Parse(s->chat_template_kwargs ? s->chat_template_kwargs : "{}");
    chat_template_set_all(&r->tok.chat, kwargs, "data.chat_template_kwargs");
    cJSON_Delete(kwargs);
    free(tj);
    if ((r->has_tools = s->tools_file != NULL)) {
        if (!s->chat_template || !r->tok.chat.tool_calls)
            die("rollout.multi_turn.tools_file needs data.chat_template: true and a chat template with tool calls "
                "(%s has %s)", s->model_dir, r->tok.chat.tpl ? "one without them" : "none");
        toolset_load(&r->tools, s->tools_file, "rollout.multi_turn.tools_file", s->max_parallel_calls,
                     s->tool_timeout_s, s->tool_memory_mb);
        r->hook = (ToolHook){.tools = &r->tools, .tok = &r->tok};
        tools_check_template(&r->hook, "rollout.multi_turn.tools_file");
    }
    const cJSON *tools = r->has_tools ? r->tools.schemas : NULL;
    PromptDataOptions po = {.prompt_key = s->prompt_key, .answer_key = s->answer_key, .tok = &r->tok,
                            .chat_template = s->chat_template, .tools = tools,
                            .max_prompt_length = s->max_prompt_length, .filter_overlong = s->filter_overlong,
                            .image_key = s->image_key};
    if (r->has_vl) {
        po.vl = &r->vl.proc;
        po.image_pad = (int32_t)c->image_pad_id;
    }
    prompt_data_load(&r->train, s->train_files, s->n_train_files, "data.train_file", &po);
    if ((r->has_val = s->n_val_files > 0))
        prompt_data_load(&r->val, s->val_files, s->n_val_files, "data.val_file", &po);
    int lead = r->comm.rank == 0;
    if (lead && r->train.n_filtered + r->val.n_filtered > 0)
        fprintf(stderr, "grpo train: data.filter_overlong_prompts skipped %lld training and %lld validation prompts "
                "over %lld tokens\n", (long long)r->train.n_filtered, (long long)r->val.n_filtered,
                (long long)s->max_prompt_length);
    if (s->by_data_source) {
        grpo_check_data_sources(&r->train, s->train_files);
        grpo_check_data_sources(&r->val, s->val_files);
    }
    if (s->max_prompt_length + s->max_response_length > c->max_pos)
        die("max_prompt_length + max_response_length = %lld exceeds the model's max_position_embeddings %lld",
            (long long)(s->max_prompt_length + s->max_response_length), (long long)c->max_pos);
    // Dynamic sampling takes a generation batch or more a step: as verl, the steps the data's generation batches
    // would make, the run ending early when data.epochs passes are used up (run_more).
    int64_t per_step = s->gen_batch_size * r->comm.size;
    r->steps = s->steps ? s->steps : s->epochs * ((r->train.n + per_step - 1) / per_step);
    r->n_stop = rollout_stop_ids(s->model_dir, &r->tok, r->stop_ids);
    reward_set_init(&r->rewards, s->rewards, s->n_rewards);
    if ((r->has_rm = s->rm_path != NULL))
        reward_model_load(&r->rm, s->rm_path, s->rm_dtype, s->rm_max_length, s->rm_length_asked, s->rm_micro);
    if ((r->has_judge = s->judge.model_path != NULL)) reward_judge_load(&r->judge, &s->judge);
    // The reference is the initial policy, frozen (optionally rounded to bf16); never computed when beta = 0.
    // With LoRA it is the base with the adapters switched off: the policy's own weights, no copy.
    if ((r->has_ref = s->loss.kl_coef > 0) && r->tr.has_lora) {
        r->ref = trainer_base(&r->tr);
    } else if (r->has_ref) {
        DecoderConfig rc = *c;  // the language model: a trained merger's initial weights are vl's
        vl_config_merger(&rc, NULL);
        decoder_build_on(&r->ref, &rc, compute_storage(s->ref_dtype), r->be);
        compute_copy_round(&r->ref, &r->tr.master, s->ref_dtype);
    }
    r->tr.st.seed = s->seed;
    r->tr.st.batch_size = r->P_global;
    r->tr.st.data_lines = r->train.n;
    r->tr.st.shuffle = s->shuffle;
}

// Resumes from ckpt (NULL: a new run), then rank 0 writes config.yaml and opens metrics.jsonl and
// samples.jsonl (appending when resumed).
static void run_open(Run *r, const char *ckpt) {
    const GrpoSettings *s = r->s;
    int lead = r->comm.rank == 0;
    r->metrics_path = path_join(s->out_dir, "metrics.jsonl");
    r->dump_path = path_join(s->out_dir, "samples.jsonl");
    const char *mp = r->metrics_path, *dp = r->dump_path;
    if (ckpt) {
        TrainState now = r->tr.st;
        trainer_load(&r->tr, ckpt);
        static const char *const keys[4] = {"trainer.seed", "data.train_batch_size", "data.train_file",
                                            "data.shuffle"};
        checkpoint_check_run(ckpt, &r->tr.st, &now, keys);
        if (lead) metrics_truncate(mp, r->tr.st.iteration);
        if (lead) fprintf(stderr, "grpo train: resuming from %s (step %lld)\n", ckpt, (long long)r->tr.st.iteration);
    }
    if (!lead) return;
    save_config(s);
    const char *mode = ckpt ? "a" : "w";
    if (!(r->metrics = fopen(mp, mode))) die("cannot open %s for writing: %s", mp, strerror(errno));
    if (s->dump_samples && !(r->dump = fopen(dp, mode))) die("cannot open %s for writing: %s", dp, strerror(errno));
}

static void print_start(const Run *r) {
    const GrpoSettings *s = r->s;
    const char *ref = "not needed (no KL)";
    if (r->has_ref) ref = r->tr.has_lora ? "the base with the adapters off (no copy)" : dtype_name(s->ref_dtype);
    char params[16];
    fmt_count(params, sizeof params, (double)r->tr.n);
    fprintf(stderr, "grpo train: %lld prompts x %d samples per step (%d process%s), %lld step%s, "
            "%s %sparameters, reference %s\n", (long long)r->P_global, s->G, r->comm.size,
            r->comm.size > 1 ? "es" : "", (long long)r->steps, r->steps == 1 ? "" : "s", params,
            r->tr.has_lora ? "trained LoRA " : "", ref);
}

// The validation, printed and written as step `step` (0: before training).
static void run_validate(Run *r, int64_t step) {
    ValStats v;
    val_stats_init(&v, &r->val, r->s->val_n);
    validate(r, step, &v);
    if (r->comm.rank == 0) {
        double acc = val_stats_total(&v)[VAL_ACC] / (double)r->val.n;
        const char *what = r->s->val_n > 1 ? "validation accuracy (mean of" : "validation accuracy";
        if (step == 0) fprintf(stderr, "grpo train: %s before training: %.3f", what, acc);
        else fprintf(stderr, "grpo train: step %lld %s %.3f", (long long)step, what, acc);
        if (r->s->val_n > 1) fprintf(stderr, " over %d samples a prompt)", r->s->val_n);
        fputc('\n', stderr);
        grpo_write_val_metrics(r, step, &v);
    }
    val_stats_free(&v);
}

// After SIGINT/SIGTERM: a checkpoint of the step just finished, the files closed, exit 128 + sig.
static GRPO_NORETURN void run_stop(Run *r, int sig) {
    const GrpoSettings *s = r->s;
    trainer_save_on_signal(&r->tr, sig, r->tr.st.iteration, "grpo train", "trainer.resume=true", s->out_dir,
                           s->save_dtype, s->model_dir, s->keep);
    if (r->comm.rank == 0) file_close(r->metrics, r->metrics_path);
    if (r->dump) file_close(r->dump, r->dump_path);
    reward_set_free(&r->rewards);  // ends the reward program
    if (r->has_tools) toolset_free(&r->tools);
    comm_finalize(&r->comm);
    exit(128 + sig);
}

// The end: rank 0 writes the final model and closes the files; everything is freed.
static void run_finish(Run *r) {
    const GrpoSettings *s = r->s;
    comm_finalize(&r->comm);  // the other ranks are done; rank 0's writes need no MPI (nor its timeout)
    if (r->comm.rank == 0) {
        copy_model_extras(s->model_dir, s->out_dir);
        trainer_save_result(&r->tr, s->out_dir, s->save_dtype, s->model_dir);
        checkpoint_prune(s->out_dir, s->keep);
        const Backend *be = r->tr.be;
        char *device = be->memory_peak ? xprintf("%s peak %.3f GiB, ", be->name, (double)be->memory_peak(be) / GIB)
                                       : xstrdup("");
        fprintf(stderr, "grpo train: wrote %s (peak RSS %.2f GiB; %splanned %.3f GiB)\n", s->out_dir,
                grpo_rss_gib("VmHWM:"), device, (double)r->plan.peak / GIB);
        free(device);
        file_close(r->metrics, r->metrics_path);
    }
    if (r->dump) file_close(r->dump, r->dump_path);
    free(r->metrics_path);
    free(r->dump_path);
    if (r->has_ref && !r->tr.has_lora) decoder_free(&r->ref);
    decoder_q8_free(&r->q8);
    backend_arena_free(r->tr.be, &r->workspace);
    reward_set_free(&r->rewards);
    if (r->has_rm) reward_model_free(&r->rm);
    if (r->has_judge) reward_judge_free(&r->judge);
    if (r->has_tools) toolset_free(&r->tools);
    prompt_data_free(&r->train);
    if (r->has_val) prompt_data_free(&r->val);
    tokenizer_free(&r->tok);
    if (r->has_vl) vl_model_free(&r->vl);
    trainer_free(&r->tr);
    backend_close(r->be);
}

// A device's memory against the plan, before the workspace is made: what the plan still needs past what the run
// holds already (the models) must be free.
static void plan_fits_device(const Run *r) {
    const Backend *be = r->tr.be;
    if (!be->memory_info) return;
    size_t held = be->memory_held(be), free_bytes = 0, total = 0;
    be->memory_info(be, &free_bytes, &total);
    size_t more = r->plan.peak > held ? r->plan.peak - held : 0;
    if (more > free_bytes)
        die("trainer.device %s: the memory plan needs %.2f GiB more than the %.2f GiB loaded, and %.2f of the "
            "device's %.2f GiB are free (grpo doctor --config shows the plan; smaller rollout.n, "
            "data.train_batch_size or actor.micro_batch_size, LoRA, or actor.offload_optimizer=true lower it)",
            be->name, (double)more / GIB, (double)held / GIB, (double)free_bytes / GIB, (double)total / GIB);
}

// Whether the run takes another step: trainer.steps, or without it (data.epochs) while the prompts last.
static int run_more(const Run *r) {
    int by_epochs = !r->s->steps && r->s->dynamic_sampling;
    return r->tr.st.iteration < r->steps && !(by_epochs && r->tr.st.prompts_seen >= r->s->epochs * r->train.n);
}

void grpo_run(const GrpoSettings *global) {
    if (!global->model_dir || global->n_train_files == 0)
        die("model.path and data.train_file are required (or run grpo train with no arguments for the demo)");
    dir_check("model.path", global->model_dir);
    Run r = {.P_global = global->train_batch_size};
    r.be = backend_open(global->device ? global->device : "cpu", "trainer.device");
    backend_require_training(r.be, "trainer.device");
    if (grpo_has_lora(global)) {
        backend_require_bf16(r.be, "trainer.device", "actor.lora.base_dtype", global->lora.base_dtype);
    } else {
        backend_require_bf16(r.be, "trainer.device", "actor.precision", global->precision);
        if (global->loss.kl_coef > 0)
            backend_require_bf16(r.be, "trainer.device", "model.ref_dtype", global->ref_dtype);
    }
    if (global->offload_params)
        trainer_check_params_on_host(r.be, "trainer.device", "actor.offload_params", grpo_has_lora(global),
                                     global->train_merger);
    comm_init(&r.comm, global->dist_timeout_s);
    comm_pin_cpu(&r.comm, global->pin_cpu == GRPO_PIN_BLOCK ? "block" : "none");
    stop_signals_install();  // SIGINT/SIGTERM: checkpoint after the current step, then exit
    GrpoSettings local = rank_share(global, &r.comm);
    const GrpoSettings *s = r.s = &local;
    int lead = r.comm.rank == 0;  // prints and writes files
    static const RunDirOpts dir_opts = {"trainer.out_dir", "trainer.resume=true", "trainer.overwrite=true",
                                        "model.path"};
    char *ckpt = run_dir_claim(s->out_dir, s->model_dir, s->resume, s->overwrite, lead, &dir_opts);
    run_load(&r);
    // before a checkpoint's moments are read: offloaded ones never fill a device's memory
    if (s->offload_optimizer) trainer_offload_init(&r.tr, s->out_dir);
    run_open(&r, ckpt);
    free(ckpt);
    // One workspace for the whole run, sized by the memory plan: KV cache in rollout, activations in the update.
    grpo_memory_plan(global, &r.tr.master.cfg, r.tr.be, r.comm.size, &r.plan);
    plan_fits_device(&r);
    backend_arena_init(r.tr.be, &r.workspace, r.plan.workspace);
    if (lead) grpo_print_plan(&r.plan, &r.comm);
    if (lead) print_start(&r);
    const Decoder *rollout_model = trainer_weights(&r.tr);
    if (s->rollout_int8) decoder_q8_init(&r.q8, rollout_model, "rollout.weight_dtype: int8");
    if (lead && !rollout_model->be->on_device) {  // the rollout's decode kernel, measured or read now
        DType dt = s->rollout_int8 ? DTYPE_Q8 : rollout_model->dtype;
        char *k = skinny_tuning_text(skinny_tuning(dt));
        fprintf(stderr, "grpo train: decode kernel (%s): %s\n", dtype_name(dt), *k ? k : "the level's own (GRPO_TUNING=off)");
        free(k);
    }
    Stream stream;
    stream_init(&stream, r.train.n, s->seed, s->shuffle);
    if (r.has_val && s->val_before_train && !s->resume) run_validate(&r, 0);
    while (run_more(&r)) {
        grpo_step(&r, &stream);
        int64_t it = r.tr.st.iteration;
        if (r.has_val && s->val_every > 0 && it % s->val_every == 0) run_validate(&r, it);
        if (s->save_every > 0 && it % s->save_every == 0)
            trainer_save(&r.tr, s->out_dir, s->save_dtype, s->model_dir, s->keep);
        int sig = run_more(&r) ? trainer_stop_signal(&r.tr) : 0;
        if (sig) run_stop(&r, sig);
    }
    stream_free(&stream);
    run_finish(&r);
}
