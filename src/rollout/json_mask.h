// JSON mode (grpo serve's response_format json_object, or json_schema: json_schema.h): the output is kept a prefix
// of one JSON object (of the schema) that can still be closed, and ended by a stop token, within the token budget,
// so that it always parses (and validates) and finishes with "stop". A byte-level pushdown automaton reads the
// output so far; each token of the vocabulary is tried on a copy of it. Closing characters are single bytes, each
// a token of a byte-level vocabulary, so the budget is counted in them.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "rollout/json_schema.h"
#include "rollout/mask_cache.h"
#include "rollout/regex_dfa.h"
#include "text/tokenizer.h"

#define JSON_MAX_DEPTH JS_MAX_DEPTH  // objects and arrays nested at most (deeper: not offered)

// Sets logits[id] = -inf for every token that would not continue the JSON object text[0, n) (the output so far;
// one of schema: json_schema.h) with room to close it and end with a stop id in tokens_left - 1 more tokens; once
// the object is complete only stop_ids remain (and should no token continue it, the stop ids are left at logit 0,
// ending the output). Returns the tokens allowed (0 also when text is no such prefix: then nothing was masked).
// plain: json_plain_tokens' (or NULL). cache: the masks of the states met so far (mask_cache.h: this schema's,
// tokenizer's and stop ids'), or NULL.
int64_t json_mask(const Tokenizer *tok, const JsonSchema *schema, const uint8_t *plain, MaskCache *cache,
                  const char *text, size_t n, int64_t tokens_left, const int32_t *stop_ids, int n_stop,
                  float *logits, int64_t V);

// Per token of the vocabulary (V, malloc'd): whether it is plain string text, which leaves the automaton inside a
// string as it found it (whole UTF-8 characters, escapes, no closing quote), so that json_mask gives all of them
// one verdict there instead of running each.
uint8_t *json_plain_tokens(const Tokenizer *tok, int64_t V);

// guided_choice (vLLM's): the output is one of n_choices strings, then a stop token. Sets logits[id] = -inf for
// every token whose bytes do not continue text[0, n) within one of the choices with room to finish it (a byte a
// token at worst) and a stop id in tokens_left - 1 more tokens; special tokens never continue it, and the stop ids
// are allowed once text is a choice. Returns the tokens allowed (none: the stop ids are left at logit 0).
int64_t choice_mask(const Tokenizer *tok, const char *const *choices, int n_choices, const char *text, size_t n,
                    int64_t tokens_left, const int32_t *stop_ids, int n_stop, float *logits, int64_t V);

// guided_regex (vLLM's): the output is a full match of d's pattern (regex_dfa.h), then a stop token. Sets
// logits[id] = -inf for every token whose bytes do not continue text[0, n) towards a match with room to finish it
// (a byte a token at worst) and a stop id in tokens_left - 1 more tokens; special tokens never continue it, and
// the stop ids are allowed once text matches. Returns the tokens allowed (none: the stop ids are left at logit
// 0; text that begins no match: nothing masked, 0). cache: as json_mask's (this pattern's), or NULL.
int64_t regex_mask(const Tokenizer *tok, const RegexDfa *d, MaskCache *cache, const char *text, size_t n,
                   int64_t tokens_left, const int32_t *stop_ids, int n_stop, float *logits, int64_t V);
