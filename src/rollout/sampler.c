#define _GNU_SOURCE  // qsort_r
#include "rollout/sampler.h"

#include <math.h>
#include <stdlib.h>

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

static double next_unit(Rng *rng) { return (double)(rng_next_u64(rng) >> 11) * (1.0 / 9007199254740992.0); }

int32_t sampler_sample(const SamplerConfig *sc, const float *logits, int64_t V, Rng *rng, SamplerScratch *s,
                       float *logprob) {
    float T = sc->temperature > 0 ? sc->temperature : 1.0f, mx = logits[0];
    int64_t arg = 0;
    for (int64_t i = 1; i < V; i++)
        if (logits[i] > mx) mx = logits[i], arg = i;  // strict: the lowest id wins ties
    double sum = 0.0;
    for (int64_t i = 0; i < V; i++) sum += s->prob[i] = expf((logits[i] - mx) / T);
    double log_sum = log(sum);
    int32_t id;
    if (sc->temperature <= 0) {
        id = (int32_t)arg;
    } else if (sc->top_k <= 0 && sc->top_p >= 1.0f) {
        double u = next_unit(rng) * sum, c = 0.0;
        id = (int32_t)(V - 1);
        for (int64_t i = 0; i < V; i++)
            if ((c += s->prob[i]) > u) {
                id = (int32_t)i;
                break;
            }
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
        double u = next_unit(rng) * kept, c = 0.0;
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
