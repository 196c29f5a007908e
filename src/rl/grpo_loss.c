// GRPO advantages and the clipped policy loss + KL with its gradient (see grpo_loss.h for the
// formulas and the verl sources they follow).
#include "rl/grpo_loss.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/util.h"

int kl_estimator_parse(const char *s, KlEstimator *out) {
    static const struct {
        const char *name;
        KlEstimator k;
    } names[] = {{"k1", KL_K1}, {"kl", KL_K1}, {"k2", KL_K2}, {"mse", KL_K2}, {"k3", KL_K3}, {"low_var_kl", KL_K3}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].k;
            return 1;
        }
    }
    return 0;
}

int loss_agg_parse(const char *s, LossAgg *out) {
    for (int a = AGG_TOKEN_MEAN; a <= AGG_SEQ_MEAN_TOKEN_SUM_NORM; a++) {
        if (strcmp(s, loss_agg_name((LossAgg)a)) == 0) {
            *out = (LossAgg)a;
            return 1;
        }
    }
    return 0;
}

static const char *const POLICY_LOSS_NAMES[] = {"vanilla", "gspo", "geo_mean", "cispo", "sapo", "clip_cov",
                                                "kl_cov"};
static const char *const ADV_NAMES[] = {"grpo", "rloo", "opo", "grpo_passk", "reinforce_plus_plus",
                                        "reinforce_plus_plus_baseline"};

static int name_index(const char *s, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0) return i;
    return -1;
}

int policy_loss_parse(const char *s, PolicyLossMode *out) {
    int i = name_index(s, POLICY_LOSS_NAMES, (int)(sizeof POLICY_LOSS_NAMES / sizeof *POLICY_LOSS_NAMES));
    if (i >= 0) *out = (PolicyLossMode)i;
    return i >= 0;
}

const char *policy_loss_name(PolicyLossMode m) {
    return POLICY_LOSS_NAMES[m];
}

int adv_estimator_parse(const char *s, AdvEstimator *out) {
    int i = name_index(s, ADV_NAMES, (int)(sizeof ADV_NAMES / sizeof *ADV_NAMES));
    if (i >= 0) *out = (AdvEstimator)i;
    return i >= 0;
}

const char *kl_estimator_name(KlEstimator k) {
    return k == KL_K1 ? "k1" : k == KL_K2 ? "k2" : "k3";
}

const char *loss_agg_name(LossAgg a) {
    return a == AGG_TOKEN_MEAN            ? "token-mean"
           : a == AGG_SEQ_MEAN_TOKEN_MEAN ? "seq-mean-token-mean"
                                          : "seq-mean-token-sum-norm";
}

void grpo_advantages(const float *r, int64_t n_groups, int G, int norm_by_std, float eps, float *adv) {
    for (int64_t g = 0; g < n_groups; g++) {
        const float *rg = r + g * G;
        // verl gives a lone sample mean 0 and std 1 (torch.std of one value would be NaN).
        double mean = 0.0, std = 1.0;
        if (G > 1) {
            for (int i = 0; i < G; i++) mean += rg[i];
            mean /= G;
            double ss = 0.0;
            for (int i = 0; i < G; i++) ss += (rg[i] - mean) * (rg[i] - mean);
            std = sqrt(ss / (G - 1));  // torch.std default: unbiased
        }
        float *ag = adv + g * G;
        for (int i = 0; i < G; i++) {
            double a = rg[i] - mean;
            ag[i] = (float)(norm_by_std ? a / (std + (double)eps) : a);
        }
    }
}

void outcome_advantages(AdvEstimator e, const float *r, const double *len, int64_t n_groups, int G, int norm_by_std,
                        float eps, float *adv) {
    if (e == ADV_GRPO) {
        grpo_advantages(r, n_groups, G, norm_by_std, eps, adv);
        return;
    }
    for (int64_t g = 0; g < n_groups; g++) {
        const float *rg = r + g * G;
        const double *lg = len + g * G;
        float *ag = adv + g * G;
        double mean = 0.0, lr = 0.0, l = 0.0;
        for (int i = 0; i < G; i++) mean += rg[i], lr += lg[i] * rg[i], l += lg[i];
        mean /= G;
        if (G == 1) mean = 0.0;  // verl: a lone response's baseline is 0
        double base = e == ADV_OPO ? (G > 1 && l > 0 ? lr / l : 0.0) : mean;
        if (e == ADV_GRPO_PASSK) {
            if (G < 2) die("grpo_passk needs groups of 2 responses or more (rollout.n), not %d", G);
            int best = 0;  // the first of the best (ties leave r_max - r_second = 0 anyway)
            for (int i = 1; i < G; i++) best = rg[i] > rg[best] ? i : best;
            double second = -INFINITY, ss = 0.0;
            for (int i = 0; i < G; i++) {
                if (i != best) second = rg[i] > second ? rg[i] : second;
                ss += (rg[i] - mean) * (rg[i] - mean);
            }
            double a = (double)rg[best] - second;
            if (norm_by_std) a /= sqrt(ss / (G - 1)) + (double)eps;
            for (int i = 0; i < G; i++) ag[i] = i == best ? (float)a : 0.0f;
            continue;
        }
        for (int i = 0; i < G; i++) {
            double a = e == ADV_REINFORCE_PP ? rg[i] : rg[i] - base;
            ag[i] = (float)(e == ADV_RLOO && G > 1 ? a * G / (G - 1) : a);
        }
    }
}

int adv_estimator_whitens(AdvEstimator e) {
    return e == ADV_REINFORCE_PP || e == ADV_REINFORCE_PP_BASELINE;
}

void advantages_whiten_sums(const float *adv, const double *len, int64_t n, int pass, double *sum) {
    double mean = pass ? sum[1] / (sum[0] + 1e-8) : 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (pass) {
            sum[2] += len[i] * (adv[i] - mean) * (adv[i] - mean);
        } else {
            sum[0] += len[i];
            sum[1] += len[i] * adv[i];
        }
    }
}

int advantages_whiten(float *adv, int64_t n, const double *sum) {
    if (sum[0] < 2.0) return 0;
    double mean = sum[1] / (sum[0] + 1e-8), var = sum[2] / (sum[0] + 1e-8) * (sum[0] / (sum[0] - 1.0));
    double scale = 1.0 / sqrt(var + 1e-8);
    for (int64_t i = 0; i < n; i++) adv[i] = (float)((adv[i] - mean) * scale);
    return 1;
}

int grpo_group_is_flat(const float *r, int G) {
    if (G < 2) return 0;
    for (int i = 1; i < G; i++)
        if (r[i] != r[0]) return 0;
    return 1;
}

void grpo_loss_stats_init(GrpoLossStats *s) {
    memset(s, 0, sizeof *s);
    s->ratio_min = INFINITY;
    s->ratio_max = -INFINITY;
}

void grpo_loss_stats_add(GrpoLossStats *acc, const GrpoLossStats *s) {
    acc->loss += s->loss;
    acc->pg_loss += s->pg_loss;
    acc->kl += s->kl;
    acc->entropy += s->entropy;
    acc->clip_frac += s->clip_frac;
    acc->clip_frac_lower += s->clip_frac_lower;
    acc->ratio_min = fmin(acc->ratio_min, s->ratio_min);
    acc->ratio_max = fmax(acc->ratio_max, s->ratio_max);
    acc->n_tokens += s->n_tokens;
}

static double clamp(double x, double lo, double hi) {
    return x < lo ? lo : x > hi ? hi : x;
}

// torch.maximum / torch.minimum backward at a tie: half the gradient to each side.
static double pick_grad(int first_wins, int tie, double g1, double g2) {
    return tie ? 0.5 * (g1 + g2) : first_wins ? g1 : g2;
}

// KL estimate of one token and its derivative w.r.t. logp (verl kl_penalty_forward; torch.clamp
// passes the gradient on the closed interval, so only strictly outside a bound is it 0).
double kl_estimate(KlEstimator k, double logp, double ref, double *dkl) {
    double d = logp - ref;
    switch (k) {
    case KL_K1:
        if (dkl) *dkl = 1.0;
        return d;
    case KL_K2:
        if (dkl) *dkl = d;
        return 0.5 * d * d;
    case KL_K3:
    default: {
        double t_raw = ref - logp, t = clamp(t_raw, -20.0, 20.0);  // "for numerical stability"
        double e = exp(t), v = e - t - 1.0;
        int live = t_raw >= -20.0 && t_raw <= 20.0 && v >= -10.0 && v <= 10.0;
        if (dkl) *dkl = live ? 1.0 - e : 0.0;  // d/dlogp of e^t - t - 1 with dt/dlogp = -1
        return clamp(v, -10.0, 10.0);
    }
    }
}

// One token's policy term in the token-level modes (all but geo_mean) and its derivative w.r.t. logp in *g:
// x_raw = logp - old (gspo: the sequence's mean of them), lp = logp. The ratio used goes to *ratio; tokens a
// clip holds count in n_clip, n_clip_lower.
static double token_pg(const GrpoLossConfig *c, double A, double x_raw, double lp, double *g, double *ratio,
                       int64_t *n_clip, int64_t *n_clip_lower) {
    const double lo = 1.0 - c->clip_low, hi = 1.0 + c->clip_high;
    // verl's log-ratio clamps: +-20, gspo's at most 10
    double x_lo = c->mode == PG_GSPO ? -INFINITY : -20.0, x_hi = c->mode == PG_GSPO ? 10.0 : 20.0;
    double x = clamp(x_raw, x_lo, x_hi), r = exp(x), dr = (x_raw >= x_lo && x_raw <= x_hi) ? r : 0.0;
    *ratio = r;
    if (c->mode == PG_CISPO) {  // the clipped ratio is a constant weight: logp alone carries the gradient
        double rc = clamp(r, lo, hi);
        *n_clip += rc != r;
        *g = -rc * A;
        return -rc * A * lp;
    }
    if (c->mode == PG_KL_COV) {  // no clip (the chosen tokens' penalty is grpo_loss's)
        *g = -A * dr;
        return -A * r;
    }
    if (c->mode == PG_SAPO) {  // sigmoid(tau (r - 1)) 4 / tau, whose derivative in r is 4 sig (1 - sig)
        double tau = A > 0.0 ? c->tau_pos : c->tau_neg, sig = 1.0 / (1.0 + exp(-tau * (r - 1.0)));
        *g = -A * 4.0 * sig * (1.0 - sig) * dr;
        return -A * sig * 4.0 / tau;
    }
    // PPO clip (compute_policy_loss_vanilla; gspo's with the sequence's ratio)
    double pg1 = -A * r, pg2 = -A * clamp(r, lo, hi);
    double g1 = -A * dr, g2 = (r >= lo && r <= hi) ? g1 : 0.0;
    double pg = pg1 > pg2 ? pg1 : pg2;
    *g = pick_grad(pg1 > pg2, pg1 == pg2, g1, g2);
    *n_clip += pg2 > pg1;
    if (c->clip_c > 0.0 && A < 0.0) {  // dual clip: the loss of a negative advantage is capped
        double pg3 = -A * c->clip_c;
        *n_clip_lower += pg > pg3;
        *g = pick_grad(pg < pg3, pg == pg3, *g, 0.0);
        pg = pg < pg3 ? pg : pg3;
    }
    return pg;
}

// geo_mean's per-token log-ratio m: x clamped to [-clip_low, clip_high] where that lowers A's objective, and
// dm/dx in *dm (torch.minimum's two equal sides at a tie add up to 1).
static double geo_m(const GrpoLossConfig *c, double A, double x, double *dm) {
    double xc = clamp(x, -c->clip_low, c->clip_high);
    *dm = A > 0.0 ? x <= c->clip_high : A < 0.0 ? x >= -c->clip_low : 0.0;
    return A > 0.0 ? fmin(x, xc) : A < 0.0 ? fmax(x, xc) : 0.0;
}

typedef struct {
    double cov;
    int64_t i;
} CovToken;

// Largest cov first, the earlier token first among equals.
static int cov_desc(const void *pa, const void *pb) {
    const CovToken *a = pa, *b = pb;
    if (a->cov != b->cov) return a->cov < b->cov ? 1 : -1;
    return (a->i > b->i) - (a->i < b->i);
}

// clip_cov's and kl_cov's choice of tokens among the loss tokens of seq_off[0] .. seq_off[B]: sel[i - seq_off[0]] = 1
// for a chosen one (grpo_loss.h). Returns how many.
static int64_t cov_select(const GrpoLossConfig *c, const float *logp, const float *old_logp, const uint8_t *mask,
                          const float *adv, const int64_t *seq_off, int B, uint8_t *sel) {
    int64_t t0 = seq_off[0], n = 0, n_cand = 0, chosen = 0;
    double sum_a = 0.0, sum_l = 0.0;
    for (int b = 0; b < B; b++)
        for (int64_t i = seq_off[b]; i < seq_off[b + 1]; i++) {
            sel[i - t0] = 0;
            if (mask && !mask[i]) continue;
            n++;
            sum_a += adv[b];
            sum_l += logp[i];
        }
    if (n == 0) return 0;
    double denom = c->mode == PG_CLIP_COV ? (double)n + 1e-8 : (double)n, mean_a = sum_a / denom, mean_l = sum_l / denom;
    CovToken *cand = xmalloc((size_t)n * sizeof *cand);
    for (int b = 0; b < B; b++)
        for (int64_t i = seq_off[b]; i < seq_off[b + 1]; i++) {
            if (mask && !mask[i]) continue;
            double cov = ((double)adv[b] - mean_a) * ((double)logp[i] - mean_l);
            if (c->mode == PG_CLIP_COV) {  // not held by the clip, cov inside the window
                double r = exp(clamp((double)logp[i] - (double)old_logp[i], -20.0, 20.0));
                double pg1 = -adv[b] * r, pg2 = -adv[b] * clamp(r, 1.0 - c->clip_low, 1.0 + c->clip_high);
                if (pg2 > pg1 || !(cov > c->clip_cov_lb && cov < c->clip_cov_ub)) continue;
            }
            cand[n_cand++] = (CovToken){cov, i};
        }
    double ratio = c->mode == PG_CLIP_COV ? c->clip_cov_ratio : c->kl_cov_ratio;
    double want = ratio * (double)n;  // verl's int(ratio * n), at least 1 (and at most n: a ratio may exceed 1)
    int64_t k = want >= (double)n ? n : want >= 1.0 ? (int64_t)want : 1;
    if (c->mode == PG_KL_COV) qsort(cand, (size_t)n_cand, sizeof *cand, cov_desc);
    Rng rng;
    rng_init(&rng, c->cov_seed);
    for (; chosen < k && chosen < n_cand; chosen++) {
        if (c->mode == PG_CLIP_COV) {  // a random one of those left (Fisher-Yates)
            int64_t j = chosen + (int64_t)(rng_next_u64(&rng) % (uint64_t)(n_cand - chosen));
            CovToken t = cand[j];
            cand[j] = cand[chosen];
            cand[chosen] = t;
        }
        sel[cand[chosen].i - t0] = 1;
    }
    free(cand);
    return chosen;
}

double grpo_loss(const GrpoLossConfig *c, const float *logp, const float *old_logp, const float *ref_logp,
                 const float *entropy, const uint8_t *mask, const float *is_w, const float *adv, const int64_t *seq_off,
                 int B, double n_tokens_total, double n_seqs_total, float *dlogp, float *dent, GrpoLossStats *stats) {
    if (c->kl_coef != 0.0 && !ref_logp) die("grpo_loss: kl_coef %g needs reference logprobs", c->kl_coef);
    if (c->entropy_coeff != 0.0 && (!entropy || !dent))
        die("grpo_loss: entropy_coeff %g needs entropies and a dent output", c->entropy_coeff);
    if (c->clip_c != 0.0 && !(c->clip_c > 1.0))
        die("grpo_loss: clip_ratio_c must be > 1 (or 0 = off), got %g", c->clip_c);
    if (c->clip_c != 0.0 && c->mode != PG_VANILLA) die("grpo_loss: clip_ratio_c is the vanilla loss's dual clip");
    if (c->mode == PG_SAPO && !(c->tau_pos > 0.0 && c->tau_neg > 0.0))
        die("grpo_loss: sapo needs positive tau_pos and tau_neg, got %g and %g", c->tau_pos, c->tau_neg);
    if (c->mode == PG_CLIP_COV && !(c->clip_cov_ratio > 0.0 && c->clip_cov_lb < c->clip_cov_ub))
        die("grpo_loss: clip_cov needs clip_cov_ratio > 0 and clip_cov_lb < clip_cov_ub, got %g, %g and %g",
            c->clip_cov_ratio, c->clip_cov_lb, c->clip_cov_ub);
    if (c->mode == PG_KL_COV && !(c->kl_cov_ratio > 0.0 && c->ppo_kl_coef >= 0.0))
        die("grpo_loss: kl_cov needs kl_cov_ratio > 0 and ppo_kl_coef >= 0, got %g and %g", c->kl_cov_ratio,
            c->ppo_kl_coef);
    if (c->agg == AGG_SEQ_MEAN_TOKEN_SUM_NORM && !(c->norm_len > 0.0))
        die("grpo_loss: seq-mean-token-sum-norm needs a positive normalising length, got %g", c->norm_len);
    // gspo and sapo aggregate their policy term seq-mean-token-mean, geo_mean a sequence's term over sequences
    int per_seq = c->mode == PG_GSPO || c->mode == PG_SAPO || c->mode == PG_GEO_MEAN;
    GrpoLossStats st;
    grpo_loss_stats_init(&st);
    double pg_sum = 0.0, kl_sum = 0.0, ent_sum = 0.0;
    int64_t n_clip = 0, n_clip_lower = 0, n_pp_clip = 0;  // n_pp_clip: PPO's clip under clip_cov, not reported
    int cov = c->mode == PG_CLIP_COV || c->mode == PG_KL_COV;
    uint8_t *sel = cov && B > 0 ? xmalloc((size_t)(seq_off[B] - seq_off[0] + 1)) : NULL;
    if (sel) n_clip = cov_select(c, logp, old_logp, mask, adv, seq_off, B, sel);
    for (int b = 0; b < B; b++) {
        int64_t t0 = seq_off[b], t1 = seq_off[b + 1];
        if (t1 < t0) die("grpo_loss: sequence %d has offsets %lld > %lld", b, (long long)t0, (long long)t1);
        int64_t len = 0;  // the sequence's tokens that count
        for (int64_t i = t0; i < t1; i++) {
            len += !mask || mask[i];
            if (mask && !mask[i]) dlogp[i] = 0.0f;
            if (mask && !mask[i] && dent) dent[i] = 0.0f;
        }
        if (len == 0) continue;  // fully masked: verl's seq_mask leaves it out
        // n_tokens_total is also the clip fractions' denominator, so every mode needs it.
        if (!(n_tokens_total > 0.0)) die("grpo_loss: n_tokens_total must be > 0, got %g", n_tokens_total);
        if ((c->agg != AGG_TOKEN_MEAN || per_seq) && !(n_seqs_total > 0.0))
            die("grpo_loss: %s needs n_seqs_total > 0, got %g", loss_agg_name(c->agg), n_seqs_total);
        // verl's (len + 1e-8), kept so float64 runs agree to rounding; in float32 it is len itself.
        const double seq_mean = 1.0 / (((double)len + 1e-8) * n_seqs_total);
        // Weight of each token of this sequence in the mini-batch loss (KL, entropy; the policy term: wp).
        double w = c->agg == AGG_TOKEN_MEAN            ? 1.0 / n_tokens_total
                   : c->agg == AGG_SEQ_MEAN_TOKEN_MEAN ? seq_mean
                                                       : 1.0 / (n_seqs_total * c->norm_len);
        double wp = c->mode == PG_GEO_MEAN ? 1.0 / n_seqs_total : per_seq ? seq_mean : w;
        const double A = adv[b];
        // gspo: the mean log-ratio (verl's seq_lengths); geo_mean: the mean m, its ratio and A
        double xs = 0.0, dm, ga = A * (double)len / ((double)len + 1e-8);
        for (int64_t i = t0; i < t1 && (c->mode == PG_GSPO || c->mode == PG_GEO_MEAN); i++) {
            if (mask && !mask[i]) continue;
            double x = (double)logp[i] - (double)old_logp[i];
            xs += c->mode == PG_GSPO ? x : geo_m(c, A, x, &dm);
        }
        xs /= c->mode == PG_GSPO ? (double)len : (double)len + 1e-8;
        double geo_ratio = exp(xs), geo_w = 0.0;
        for (int64_t i = t0; i < t1 && is_w && c->mode == PG_GEO_MEAN; i++)  // verl: the weights' geometric mean
            geo_w += mask && !mask[i] ? 0.0 : log((double)is_w[i] + 1e-10);
        geo_w = is_w ? exp(geo_w / ((double)len + 1e-8)) : 1.0;
        if (c->mode == PG_GEO_MEAN) pg_sum += wp * geo_w * -ga * geo_ratio;
        for (int64_t i = t0; i < t1; i++) {
            if (mask && !mask[i]) continue;
            double x = (double)logp[i] - (double)old_logp[i], g, ratio = geo_ratio;
            if (c->mode == PG_GEO_MEAN) {
                double xc = clamp(x, -c->clip_low, c->clip_high);
                geo_m(c, A, x, &dm);
                g = geo_w * -ga * geo_ratio * dm / ((double)len + 1e-8);
                n_clip += x != xc && A > 0.0;
                n_clip_lower += x != xc && A < 0.0;
            } else {
                double w_is = is_w ? (double)is_w[i] : 1.0;  // the rollout correction's weight (no gradient)
                double pg = token_pg(c, A, c->mode == PG_GSPO ? xs : x, logp[i], &g, &ratio,
                                     cov ? &n_pp_clip : &n_clip, &n_clip_lower);
                if (sel && sel[i - seq_off[0]] && c->mode == PG_CLIP_COV) pg = g = 0.0;
                if (sel && sel[i - seq_off[0]] && c->mode == PG_KL_COV) {  // d|x|/dx: torch's sign, 0 at 0
                    pg += c->ppo_kl_coef * fabs(x);
                    g += c->ppo_kl_coef * (double)((x > 0.0) - (x < 0.0));
                }
                pg_sum += wp * w_is * pg;
                g *= w_is;
            }
            double dkl = 0.0, kl = ref_logp ? kl_estimate(c->kl, logp[i], ref_logp[i], &dkl) : 0.0;
            kl_sum += w * kl;
            dlogp[i] = (float)(wp * g + w * c->kl_coef * dkl);
            if (entropy) ent_sum += w * entropy[i];
            if (dent) dent[i] = (float)(-w * c->entropy_coeff);
            st.ratio_min = fmin(st.ratio_min, ratio);
            st.ratio_max = fmax(st.ratio_max, ratio);
        }
        st.n_tokens += len;
    }
    st.pg_loss = pg_sum;
    st.kl = kl_sum;
    st.entropy = ent_sum;
    st.loss = pg_sum + c->kl_coef * kl_sum - c->entropy_coeff * ent_sum;
    if (st.n_tokens > 0) {
        st.clip_frac = (double)n_clip / n_tokens_total;
        st.clip_frac_lower = (double)n_clip_lower / n_tokens_total;
    }
    free(sel);
    if (stats) *stats = st;
    return st.loss;
}

void rollout_is_weights(int sequence, double threshold, const float *old, const float *rollout, const uint8_t *mask,
                        int64_t t0, int64_t t1, float *w) {
    double sum = 0.0;
    for (int64_t i = t0; i < t1; i++) sum += mask && !mask[i] ? 0.0 : (double)old[i] - (double)rollout[i];
    for (int64_t i = t0; i < t1; i++) {
        double x = sequence ? sum : (double)old[i] - (double)rollout[i];
        w[i] = mask && !mask[i] ? 0.0f : (float)fmin(exp(clamp(x, -20.0, 20.0)), threshold);
    }
}

static const char *const RS_NAMES[RS_MAX_OPTIONS] = {"token_k1",    "token_k2",    "token_k3",    "seq_sum_k1",
                                                     "seq_sum_k2",  "seq_sum_k3",  "seq_mean_k1", "seq_mean_k2",
                                                     "seq_mean_k3", "seq_max_k2",  "seq_max_k3"};
static const RsLevel RS_LEVELS[RS_MAX_OPTIONS] = {RS_TOKEN,    RS_TOKEN,    RS_TOKEN,    RS_SEQ_SUM,
                                                  RS_SEQ_SUM,  RS_SEQ_SUM,  RS_SEQ_MEAN, RS_SEQ_MEAN,
                                                  RS_SEQ_MEAN, RS_SEQ_MAX,  RS_SEQ_MAX};
static const int RS_K[RS_MAX_OPTIONS] = {1, 2, 3, 1, 2, 3, 1, 2, 3, 2, 3};

// The comma-separated parts of s, trimmed, empty ones skipped, into parts (up to max; returns how many there were,
// or -1 for a part over 63 bytes).
static int split_commas(const char *s, char parts[][64], int max) {
    int n = 0;
    for (const char *p = s; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        while (len && (*p == ' ' || *p == '\t')) p++, len--;
        while (len && (p[len - 1] == ' ' || p[len - 1] == '\t')) len--;
        if (len > 63) return -1;  // no entry is that long
        if (len && n < max) snprintf(parts[n], 64, "%.*s", (int)len, p);
        n += len > 0;
        p = e ? e + 1 : p + len;
        if (!e) break;
    }
    return n;
}

// A positive finite number, all of s.
static int positive(const char *s, double *v) {
    char *end;
    *v = strtod(s, &end);
    return end != s && !*end && isfinite(*v) && *v > 0;
}

// Writes the message into err; returns 0.
__attribute__((format(printf, 3, 4))) static int rs_error(char *err, size_t err_size, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_size, fmt, ap);
    va_end(ap);
    return 0;
}

int rollout_rs_parse(const char *rollout_rs, const char *thresholds, RolloutRs *rs, char *err, size_t err_size) {
    char names[RS_MAX_OPTIONS * 4][64], specs[RS_MAX_OPTIONS][64];
    memset(rs, 0, sizeof *rs);
    int n_names = split_commas(rollout_rs, names, RS_MAX_OPTIONS * 4), idx[RS_MAX_OPTIONS];
    if (n_names < 0) return rs_error(err, err_size, "an option name is over 63 characters");
    if (n_names == 0 || n_names > RS_MAX_OPTIONS * 4)
        return rs_error(err, err_size, "expected 1 to %d comma-separated options", RS_MAX_OPTIONS * 4);
    for (int i = 0; i < n_names; i++) {
        int o = 0, seen = 0;
        while (o < RS_MAX_OPTIONS && strcmp(names[i], RS_NAMES[o]) != 0) o++;
        if (o == RS_MAX_OPTIONS)
            return rs_error(err, err_size, "unknown option \"%s\" (token_k1/k2/k3, seq_sum_k1/k2/k3, "
                            "seq_mean_k1/k2/k3, seq_max_k2/k3)", names[i]);
        for (int j = 0; j < rs->n; j++) seen |= idx[j] == o;
        if (!seen) idx[rs->n++] = o;
    }
    int n_specs = split_commas(thresholds ? thresholds : "", specs, RS_MAX_OPTIONS);
    if (n_specs < 0) return rs_error(err, err_size, "rollout_rs_threshold: an entry is over 63 characters");
    if (n_specs != 1 && n_specs != rs->n)
        return rs_error(err, err_size, "rollout_rs_threshold needs one threshold for every option or one per option "
                        "(%d), not %d", rs->n, n_specs);
    for (int j = 0; j < rs->n; j++) {
        RsOption *o = &rs->opt[j];
        const char *spec = specs[n_specs == 1 ? 0 : j], *us = strchr(spec, '_');
        *o = (RsOption){.level = RS_LEVELS[idx[j]], .k = RS_K[idx[j]]};
        char lower[64] = "";
        if (us) snprintf(lower, sizeof lower, "%.*s", (int)(us - spec), spec);
        if (us && o->k != 1)
            return rs_error(err, err_size, "%s takes one upper bound, not \"%s\"", RS_NAMES[idx[j]], spec);
        if (!positive(us ? us + 1 : spec, &o->upper) || (us && !positive(lower, &o->lower)))
            return rs_error(err, err_size, "%s: \"%s\" is not %s", RS_NAMES[idx[j]], spec,
                            o->k == 1 ? "lower_upper or an upper bound, positive numbers" : "a positive number");
        if (o->k == 1 && !us) o->lower = 1.0 / o->upper;
        if (o->k == 1 && o->lower > o->upper)
            return rs_error(err, err_size, "%s: lower bound %g above upper bound %g", RS_NAMES[idx[j]], o->lower,
                            o->upper);
    }
    return 1;
}

// An option's test of its statistic (NaN fails).
static int rs_keeps(const RsOption *o, double v) {
    return o->k == 1 ? v >= log(o->lower) && v <= log(o->upper) : v <= o->upper;
}

static void rs_divergences(double old, double rollout, double k[4]) {
    double lr = clamp(old - rollout, -20.0, 20.0);
    k[1] = -lr, k[2] = 0.5 * lr * lr, k[3] = exp(lr) - 1.0 - lr;
}

int64_t rollout_rs_apply(const RolloutRs *rs, const float *old, const float *rollout, uint8_t *mask, int64_t t0,
                         int64_t t1) {
    double sum[4] = {0}, mx[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, k[4];
    int64_t n = 0, rejected = 0;
    for (int64_t t = t0; t < t1; t++) {
        if (!mask[t]) continue;
        rs_divergences(old[t], rollout[t], k);
        for (int j = 1; j <= 3; j++)  // the max propagates a NaN, as torch's
            sum[j] += k[j], mx[j] = k[j] > mx[j] || isnan(k[j]) ? k[j] : mx[j];
        n++;
    }
    int seq_keep = 1;
    for (int i = 0; i < rs->n && n; i++) {
        const RsOption *o = &rs->opt[i];
        if (o->level == RS_SEQ_SUM) seq_keep &= rs_keeps(o, sum[o->k]);
        if (o->level == RS_SEQ_MEAN) seq_keep &= rs_keeps(o, sum[o->k] / ((double)n + 1e-8));  // verl's masked_mean
        if (o->level == RS_SEQ_MAX) seq_keep &= rs_keeps(o, mx[o->k]);
    }
    for (int64_t t = t0; t < t1; t++) {
        if (!mask[t]) continue;
        int keep = seq_keep;
        rs_divergences(old[t], rollout[t], k);
        for (int i = 0; i < rs->n; i++)
            keep &= rs->opt[i].level != RS_TOKEN || rs_keeps(&rs->opt[i], k[rs->opt[i].k]);
        mask[t] = (uint8_t)keep;
        rejected += !keep;
    }
    return rejected;
}
