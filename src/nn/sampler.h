// Token sampling: greedy, temperature, min-p, top-k, top-p; one uniform draw per token from the
// sequence's own RNG, so a sequence's samples do not depend on what else is in the batch. Before it, a
// request's logits processing (sampler_process): penalties, biases, min_tokens.
#pragma once
#include <stdint.h>

#include "base/rng.h"

typedef struct {
    float temperature;  // 0: greedy (argmax, lowest id on ties)
    int top_k;          // 0: off
    float top_p;        // 1: off
    float min_p;        // 0: off; else tokens below min_p x the most likely one's probability are dropped
                        // (before top-k/top-p, as vLLM); the host sampler's (backends take min_p = 0)
} SamplerConfig;

// vLLM's logits processors, all off when zeroed.
typedef struct {
    float repetition_penalty;  // 0 or 1: off; each token of the prompt or output: logit / p if > 0, else x p
    float presence_penalty, frequency_penalty;  // each output token: logit -= frequency x count + presence
    const int32_t *bias_ids;  // logit_bias: logit[bias_ids[i]] += bias[i]
    const float *bias;
    int n_bias;
    int min_tokens;  // while the output is shorter, the stop ids are masked (-inf)
} LogitsProcessing;

// Whether p changes anything (then rows are processed and sampled on the host).
int sampler_processing(const LogitsProcessing *p);
// Applies p to a host row of logits (V) in place, in vLLM's order (min_tokens, logit_bias, penalties), for a
// sequence with this prompt and output so far. count: V zeroed counters of scratch (zeroed again on return).
void sampler_process(const LogitsProcessing *p, float *logits, const int32_t *prompt, int64_t n_prompt,
                     const int32_t *out, int64_t n_out, const int32_t *stop_ids, int n_stop, int32_t *count);

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
