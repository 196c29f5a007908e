// A reward model in the loop (reward.reward_model): a sequence-classification checkpoint (a
// ...ForSequenceClassification of the architecture table: Qwen2, Qwen3, Llama, Mistral; one label) scores each
// response as verl's reward loop does (verl-project/verl 1dda039b, verl/experimental/reward_loop/reward_loop.py,
// _preprocess_reward_inputs and compute_score_disrm): the conversation, the response as the assistant's turn,
// rendered by the reward model's own chat template without a generation prompt, a leading bos_token removed,
// tokenized by its own tokenizer; the score head's raw value at the last token (vLLM's classify with
// use_activation false). Unlike verl, which decodes the whole response (tool turns, text past a stop string) into
// one assistant message, the caller gives a multi-turn response as its assistant and tool turns and the text up to
// a stop string. Frozen, on the CPU, in the dtype asked for.
#pragma once
#include <stdint.h>

#include "base/arena.h"
#include "model/decoder.h"
#include "text/tokenizer.h"

typedef struct {
    Decoder m;
    Tokenizer tok;
    Arena arena;
    DecoderActs acts;
    int64_t max_length;  // tokens a conversation; a longer one keeps its last max_length (the score's token)
    int64_t max_batch;   // conversations a forward
    int32_t *tokens;     // (max_batch * max_length)
    int64_t *seq_off;    // (max_batch + 1)
    float *out;          // (max_batch)
    char *dir;
} RewardModel;

// The tokens a conversation may take in a model of max_pos positions: want, where the user asked for it (else
// dies naming key and dir when it is too many), or the default want cut to max_pos.
int64_t reward_length_limit(int64_t want, int asked, int64_t max_pos, const char *key, const char *dir);
// Bytes the plan counts: the weights in dtype and the forward's workspace (max_length, asked as for the load).
size_t reward_model_bytes(const DecoderConfig *c, const char *dir, DType dtype, int64_t max_length, int asked,
                          int64_t max_batch);
// Loads DIR (config.json, safetensors, tokenizer.json, tokenizer_config.json with its chat template); dies in
// one line naming what is missing or wrong. max_length (asked: the user's, else the default) is cut or refused
// by reward_length_limit.
void reward_model_load(RewardModel *rm, const char *dir, DType dtype, int64_t max_length, int asked, int64_t max_batch);
void reward_model_free(RewardModel *rm);
// Scores n conversations (msgs[i]: a JSON array of {"role", "content"} ending with the response's assistant
// turn) into scores[i]. Returns how many were longer than max_length (cut on the left). Dies naming the
// reward model on a template error or a score that is not finite.
int64_t reward_model_score(RewardModel *rm, int64_t n, const char *const *msgs, float *scores);
