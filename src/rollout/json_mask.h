// JSON mode (grpo serve's response_format json_object): the output is kept a prefix of one JSON object that can
// still be closed within the token budget, so that it always parses. A byte-level pushdown automaton reads the
// output so far; each token of the vocabulary is tried on a copy of it. Closing characters are single bytes, each
// a token of a byte-level vocabulary, so the budget is counted in them.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"

#define JSON_MAX_DEPTH 32  // objects and arrays nested at most (deeper: not offered)

// Sets logits[id] = -inf for every token that would not continue the JSON object text[0, n) (the output so far)
// with room to close it in tokens_left - 1 more tokens; once the object is complete only stop_ids remain (and
// should no token continue it, the stop ids are left at logit 0, ending the output). Returns the tokens allowed
// (0 also when text is no such prefix: then nothing was masked).
int64_t json_mask(const Tokenizer *tok, const char *text, size_t n, int64_t tokens_left, const int32_t *stop_ids,
                  int n_stop, float *logits, int64_t V);
