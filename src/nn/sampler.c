#define _GNU_SOURCE  // qsort_r
#include "nn/sampler.h"

#include <math.h>
#include <stdlib.h>

#include "base/vmath.h"

// Candidates in descending probability, ties by ascending id, so truncation is deterministic.
static int before(const float *prob, int32_t x, int32_t y) { return prob[x] > prob[y] || (prob[x] == prob[y] && x < y); }

static int by_prob_desc(const void *a, const void *b, void *prob) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return before(prob, x, y) ? -1 : before(prob, y, x);
}

// The k best ids into idx[0..k) (unordered): a heap whose root is the worst kept candidate.
static int64_t top_k_ids(const float *prob, int64_t V, int64_t k, int32_t *idx) {
    int64_t n = 0;
    for (int32_t id = 0; id < V; id++) {
        if (n == k && !before(prob, id, idx[0])) continue;
        int64_t i;
        if (n < k) {  // sift up
            for (i = n++; i > 0 && before(prob, idx[(i - 1) / 2], id); i = (i - 1) / 2) idx[i] = idx[(i - 1) / 2];
        } else {  // replace the root, sift down
            for (i = 0;;) {
                int64_t c = 2 * i + 1;
                if (c >= n) break;
                if (c + 1 < n && before(prob, idx[c], idx[c + 1])) c++;
                if (!before(prob, id, idx[c])) break;
                idx[i] = idx[c];
                i = c;
            }
        }
        idx[i] = id;
    }
    return n;
}

double sampler_unit(Rng *rng) { return (double)(rng_next_u64(rng) >> 11) * (1.0 / 9007199254740992.0); }

// The first i whose running sum of prob[0..i] passes u: a block's sum decides whether the draw falls in
// it, then the block is walked one by one (its last nonzero entry if rounding keeps the walk below u).
static int64_t draw(const float *prob, int64_t V, double u) {
    enum { BLOCK = 256 };
    double c = 0.0;
    for (int64_t b = 0; b < V; b += BLOCK) {
        int64_t n = V - b < BLOCK ? V - b : BLOCK;
        float lane[VMATH_LANES] = {0};
        int64_t i = 0;
        for (; i + VMATH_LANES <= n; i += VMATH_LANES)
            for (int l = 0; l < VMATH_LANES; l++) lane[l] += prob[b + i + l];
        for (int l = 0; i + l < n; l++) lane[l] += prob[b + i + l];
        double bs = 0.0;
        for (int l = 0; l < VMATH_LANES; l++) bs += lane[l];
        if (c + bs <= u && b + n < V) {
            c += bs;
            continue;
        }
        int64_t last = b + n - 1;
        for (i = 0; i < n; i++) {
            if (prob[b + i] > 0.0f) last = b + i;
            if ((c += prob[b + i]) > u) return b + i;
        }
        return last;
    }
    return V - 1;
}

int32_t sampler_sample(const SamplerConfig *sc, const float *logits, int64_t V, double u, SamplerScratch *s,
                       float *logprob) {
    float T = sc->temperature > 0 ? sc->temperature : 1.0f, mx = row_max(logits, V);
    int64_t arg = 0;
    while (arg + 1 < V && logits[arg] != mx) arg++;  // the lowest id wins ties
    double sum = row_exp_sum(s->prob, logits, V, mx, 1.0f / T);
    double log_sum = log(sum);
    if (sc->min_p > 0 && sc->temperature > 0) {  // the most likely token has prob 1 here (exp of 0)
        sum = 0.0;
        for (int64_t i = 0; i < V; i++) {
            if (s->prob[i] < sc->min_p) s->prob[i] = 0.0f;
            sum += s->prob[i];
        }
    }
    int32_t id;
    if (sc->temperature <= 0) {
        id = (int32_t)arg;
    } else if (sc->top_k <= 0 && sc->top_p >= 1.0f) {
        id = (int32_t)draw(s->prob, V, u * sum);
    } else {
        int64_t n = 0;
        if (sc->top_k > 0) {
            n = top_k_ids(s->prob, V, sc->top_k < V ? sc->top_k : V, s->idx);
        } else {
            // For top-p alone, tokens below (1 - p) * sum / V together hold less than 1 - p of
            // the mass, so the nucleus lies among the others: only those need sorting.
            float cut = (float)((1.0 - sc->top_p) * sum / (double)V);
            for (int64_t i = 0; i < V; i++)
                if (s->prob[i] >= cut) s->idx[n++] = (int32_t)i;
        }
        qsort_r(s->idx, (size_t)n, sizeof *s->idx, by_prob_desc, s->prob);
        double kept = 0.0;
        for (int64_t k = 0; k < n; k++) kept += s->prob[s->idx[k]];
        if (sc->top_p < 1.0f) {  // the smallest prefix holding top_p of the (top-k) mass, as HF and vLLM
            double want = sc->top_p * (sc->top_k > 0 ? kept : sum);
            int64_t k = 0;
            for (kept = 0.0; k < n && kept < want;) kept += s->prob[s->idx[k++]];
            n = k;
        }
        double c = 0.0;
        u *= kept;
        id = s->idx[n - 1];
        for (int64_t k = 0; k < n; k++)
            if ((c += s->prob[s->idx[k]]) > u) {
                id = s->idx[k];
                break;
            }
    }
    *logprob = (float)((double)(logits[id] - mx) / T - log_sum);
    return id;
}

int sampler_processing(const LogitsProcessing *p) {
    return (p->repetition_penalty > 0 && p->repetition_penalty != 1) || p->presence_penalty != 0 ||
           p->frequency_penalty != 0 || p->n_bias > 0 || p->min_tokens > 0;
}

// A token's logit under the repetition penalty (HF's and vLLM's: divided when positive, else multiplied).
static float repeated(float logit, float penalty) { return logit > 0 ? logit / penalty : logit * penalty; }

void sampler_process(const LogitsProcessing *p, float *logits, const int32_t *prompt, int64_t n_prompt,
                     const int32_t *out, int64_t n_out, const int32_t *stop_ids, int n_stop, int32_t *count) {
    if (n_out < p->min_tokens)
        for (int i = 0; i < n_stop; i++) logits[stop_ids[i]] = -INFINITY;
    for (int i = 0; i < p->n_bias; i++) logits[p->bias_ids[i]] += p->bias[i];
    if (p->repetition_penalty > 0 && p->repetition_penalty != 1) {  // each distinct token once
        for (int64_t i = 0; i < n_prompt + n_out; i++) {
            int32_t id = i < n_prompt ? prompt[i] : out[i - n_prompt];
            if (!count[id]) logits[id] = repeated(logits[id], p->repetition_penalty);
            count[id] = 1;
        }
        for (int64_t i = 0; i < n_prompt + n_out; i++) count[i < n_prompt ? prompt[i] : out[i - n_prompt]] = 0;
    }
    if (p->presence_penalty == 0 && p->frequency_penalty == 0) return;
    for (int64_t i = 0; i < n_out; i++) count[out[i]]++;
    for (int64_t i = 0; i < n_out; i++) {  // each distinct output token once, then its count is cleared
        int32_t c = count[out[i]];
        if (c) logits[out[i]] -= p->frequency_penalty * (float)c + p->presence_penalty;
        count[out[i]] = 0;
    }
}
