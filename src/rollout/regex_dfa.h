// guided_regex (vLLM's): a regular expression compiled into a DFA over bytes, so that the output is kept a prefix
// of a full match by walking each token's bytes (no backtracking: a step's cost is the vocabulary's bytes,
// whatever the pattern). The syntax is Python re's, a subset: literals (any UTF-8), escapes (\. \n \t \xHH
// \uHHHH ...), ".", classes [a-z0-9_] [^...] with \d \w \s \D \W \S (ASCII's, as re.ASCII and xgrammar read
// them), groups (...) (?:...) (?P<name>...), alternation, quantifiers * + ? {m} {m,} {,n} {m,n} (and their lazy
// forms: a full match is the same language), ^ and $ only at the ends. Not supported (an error naming them):
// lookaround, backreferences, \b, flags, possessive quantifiers, non-ASCII ranges in a class, non-ASCII
// characters in a negated class. The compile's time and memory are bounded (regex_dfa.c's caps).
#pragma once
#include <stddef.h>
#include <stdint.h>

#define REGEX_MAX_STATES 16384  // DFA states at most (a pattern needing more is refused)
#define REGEX_MAX_REPEAT 1000   // {m,n}'s bounds at most

typedef struct {
    int n;              // states; 0 is the start
    int n_cls;          // byte classes: bytes that every transition treats alike
    uint8_t cls[256];   // each byte's class
    int32_t *next;      // next[s * n_cls + cls[byte]]: the state after the byte from s, -1: no match can follow
    int64_t *dist;      // the fewest bytes from state s to a full match
} RegexDfa;

// flags: REGEX_ECMA (JSON Schema's "pattern"): what Python and ECMA-262 read differently matches only what both
// do: '.' takes no '\r'; '.', \S, \W, \D and negated classes take no non-ASCII space or line terminator (one
// table for all, so U+2000-U+207F whole); Python's {,n}, (?P<name>), \a, \U and [] ...] are refused, and
// ECMA's (?<name>...) is a group.
#define REGEX_ECMA 1

// Compiles pattern (n bytes) for a full match. Returns NULL, or what is wrong or not supported (malloc'd).
// work: the steps (pattern bytes parsed, NFA states visited) spent before by compiles that share one bound of
// their time with this one (a schema's patterns), and after, this one's added; NULL: this one alone.
char *regex_compile(const char *pattern, size_t n, int flags, int64_t *work, RegexDfa *d);
// The automaton of the strings that a and b both match fully (their product). Returns NULL, or why not (none
// is, too many states, or past work's bound: regex_compile's; malloc'd).
char *regex_intersect(const RegexDfa *a, const RegexDfa *b, int64_t *work, RegexDfa *d);
// The most bytes of a full match, or -1 when matches can be as long as any.
int64_t regex_longest(const RegexDfa *d);
void regex_free(RegexDfa *d);
// The least cost from each state to a full match (d->n of them, malloc'd; INT64_MAX: none), a byte b costing
// byte_cost[b] (INT64_MAX: it cannot be written), as a JSON string's escaped bytes cost more than one.
int64_t *regex_costs(const RegexDfa *d, const int64_t byte_cost[256]);
// The state after s[0, n) from `state`, or -1 when no full match begins so.
int regex_walk(const RegexDfa *d, int state, const char *s, size_t n);
