// A generative judge in the loop (reward.judge): a causal LM (any model grpo runs; the policy's own directory
// is its initial weights, the reference) reads a rubric with the prompt, the response and the answer put in,
// as a user turn of its own chat template (as generative reward models are run: verl's GenRM recipes, TRL's
// judges), answers greedily through the rollout engine, and the last match of a regex in its answer is the
// score. An answer without one, or a rubric too long for max_length, is a failure: it scores failure_score
// and is counted. Frozen, on the CPU, in the dtype asked for.
#pragma once
#include <stdint.h>

#include "base/arena.h"
#include "model/decoder.h"
#include "text/tokenizer.h"

// The defaults of reward.judge.rubric and reward.judge.regex.
#define REWARD_JUDGE_RUBRIC                                                                                         \
    "Rate how well the response answers the question, from 0 (wrong) to 10 (fully correct).\n\nQuestion: "     \
    "{prompt}\n\nReference answer: {answer}\n\nResponse: {response}\n\nReply with \"Score: N\" and nothing else."
#define REWARD_JUDGE_REGEX "Score:\\s*([-+]?[0-9]*\\.?[0-9]+)"

typedef struct {
    const char *model_path, *rubric, *regex;  // rubric: {prompt}, {response}, {answer} are replaced
    DType dtype;
    int64_t max_length;   // rubric tokens + max_new_tokens a judgement may take (cut to the judge's positions
    int length_asked;     // unless the user asked for it: reward_length_limit)
    int64_t max_new_tokens, max_batch;  // the answer's tokens; judgements a wave
    double failure_score;
} RewardJudgeConfig;

typedef struct {
    RewardJudgeConfig cfg;
    Decoder m;
    Tokenizer tok;
    Arena arena;        // the rollout engine's KV cache and activations
    void *re, *match;   // pcre2_code, pcre2_match_data
    int32_t stop_ids[16];
    int n_stop;
} RewardJudge;

// Bytes the plan counts: the weights in dtype and the rollout workspace.
size_t reward_judge_bytes(const DecoderConfig *c, const RewardJudgeConfig *cfg);
// Loads cfg->model_path (a causal LM with its tokenizer; its chat template when it has one) and compiles the
// regex (its first group is the score, else the whole match); dies in one line naming what is wrong. The strings
// of cfg must outlive j.
void reward_judge_load(RewardJudge *j, const RewardJudgeConfig *cfg);
void reward_judge_free(RewardJudge *j);
// The judge's scores of n responses (prompt[i], response[i], answer[i]) into scores. Returns the failures.
int64_t reward_judge_score(RewardJudge *j, int64_t n, const char *const *prompt, const char *const *response,
                           const char *const *answer, float *scores);
