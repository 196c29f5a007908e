// The generation engine GRPO's rollout phase calls: prompts x G samples, batched decode over a
// KV cache, on the policy's own weight buffers (no copy).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "base/arena.h"
#include "model/decoder.h"
#include "nn/sampler.h"
#include "rollout/json_schema.h"
#include "rollout/mask_cache.h"
#include "rollout/regex_dfa.h"
#include "text/tokenizer.h"

#define ROLLOUT_PREFILL 2048  // tokens per prefill forward pass, a good default
#define ROLLOUT_PREFIX_BLOCK 16  // prefix caching reuses a cached prompt prefix in blocks of this many tokens

// Multi-turn rollout with tools. A sample whose model text ends in "</tool_call>" while it has turns left
// pauses; after the step, the hook gets every sample that paused there (so their tools run side by side)
// and gives each the tokens of its tool turn (the close of the assistant turn, the tool response as a
// user turn, the next assistant prompt), or none to end the sample (FINISH_STOP). Those tokens join the
// same sequence and KV cache, the earlier tokens untouched, one per decode step beside the other
// sequences; then sampling resumes. They carry mask 0 and log-prob 0 and count toward max_new_tokens.
typedef struct {
    int prompt, sample;
    const char *text;  // the model's text of this turn (from the end of the last tool turn), ends in </tool_call>
    size_t n;
    IdList append;     // the hook's answer (rollout frees it)
    char *content;     // and what the tool said, for the sample's record (malloc'd, rollout keeps it; may be NULL)
} RolloutToolTurn;
typedef void (*RolloutToolFn)(void *user, RolloutToolTurn *turns, int n);

typedef struct {
    SamplerConfig sampler;
    LogitsProcessing proc;  // penalties, biases, min_tokens (a row with any: processed and sampled on the host,
                            // and logits_fn sees the processed row); min_tokens also holds off stop strings
    int include_stop_str;   // a stop string's text stays in the sample's text (text_end after it)
    int skip_special;       // special tokens (added ones marked so) add nothing to the text (skip_special_tokens)
    int end_at_tool_call;   // the output ends after a </tool_call> (grpo serve with tools: the client calls it)
    int json_object;        // the output is kept one JSON object, closed within max_new_tokens (json_mask.h;
                            // needs a tokenizer and stop ids; sampled on the host)
    const JsonSchema *json_schema;  // the object's schema (with json_object; {"type": "object"}: any)
    const char *const *choices;  // guided_choice: the output is one of these, then a stop id (choice_mask;
    int n_choices;               // needs a tokenizer and stop ids; sampled on the host)
    const RegexDfa *regex;       // guided_regex: the output is a full match, then a stop id (regex_mask; as above)
    MaskCache *mask_cache;       // json_object's or regex's masks per state (mask_cache.h; its own), or NULL
    uint64_t seed;
    const int64_t *seed_index;  // prompt i is seeded as prompt seed_index[i] of the batch (NULL: i), so
                                // one rank's share of a batch samples what one process would
    const int32_t *stop_ids;  // end the sample (the id is kept as its last token)
    int n_stop_ids;
    const char *const *stop_strings;  // end the sample once its text contains one (needs a tokenizer)
    int n_stop_strings;
    size_t kv_budget_bytes;  // KV cache memory; prompts beyond it run in later waves
    Arena *workspace;        // if set: KV cache, activations and logits all come from it (reset on
                             // entry), as many sequences per wave as fit; kv_budget_bytes is unused
    int share_prefill;       // prefill each prompt once and copy its cache to its G samples
    int64_t prefill_tokens;  // tokens per prefill forward pass
    int max_turns;           // tool turns a sample may take (0: single-turn, no tool_fn needed)
    RolloutToolFn tool_fn;   // needs a tokenizer
    void *tool_user;
} RolloutConfig;

typedef struct {
    const int32_t *ids;
    int64_t n;
    const DecoderVlInputs *vl;  // a vision-language prompt's image inputs (decoder_vl_inputs of it alone), or NULL;
                              // generated tokens rotate at their index + vl->delta[0]
    int max_new_tokens;
    int has_seed;  // sample j of this prompt is seeded by (seed, j) instead of (config seed, index, j)
    uint64_t seed;
} RolloutPrompt;

typedef enum { FINISH_LENGTH, FINISH_STOP } FinishReason;

typedef struct {
    int32_t *tokens;  // generated ids only (with tools: and the tool turns' ids)
    float *logprobs;  // log p of each under softmax(logits / T), before top-k/top-p (0 for tool tokens)
    uint8_t *mask;    // with max_turns > 0: 1 for the model's tokens, 0 for the tool turns' (else NULL)
    int n;
    FinishReason finish;
    Buf text;          // raw bytes of the generated tokens but a final stop token (with a tokenizer)
    int64_t text_end;  // bytes of `text` before a stop string, or text.len
    int64_t turn_start;  // bytes of `text` before the model's last turn (0 without tool turns)
    int turns;         // tool turns taken
    int64_t *turn_end, *next_start;  // with max_turns > 0, per tool turn k: the model's turn ended at byte
                                     // turn_end[k] of text, its next began at next_start[k] (-1: the
                                     // budget ran out inside the tool turn, and text_end is turn_end[k])
    char **tool_content;             // and what the tool said (NULL where the hook gave nothing)
    int done;                        // finished (or cancelled): it takes no more tokens
} RolloutSample;

// Called after every token, for streaming output; may be NULL.
typedef void (*RolloutTokenFn)(void *user, int prompt, int sample, int32_t token);

typedef struct {
    double prefill_seconds, decode_seconds;
    int64_t prompt_tokens, generated_tokens;
    size_t kv_bytes, kv_bytes_per_token;
    int64_t cached_tokens;  // prompt tokens not prefilled: their keys and values came from the cache
    int64_t step_rows;      // rows the last engine step forwarded (prompt and decode rows)
    int waves;
} RolloutStats;

// The workspace rollout_generate needs for n_slots sequences of slot_len tokens (KV cache, decode
// and prefill activations, logits), prefilling up to prefill_rows tokens per forward pass, for weights of dtype.
size_t rollout_workspace_bytes(const Backend *be, const DecoderConfig *c, DType dtype, int64_t n_slots, int64_t slot_len,
                               int64_t prefill_rows);

// ---------------------------------------------------------------------------------------------
// The engine as a step API: requests join and leave between steps (continuous batching, grpo serve);
// rollout_generate runs its waves on it. Sequences live in KV cache slots of slot_len positions each.

// With want_prompt_logits: rows [row0, row0 + rows) of the prompt's logits (row i predicts token i + 1),
// sample -1; with want_logits: the row each of sample's tokens was sampled from (row0 0, rows 1, before
// the token is recorded; not for tool-turn tokens). Host memory, (rows, V), valid during the call.
typedef void (*RolloutLogitsFn)(void *user, int prompt, int sample, int64_t row0, int64_t rows, const float *logits);

typedef struct {
    const RolloutConfig *cfg;  // sampling, seed, stops, tools (its workspace, budget and prefill_tokens unused)
    const RolloutPrompt *prompt;
    int index;  // the prompt's index: seeds its samples (cfg->seed_index[index], or index), names it to the fns
    int n;      // samples
    RolloutSample *out;  // (n): filled as tokens come; out[j].n grows by one per step
    RolloutTokenFn fn;   // may be NULL
    RolloutLogitsFn logits_fn;  // may be NULL
    int want_logits, want_prompt_logits;
    void *user;
    int running;     // samples not yet finished (the engine's)
    int64_t cached;  // its prompt's tokens whose keys and values came from the cache (the engine's)
} RolloutRequest;

typedef struct RolloutEngine RolloutEngine;

// KV cache for n_slots sequences of slot_len positions, prefill passes of up to prefill_rows tokens, in
// `workspace` (reset; rollout_workspace_bytes of them) or its own memory when NULL.
RolloutEngine *rollout_engine_new(const Decoder *m, const Tokenizer *tok, int n_slots, int64_t slot_len,
                                  int64_t prefill_rows, Arena *workspace);
void rollout_engine_free(RolloutEngine *e);
int rollout_engine_free_slots(const RolloutEngine *e);
const RolloutStats *rollout_engine_stats(const RolloutEngine *e);
// Starts r's n samples (prefilled at the next step; with chunked prefill, over the next steps). Returns -1
// (nothing started) when fewer than n slots are free, the prompt is empty, longer than prefill_rows, or with its
// new tokens longer than slot_len, or n of those exceed rollout_engine_kv_room.
int rollout_engine_add(RolloutEngine *e, RolloutRequest *r);
// KV memory. Without a workspace, the engine's KV cache is on the CPU committed as sequences write it, and a slot
// gives its memory back when its sequence ends (with prefix caching: past what its cache keeps). The budget
// (default: every slot's slot_len) bounds the positions the running sequences may fill, each its prompt and
// max_new_tokens, and with prefix caching what the free slots' caches hold: a request is added only while its n
// sequences fit beside the running ones (rollout_engine_kv_room), and free caches, the least recently used first,
// are given back to stay within it.
void rollout_engine_kv_budget(RolloutEngine *e, int64_t positions);
int64_t rollout_engine_kv_room(const RolloutEngine *e);
// Prefix caching (off at first): a new prompt that begins with tokens a slot's cache holds (a running sequence's
// prompt and tokens so far, or a finished one's, kept until its slot is taken: an empty slot first, then the one
// the prompt matches, then the least recently used) takes those positions' keys and values (in whole
// ROLLOUT_PREFIX_BLOCKs, copied unless the slot becomes its own)
// and prefills only the rest (decoder_extend). Text prompts whose prompt logits nobody wants; a prompt that one
// added in the same step would give more waits for that one's forward within the step. Set before adding
// requests (turning it on forgets what the slots held).
void rollout_engine_prefix_cache(RolloutEngine *e, int on);
// Chunked prefill (off at first): while sequences decode, a step prefills at most `tokens` rows of the pending
// prompts (text prompts whose prompt logits nobody wants; others whole, before), in the same forward as the
// decoding sequences' tokens, so a long prompt holds each running stream up a chunk's compute, not the whole
// prompt's; a prompt prefilled over several steps samples its first token in the step of its last rows. The
// rows beside the decode rows are at most the engine's prefill rows less its slots: returns the chunk set.
int64_t rollout_engine_prefill_chunk(RolloutEngine *e, int64_t tokens);
// Ends r's samples now and frees their slots; r->out keeps what they made.
void rollout_engine_cancel(RolloutEngine *e, RolloutRequest *r);
// One step: prefills the requests added since the last one (each sample takes its first token; with chunked
// prefill while others decode, a chunk of them, in the same forward), and every other running sample takes one
// token; finished samples free their slots. Returns the samples running (those still prefilling too).
int rollout_engine_step(RolloutEngine *e);

// Fills out[prompt * G + sample]. tok may be NULL when there are no stop strings. Dies when one
// prompt's G samples do not fit the KV budget.
void rollout_generate(const Decoder *m, const Tokenizer *tok, const RolloutConfig *cfg, const RolloutPrompt *prompts,
                      int n_prompts, int G, RolloutSample *out, RolloutStats *stats, RolloutTokenFn fn, void *user);
void rollout_sample_free(RolloutSample *s);
// A model's stop tokens (eos_token_id of DIR's config.json and generation_config.json) and tok's eos (tok may be
// NULL), once each, into out (16 at most); returns their count.
int rollout_stop_ids(const char *dir, const Tokenizer *tok, int32_t out[16]);
// The sample's text up to a stop string as a NUL-terminated copy (malloc'd), what rewards score.
char *rollout_sample_text(const RolloutSample *s);
// The same from turn_start: the model's last turn (what the rule rewards score after tool turns).
char *rollout_sample_final_text(const RolloutSample *s);
// The conversation of a sample with tool turns as a JSON array (malloc'd): the prompt's messages (a JSON
// array, as given) or else {"role": "user", "content": prompt}, then the model's turns ("assistant") and the
// tools' answers ("tool") in order; strings made valid UTF-8. What a reward program gets as "messages".
char *rollout_sample_messages(const RolloutSample *s, const char *prompt, const char *prompt_messages);
