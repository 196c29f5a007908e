// The OpenAI API of grpo serve: a request body parsed and checked into a Job (its prompts tokenized), and
// a Job's results written as OpenAI's JSON: the whole response, or its stream's chunks.
// /v1/completions: prompt (text, ids, or a list of either), echo, logprobs (N top), stop, n, seed, ...
// /v1/chat/completions: messages through the chat template (tools listed by it; hermes <tool_call> blocks
// come back as tool_calls), logprobs + top_logprobs. Both: stream (+ stream_options.include_usage), and
// vLLM's return_token_ids (prompt_token_ids, and each choice's token_ids).
#pragma once
#include <stdint.h>
#include <stdio.h>

#include "base/util.h"
#include "model/vl.h"
#include "rollout/rollout.h"
#include "text/tokenizer.h"

#define API_TOP_MAX 20  // top_logprobs at most (OpenAI's cap)

typedef struct {
    int32_t id[API_TOP_MAX];
    float lp[API_TOP_MAX];
} ApiTop;

// One choice: a sample and what it has sent so far when streaming.
typedef struct {
    RolloutSample *s;
    ApiTop *tops;  // with logprobs: per generated token, its row's top tokens
    int n_tops, cap_tops;
    size_t sent_bytes;   // stream: text bytes sent
    int sent_tokens;     // stream: tokens whose log-probs were sent
    int sent_calls;      // stream: tool calls sent (each as one tool_calls delta once its block is complete)
    int started, ended;  // stream: the opening (chat: role) and the final chunk were sent
    int prompt_sent;     // stream with return_token_ids: its prompt's ids were sent (in its first chunk)
} ApiChoice;

typedef struct {
    // the request
    int chat;
    int n_prompts, n;  // choices: n per prompt, n_prompts * n in all
    IdList *prompts;
    int max_tokens;     // as asked (0: none generated; the engine still samples one, which is dropped)
    RolloutConfig cfg;  // sampler, logits processing, seed, stops
    char **stop;
    char **choice;      // guided_choice's strings (cfg.choices)
    RegexDfa regex;     // guided_regex's automaton (cfg.regex)
    int32_t *stop_ids;  // the model's stop ids (but with ignore_eos) and the request's stop_token_ids
    int32_t *bias_ids;  // logit_bias
    float *bias;
    int logprobs;  // top log-probs per token (0: only the token's), -1: none
    int echo;      // completions: the prompt's text (and log-probs) before the output
    int stream, include_usage, return_token_ids;
    int tools;  // chat with tools: tool calls are parsed
    int reasoning;  // chat with --reasoning-parser qwen3: <think>...</think> is reasoning_content
    int has_seed;
    uint64_t seed;
    VlImage *images;           // chat with a vision-language model: the messages' images (data: URLs), in order
    int n_images;
    float *image_feats;        // their features (api_job_images)
    DecoderVlInputs image_in;  // the prompt's image inputs from them (its RolloutPrompt.vl)
    JsonSchema *schema;      // response_format json_schema or guided_json (cfg.json_schema), or NULL
    int json_any;            // the schema is json_object's: any object
    const char *json_field;  // the field that asked for JSON (response_format or guided_json), or NULL
    // the work
    RolloutPrompt *rp;
    RolloutRequest *rr;      // one per prompt
    RolloutSample *samples;  // the engine's out: choice i is samples[i] (prompt i / n, sample i % n)
    ApiChoice *choices;
    float **prompt_lp;  // echo + logprobs: per prompt, log p of tokens 1..n-1 and their tops
    ApiTop **prompt_tops;
    char id[40];
    int64_t created;
    int64_t vocab;
} ApiJob;

typedef struct {
    int status;         // HTTP status
    const char *param;  // the field at fault (static, or own_param), or NULL
    char own_param[64];  // a field named by the request (an unknown one)
    char *message;      // malloc'd
} ApiError;

typedef struct {
    const char *model_name;
    int64_t max_len;       // prompt + max_tokens at most
    int max_n, max_batch;  // n at most; prompts x n at most
    int64_t kv_positions;  // the KV cache's budget: prompts x n x (prompt + max_tokens) at most (0: none)
    int32_t *stop_ids;
    int n_stop_ids;
    int reasoning;  // --reasoning-parser qwen3
    const Decoder *model;  // the model served
    const VlModel *vl;     // a vision-language model's tower and processor (chat takes data: URL images), or NULL
} ApiLimits;

// Parses body[0..n) into job (the caller api_job_free's it, also on error). Returns 0, or -1 with *err.
int api_parse(ApiJob *job, int chat, const char *body, size_t n, Tokenizer *tok, const ApiLimits *lim,
              int64_t vocab, ApiError *err);
void api_job_free(ApiJob *job);
// A parsed job's images decoded whole (the parse read their headers only): 0, or -1 with err (400: the image that
// is corrupt). Outside the parse's lock: a large image takes a while.
int api_job_check_images(ApiJob *job, const ApiLimits *lim, ApiError *err);
// A checked job's images through the vision tower into its prompt's image inputs (their bytes freed after).
// Nothing for a job without images.
void api_job_images(ApiJob *job, const ApiLimits *lim);
// The KV positions a parsed job's sequences may fill: each its prompt and max_tokens.
int64_t api_job_kv_positions(const ApiJob *job);
// The engine's RolloutLogitsFn for a job's requests (user: the job).
void api_logits(void *user, int prompt, int sample, int64_t row0, int64_t rows, const float *logits);
// The whole response (non-streaming) as a malloc'd string.
char *api_response(const ApiJob *job, const Tokenizer *tok, const char *model);
// Appends to out the stream's chunks for what the job's choices made since the last call (final: every
// choice has finished; then also the usage chunk when asked, and "data: [DONE]").
void api_stream(ApiJob *job, const Tokenizer *tok, const char *model, int final, Buf *out);
// vLLM's /tokenize ({"prompt": text} or {"messages": [...]}: {"count", "max_model_len", "tokens"}) and
// /detokenize ({"tokens": [...]}: {"prompt": text}): the response body, or NULL with *err.
char *api_tokenize(const char *body, size_t n, Tokenizer *tok, const ApiLimits *lim, int64_t vocab, ApiError *err);
char *api_detokenize(const char *body, size_t n, const Tokenizer *tok, const ApiLimits *lim, int64_t vocab,
                     ApiError *err);
// An OpenAI error object for err.
char *api_error_body(const ApiError *err);
