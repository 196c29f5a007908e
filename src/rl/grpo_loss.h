// GRPO math on plain arrays: group advantages, the PPO-clip policy loss with a KL penalty, and
// its exact gradient w.r.t. the policy's per-token logprobs (the model's backward starts there).
//
// The formulas follow verl's verl/trainer/ppo/core_algos.py (verl-project/verl main, read at
// commit 018f23b5): compute_grpo_outcome_advantage, compute_policy_loss_vanilla,
// kl_penalty_forward and agg_loss; combined as verl's workers/actor/dp_actor.py update_policy does:
//     loss = agg(pg) + kl_coef * agg(kl)          (use_kl_loss, the same loss_agg_mode for both)
// Normalisers come from the whole mini-batch, like current verl's agg_loss with batch_num_tokens /
// global_batch_size (dp_size 1), so the micro-batches' shares add up to the mini-batch loss exactly;
// we use them for the KL term too, where verl's dp_actor still aggregates per micro-batch and scales
// by 1/grad_accumulation. Older verl (e.g. volcengine/verl 012be9d9, ~v0.4/0.5) did that for the
// policy term as well, and its seq-mean-token-sum-norm was sum/horizon with no mean over sequences;
// per-micro-batch normalisation equals ours only when every micro-batch holds the same number of
// tokens (token-mean) or sequences (seq-mean-*).
#pragma once
#include <stddef.h>
#include <stdint.h>

// verl kl_penalty names: "k1"/"kl", "k2"/"mse", "k3"/"low_var_kl". Per token, d = logp - ref:
//   k1 = d,  k2 = d^2/2,  k3 = clamp(e^t - t - 1, -10, 10) with t = clamp(-d, -20, 20).
// (verl's straight-through "k1+"/"k3+" and "abs"/"full" are not supported.)
typedef enum { KL_K1, KL_K2, KL_K3 } KlEstimator;
typedef enum { AGG_TOKEN_MEAN, AGG_SEQ_MEAN_TOKEN_MEAN, AGG_SEQ_MEAN_TOKEN_SUM_NORM } LossAgg;
// verl's actor.policy_loss.loss_mode, the functions of core_algos.py (verl-project/verl 1dda039b):
//   vanilla   compute_policy_loss_vanilla: PPO's clip (below)
//   gspo      compute_policy_loss_gspo: one ratio a sequence, s = exp(min(mean_t x_t, 10)) with x = logp - old,
//             clipped as PPO's (no dual clip); d s / d logp_t = s (verl's sg[s] . pi / sg[pi]); the policy term
//             always aggregates seq-mean-token-mean, whatever loss_agg_mode says (verl's)
//   geo_mean  compute_policy_loss_geo_mean (GMPO): per token m = x clamped to [-clip_low, clip_high] on the side
//             that lowers A's objective (sign(A) min(sign(A) x, sign(A) clamp(x))); per sequence
//             loss = -A' exp(sum m / (len + 1e-8)), A' = A len / (len + 1e-8); the mean over the mini-batch's
//             responses (verl: torch.mean over a micro-batch's rows, whatever loss_agg_mode says)
//   cispo     compute_policy_loss_cispo: loss = -sg[clamp(r, 1 - clip_low, 1 + clip_high)] A logp, r = e^x (x
//             clamped to +-20): every token has a gradient, the clipped ratio only weighs it
//   sapo      compute_policy_loss_sapo: loss = -A f(r), f(r) = sigmoid(tau (r - 1)) 4 / tau, tau = tau_pos for
//             A > 0 else tau_neg (a soft gate instead of the clip); seq-mean-token-mean always (verl's)
//   clip_cov  compute_policy_loss_clip_cov (Clip-Cov, arXiv 2505.22617): PPO's clip (no dual clip), and of the loss
//             tokens the clip leaves alone whose cov = (A - mean A)(logp - mean logp) lies strictly inside
//             (clip_cov_lb, clip_cov_ub), max(1, int(clip_cov_ratio n)) chosen at random (all when fewer) lose
//             their policy term and its gradient; clip_frac counts those chosen
//   kl_cov    compute_policy_loss_kl_cov (KL-Cov, the same paper): loss = -A r, no clip; the max(1, int(kl_cov_ratio
//             n)) loss tokens of the largest cov (ties: the earlier token) add ppo_kl_coef |logp - old|; clip_frac
//             counts them
//             Both: the means and n over the loss tokens of one grpo_loss call (verl: of one micro-batch; clip_cov's
//             means as masked_mean, / (n + 1e-8), kl_cov's / n); the log-ratio clamped to +-20 as vanilla's
typedef enum { PG_VANILLA, PG_GSPO, PG_GEO_MEAN, PG_CISPO, PG_SAPO, PG_CLIP_COV, PG_KL_COV } PolicyLossMode;
// verl's algorithm.adv_estimator for outcome rewards (one score a response), core_algos.py as above:
//   grpo                          compute_grpo_outcome_advantage (grpo_advantages below)
//   rloo                          compute_rloo_outcome_advantage: r - the mean of the group's others
//   opo                           compute_opo_outcome_advantage: r - sum(len r) / sum(len) over the group
//   grpo_passk                    compute_grpo_passk_outcome_advantage: the group's best response only gets
//                                 r_max - r_second (/ (std + eps) when norm_by_std), the others 0
//   reinforce_plus_plus           compute_reinforce_plus_plus_outcome_advantage (gamma 1): r, whitened; its
//                                 returns-to-go carry the reward (on the response's last token) back through
//                                 masked tokens, so a response whose last token is out of the loss (rejection
//                                 sampling) has return 0: the caller passes r = 0 for it
//   reinforce_plus_plus_baseline  compute_reinforce_plus_plus_baseline_outcome_advantage: r - group mean, whitened
// Whitened: over the step's batch, each response weighing its loss tokens (verl's masked_whiten over the
// response mask): (a - mean) / sqrt(var + 1e-8), var unbiased over the tokens.
typedef enum { ADV_GRPO, ADV_RLOO, ADV_OPO, ADV_GRPO_PASSK, ADV_REINFORCE_PP, ADV_REINFORCE_PP_BASELINE } AdvEstimator;

// One token's KL estimate, d = logp - ref, with its derivative w.r.t. logp in *dkl (may be NULL).
double kl_estimate(KlEstimator k, double logp, double ref, double *dkl);
// Returns 1 and sets *out for a known name (verl's aliases included), 0 otherwise.
int kl_estimator_parse(const char *s, KlEstimator *out);
// "token-mean" | "seq-mean-token-mean" | "seq-mean-token-sum-norm"; 0 when unknown.
int loss_agg_parse(const char *s, LossAgg *out);
const char *kl_estimator_name(KlEstimator k);
const char *loss_agg_name(LossAgg a);
// verl's names, as above ("vanilla", "gspo", ...; "grpo", "rloo", ...); 0 when unknown.
int policy_loss_parse(const char *s, PolicyLossMode *out);
const char *policy_loss_name(PolicyLossMode m);
int adv_estimator_parse(const char *s, AdvEstimator *out);

// r (n_groups*G) -> adv (n_groups*G); group g is r[g*G .. g*G+G). As verl's "grpo" estimator:
//   norm_by_std: adv = (r - mean) / (std + eps), std = torch.std (unbiased, divides by G-1);
//   else (Dr.GRPO): adv = r - mean.
// A group of one (G == 1) gets verl's mean 0 and std 1: adv = r / (1 + eps), or r.
// A flat group (all rewards equal) gets adv 0 either way. Computed in double; adv may alias r.
void grpo_advantages(const float *r, int64_t n_groups, int G, int norm_by_std, float eps, float *adv);

// 1 when the G rewards at r are all equal, so the group carries no learning signal and dynamic
// sampling (DAPO's filter_groups) drops it. Like verl's filter (keep if std > 0 or the group has one
// sample) a group of one is never flat. Equality is exact: np.std of equal non-dyadic values
// (e.g. three 0.1) can come out ~1e-17 and keep the group in verl; here such a group is flat.
int grpo_group_is_flat(const float *r, int G);

// Estimator e's advantages of n_groups groups of G rewards r into adv, as above; len (per response: its loss
// tokens) is read by opo. The whitened estimators leave the group part here (r, or r - mean) for
// advantages_whiten. Computed in double; norm_by_std and eps as grpo_advantages (grpo, grpo_passk).
void outcome_advantages(AdvEstimator e, const float *r, const double *len, int64_t n_groups, int G, int norm_by_std,
                        float eps, float *adv);
int adv_estimator_whitens(AdvEstimator e);
// masked_whiten's sums over n responses, each weighing len[i] tokens: pass 0 adds sum len to sum[0] and
// sum len a to sum[1]; pass 1 adds sum len (a - mean)^2 to sum[2], mean = sum[1] / (sum[0] + 1e-8). Ranks add
// up their sums of a pass before the next.
void advantages_whiten_sums(const float *adv, const double *len, int64_t n, int pass, double *sum);
// adv = (adv - mean) / sqrt(var + 1e-8) from those sums (mean = sum[1] / (sum[0] + 1e-8), var =
// sum[2] / (sum[0] + 1e-8) x sum[0] / (sum[0] - 1)). Returns 0, leaving adv, when fewer than 2 tokens count.
int advantages_whiten(float *adv, int64_t n, const double *sum);

typedef struct {
    PolicyLossMode mode;         // the policy term (above); what follows describes vanilla's
    double tau_pos, tau_neg;     // sapo's gate temperatures [1.0 / 1.05]
    double clip_low, clip_high;  // eps_low / eps_high [0.2 / 0.2]; clip-higher when high > low
    double clip_c;               // dual clip (verl clip_ratio_c, must be > 1) for A < 0; 0 = off
    double kl_coef;              // beta; 0 = no KL term in the loss (ref_logp may then be NULL)
    KlEstimator kl;
    LossAgg agg;
    double norm_len;             // seq-mean-token-sum-norm only: the constant divisor (max response length)
    double entropy_coeff;        // entropy bonus (verl entropy_coeff): loss -= entropy_coeff * agg(entropy); 0 = off
    double clip_cov_ratio, clip_cov_lb, clip_cov_ub;  // clip_cov [0.0002 / 1 / 5]
    double kl_cov_ratio, ppo_kl_coef;                 // kl_cov [0.0002 / 0.1]
    uint64_t cov_seed;           // clip_cov's random choice: the same seed, the same tokens
} GrpoLossConfig;

// Every field is this micro-batch's share of the mini-batch value (normalised by the totals passed
// to grpo_loss), so grpo_loss_stats_add over the micro-batches gives the mini-batch's values.
typedef struct {
    double loss;             // pg_loss + kl_coef * kl - entropy_coeff * entropy (the value grpo_loss returns)
    double pg_loss;          // aggregated clipped policy-gradient term
    double kl;               // aggregated KL estimate before kl_coef; 0 when ref_logp is NULL
    double entropy;          // aggregated policy entropy; 0 when entropy is NULL
    double clip_frac;        // tokens where the eps clip is active (verl pg_clipfrac) / n_tokens_total
    double clip_frac_lower;  // A < 0 tokens held by the dual clip (verl pg_clipfrac_lower) / n_tokens_total
    double ratio_min, ratio_max;  // over this micro-batch's tokens; +inf / -inf when it has none
    int64_t n_tokens;        // tokens in this micro-batch
} GrpoLossStats;

// Zero sums, ratio_min +inf, ratio_max -inf: the identity of grpo_loss_stats_add.
void grpo_loss_stats_init(GrpoLossStats *s);
void grpo_loss_stats_add(GrpoLossStats *acc, const GrpoLossStats *s);

// One micro-batch of B response sequences, tokens packed: sequence b is tokens
// seq_off[b] .. seq_off[b+1] of logp, old_logp, ref_logp and dlogp (response tokens only; the
// offsets are absolute, so a micro-batch may pass a pointer into the mini-batch's offset array).
// adv (B): one advantage per sequence. Per token (vanilla; the other modes above), with
// x = clamp(logp - old_logp, -20, 20):
//   ratio = e^x, pg = max(-A*ratio, -A*clamp(ratio, 1-clip_low, 1+clip_high)),
//   A < 0 and clip_c > 0: pg = min(pg, -A*clip_c);
//   loss_tok = pg + kl_coef * KL(logp, ref_logp) - entropy_coeff * entropy.
// KL and entropy aggregate by loss_agg_mode in every mode. The ratio range is of e^x (gspo: s; geo_mean: the
// sequence's exp(mean m)); clip_frac counts tokens whose clip holds (cispo: either side; geo_mean: A > 0,
// clip_frac_lower A < 0; sapo: none).
// Aggregation over the WHOLE mini-batch (pass its totals, the same for every micro-batch):
//   token-mean:              sum_tok loss_tok / n_tokens_total
//   seq-mean-token-mean:     sum_seq (sum_tok loss_tok / (len_seq + 1e-8)) / n_seqs_total   (verl's 1e-8)
//   seq-mean-token-sum-norm: sum_seq sum_tok loss_tok / (n_seqs_total * norm_len)
// n_tokens_total (the mini-batch's tokens) is needed in every mode: it is also the clip fractions'
// denominator. n_seqs_total counts sequences with at least one token (verl's default
// global_batch_size) and is used by the seq-mean modes only; empty
// sequences contribute nothing. Writes dlogp[i] = d(loss)/d(logp[i]): the exact derivative, 0 where
// a clamp or clip holds the value (torch's subgradient at ties), and, when dent is given,
// dent[i] = d(loss)/d(entropy[i]) = -entropy_coeff * (token i's aggregation weight); entropy (the
// policy's per-token entropy, may be NULL when entropy_coeff is 0) also feeds stats. As verl's
// dp_actor: policy_loss = pg_loss - entropy_coeff * agg_loss(entropy). Computed in double. Returns this
// micro-batch's share of the loss; stats may be NULL. Dies on inconsistent arguments.
// mask (verl's response_mask; NULL: every token counts): a token of mask 0 (a tool's, in multi-turn
// rollout) is no token at all here: no loss, KL or entropy, dlogp = dent = 0, not in len_seq, the ratio
// range, n_tokens or the clip counts; the totals passed count only mask-1 tokens (n_seqs_total: sequences
// with one).
// is_w (NULL: none): the rollout correction's per-token weights (verl's rollout_is_weights, constants): each
// token's policy term (and its gradient) is multiplied by its weight, geo_mean's a response's by the geometric
// mean of its tokens' (exp(mean log(w + 1e-10))); the KL and entropy terms are not.
double grpo_loss(const GrpoLossConfig *c, const float *logp, const float *old_logp, const float *ref_logp,
                 const float *entropy, const uint8_t *mask, const float *is_w, const float *adv, const int64_t *seq_off,
                 int B, double n_tokens_total, double n_seqs_total, float *dlogp, float *dent, GrpoLossStats *stats);
// verl's compute_rollout_correction_weights: the weights of tokens [t0, t1) of one response with old (the trainer's
// log-probs) and rollout (the rollout's), mask as grpo_loss's: token, w = exp(clamp(old - rollout, -20, 20));
// sequence, every token the same exp(clamp(sum of those, -20, 20)); then truncated at threshold (TIS).
void rollout_is_weights(int sequence, double threshold, const float *old, const float *rollout, const uint8_t *mask,
                        int64_t t0, int64_t t1, float *w);
// verl's rollout rejection sampling (rollout_corr_helper.py compute_rollout_rejection_mask, algorithm.rollout_
// correction.rollout_rs): with log r = clamp(old - rollout, -20, 20) per token, k1 = -log r, k2 = (log r)^2 / 2,
// k3 = r - 1 - log r; an option holds a token's own (token_kN), or a response's sum, mean or max of its tokens'
// (seq_sum_kN, seq_mean_kN, seq_max_k2/k3: every token of the response kept or rejected together). k1 options keep
// log lower <= k1 <= log upper, the others k <= upper. A token stays in the loss when every option keeps it.
typedef enum { RS_TOKEN, RS_SEQ_SUM, RS_SEQ_MEAN, RS_SEQ_MAX } RsLevel;
typedef struct {
    RsLevel level;
    int k;                // 1, 2 or 3
    double lower, upper;  // k1: both; else upper
} RsOption;
#define RS_MAX_OPTIONS 11
typedef struct {
    int n;
    RsOption opt[RS_MAX_OPTIONS];
} RolloutRs;
// rollout_rs: option names separated by commas (a repeated one counted once); thresholds: one entry for every
// option, or one per option in order, each a positive number, k1's "lower_upper" or an upper whose reciprocal is the
// lower (verl's _parse_rollout_rs_thresholds). Returns 1, or 0 with what is wrong in err.
int rollout_rs_parse(const char *rollout_rs, const char *thresholds, RolloutRs *rs, char *err, size_t err_size);
// Tokens [t0, t1) of one response: a token of mask 1 that an option rejects gets mask 0. Returns the tokens rejected.
int64_t rollout_rs_apply(const RolloutRs *rs, const float *old, const float *rollout, uint8_t *mask, int64_t t0,
                         int64_t t1);
