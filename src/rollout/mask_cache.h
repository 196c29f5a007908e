// Constrained decoding's masks, cached per automaton state (as xgrammar does): JSON mode's and guided_regex's mask
// (json_mask.h) depends on the output's state and the token budget left only, so a state's tokens, each with the
// budget it needs, are worked out once (each token run through the automaton) and a state met again costs one
// pass over the vocabulary. A cache belongs to one constraint (its tokenizer, stop ids and schema or pattern) and
// is used by one thread at a time.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct {
    int32_t id;    // a token that may come next
    int32_t need;  // the budget it needs: itself, the rest (a byte a token at worst), a stop; INT32_MAX: never
} MaskToken;

typedef struct {
    MaskToken *t;  // ascending ids
    int64_t n, cap;
} MaskList;

typedef struct MaskCache MaskCache;

// Appends id (above the last one) with its need.
void mask_list_add(MaskList *l, int32_t id, int64_t need);
// Makes id never allowed, if l holds it.
void mask_list_drop(MaskList *l, int32_t id);
void mask_list_free(MaskList *l);
// Sets logits[id] = -inf for every id < V that l does not hold with a need <= tokens_left (overwrites those,
// leaves the rest). Returns the ids left.
int64_t mask_list_apply(const MaskList *l, int64_t tokens_left, float *logits, int64_t V);

// A cache holding at most about max_bytes of lists (when full it is emptied and fills again).
MaskCache *mask_cache_new(size_t max_bytes);
void mask_cache_free(MaskCache *c);
// The list kept under key (n bytes), or NULL.
const MaskList *mask_cache_find(MaskCache *c, const void *key, size_t n);
// The finds so far that found a list.
int64_t mask_cache_hits(const MaskCache *c);
// Keeps *l under key (a key not kept yet), taking its memory (*l is left empty); returns the kept list.
const MaskList *mask_cache_keep(MaskCache *c, const void *key, size_t n, MaskList *l);
