// Token sampling: greedy, temperature, top-k, top-p; one uniform draw per token from the
// sequence's own RNG, so a sequence's samples do not depend on what else is in the batch.
#pragma once
#include <stdint.h>

#include "base/rng.h"

typedef struct {
    float temperature;  // 0: greedy (argmax, lowest id on ties)
    int top_k;          // 0: off
    float top_p;        // 1: off
} SamplerConfig;

typedef struct {
    float *prob;    // (V)
    int32_t *idx;   // (V)
} SamplerScratch;

// The uniform draw in [0, 1) a token takes from its sequence's RNG (one per token when T > 0, none
// when greedy): drawn by the caller, so the sampler can run where the logits are.
double sampler_unit(Rng *rng);
// Samples from logits (V) with uniform draw u and returns the id; *logprob = log p(id) under
// softmax(logits / T) before top-k/top-p truncation (under softmax(logits) when greedy), which is the
// probability GRPO's importance ratio needs.
int32_t sampler_sample(const SamplerConfig *sc, const float *logits, int64_t V, double u, SamplerScratch *s,
                       float *logprob);
