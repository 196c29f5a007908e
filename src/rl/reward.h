// Rewards for GRPO: rule rewards (GSM8K "####", \boxed{}, a format regex, exact match) and an
// external scoring program, combined as a weighted sum.
//
// The rule rewards follow verl's published scorers so that numbers compare with verl runs:
//   gsm8k  verl/utils/reward_score/gsm8k.py  extract_solution (strict / flexible) + compute_score
//   boxed  verl/utils/reward_score/math.py   last_boxed_only_string, remove_boxed, strip_string,
//                                            is_equiv (the lm-evaluation-harness hendrycks_math
//                                            normalisation), compute_score
// with two documented extensions: answers are also compared as numbers (verl compares strings, so
// "72.0" would not match "72"; for gsm8k flexible, commas are removed before comparing, where verl
// keeps them), and a ground truth that is itself a full GSM8K solution ("... #### 72") or holds a
// \boxed{} is reduced to its final answer first. Details at each function below.
//
// Strings are NUL-terminated UTF-8. Nothing here is thread-safe: a RewardSet owns compiled regex
// scratch space and program processes, so score from one thread at a time.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef enum {
    REWARD_GSM8K,
    REWARD_BOXED,
    REWARD_FORMAT,
    REWARD_EXACT,
    REWARD_PROGRAM,
    REWARD_KIND_COUNT
} RewardKind;

// "gsm8k", "boxed", "format", "exact", "program".
const char *reward_kind_name(RewardKind kind);
// 1 and *out set when `name` is one of the names above, 0 otherwise.
int reward_kind_parse(const char *name, RewardKind *out);

// format: PCRE2 in UTF + UCP mode (\d \w \s are Unicode, as in Python's re), anchored at both ends
// like re.fullmatch; a response that is not valid UTF-8 never matches. Differences from Python's re on
// the same pattern: \s does not match U+001C..U+001F (Python's str.isspace does) and the Unicode
// version of the two libraries may differ (U+180E).
// The default format: a think block, then an answer block, and nothing else (matched with DOTALL).
#define REWARD_FORMAT_DEFAULT_PATTERN "^<think>.*?</think>\\s*<answer>.*?</answer>$"

// One reward of a weighted sum. Start from reward_spec_defaults (zero is not a valid default for
// weight or score). String fields are borrowed: they must stay valid until reward_set_init, which
// copies them.
typedef struct {
    RewardKind kind;
    double weight;        // weight in the sum [1]
    const char *name;     // label for metrics [the kind's name]
    // gsm8k, boxed (verl's compute_score arguments)
    double score;         // value of a correct answer [1]
    double format_score;  // value when an answer was found but is wrong [0]; no answer scores 0
    // gsm8k, boxed, exact: score only what follows the reasoning of a thinking model (reward_after_think)
    int strip_think;      // [0]
    // gsm8k
    int flexible;         // 0: strict, the last "#### n" [default]; 1: flexible, the last number
    int64_t clip_chars;   // search only the last N characters (verl >= 0.4 clips to 300) [0: all]
    // format
    const char *pattern;  // PCRE2 pattern that must match the whole response [default above]
    int dotall;           // "." also matches newlines [1]
    // program
    const char *command;  // run with /bin/sh -c
    double timeout_s;     // per call, covering a restart, the write and the reply [10]
    double grace_s;       // at shutdown: time to exit after stdin closes, then SIGKILL [2]
    double memory_mb;     // the program's data-memory limit (RLIMIT_DATA), MiB; 0: none [16384]
} RewardSpec;

void reward_spec_defaults(RewardSpec *spec, RewardKind kind);
// The answer of a thinking model's response (Qwen3, DeepSeek-R1): what follows the last "</think>"; the
// empty string when a "<think>" was never closed (the reasoning ran out of tokens: no answer); the whole
// response when it has neither tag. A pointer into response (or to a static "").
const char *reward_after_think(const char *response);
// Sets one parameter from its text form, as config files and `key=value` overrides give them.
// Keys: weight, name; gsm8k: method (strict|flexible), score, format_score, clip_chars, strip_think; boxed:
// score, format_score, strip_think; exact: strip_think; format: pattern, dotall (true|false); program:
// command, timeout, grace. strip_think and dotall take true|false.
// Returns 1 when set, 0 when `key` is not a key of this kind, -1 when `value` is malformed (a
// message goes to err). String values are stored as the pointer `value` (borrowed, see above).
int reward_spec_set(RewardSpec *spec, const char *key, const char *value, char *err, size_t err_len);
// NULL-terminated list of the keys reward_spec_set accepts for `kind` (for "did you mean" errors).
const char *const *reward_spec_keys(RewardKind kind);

// The external scoring program of a `program` reward (base/program.h): a RewardItem of that kind
// owns one.
typedef struct Program Program;

// ---------------------------------------------------------------- weighted sum
#define REWARD_MAX_SPECS 16

typedef struct {
    RewardSpec spec;         // string fields point into owned copies
    char *name, *pattern, *command;
    void *regex, *match_data;  // format: pcre2_code / pcre2_match_data
    Program *program;  // program
} RewardItem;

typedef struct {
    int n;
    RewardItem items[REWARD_MAX_SPECS];
} RewardSet;

#define REWARD_PRED_MAX 128

typedef struct {
    double total;                      // sum of weight * value
    double values[REWARD_MAX_SPECS];   // each spec's unweighted value, in spec order
    int correct;   // accuracy: 1 when every gsm8k/boxed/exact spec judged the answer correct, 0 when
                   // one did not, -1 when the set has none of those kinds
    int program_failures;  // program calls in this score that failed
    // The answer the first scorer that extracts one found (gsm8k: the number; boxed: the box's content; exact: the
    // response; a program: its reply's "pred"), its first REWARD_PRED_MAX - 1 bytes; "" for none. A program's
    // reply may also judge correctness: "acc" (true/false or 1/0), as verl's compute_score dictionaries.
    char pred[REWARD_PRED_MAX];
} RewardDetail;

// Why the set's reward program last failed ("another rank's program" when this one never did).
const char *reward_last_error(const RewardSet *set);
// Copies the specs, compiles format regexes and starts programs. Dies (one line, naming the spec)
// on a bad spec: unknown kind, non-finite weight, regex that does not compile, program without command.
void reward_set_init(RewardSet *set, const RewardSpec *specs, int n);
// Weighted sum for one response; `answer` is the ground truth, `prompt` only goes to programs, and so does
// `messages` (multi-turn: the conversation as a JSON array of {"role", "content"}, or NULL), as the request's
// "messages". detail may be NULL.
double reward_score(const RewardSet *set, const char *prompt, const char *response, const char *answer,
                    const char *messages, RewardDetail *detail);
void reward_set_free(RewardSet *set);

// A data row as the rewards see it. reward.by_data_source: `rule` is the rule kind its data_source selects
// (reward_rule_of_data_source), and the gsm8k and boxed specs of the other kind are skipped (value 0, no
// judgement); -1 scores every spec.
typedef struct {
    const char *prompt, *answer;
    const char *messages;    // multi-turn conversation JSON, or NULL (as reward_score's)
    const char *extra_info;  // the row's extra_info as JSON, or NULL: the program's request carries it
    int rule;
} RewardRow;
double reward_score_row(const RewardSet *set, const RewardRow *row, const char *response, RewardDetail *detail);
// verl's default scorer choice (verl/utils/reward_score/__init__.py): "openai/gsm8k" -> REWARD_GSM8K;
// "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500" -> REWARD_BOXED; -1 for
// any other (verl's other scorers are not rule rewards here) and NULL.
int reward_rule_of_data_source(const char *data_source);

// ---------------------------------------------------------------- the pieces, for tests and reuse
// Each returns malloc'd strings (free them) or NULL for Python's None / a raised exception.

// verl gsm8k.extract_solution: strict = the last match of "#### (-?[0-9.,]+)" with "," and "$"
// removed; flexible = the last match of "(-?[0-9.,]+)" that is not "." (verbatim, commas kept).
// clip_chars > 0 first keeps only the last clip_chars characters (code points), as verl >= 0.4 does.
char *gsm8k_extract_solution(const char *response, int flexible, int64_t clip_chars);
// The ground truth's answer: the text after the last "####" if there is one (split left to right,
// as Python's str.split), ASCII whitespace trimmed, "," and "$" removed.
char *gsm8k_ground_truth(const char *answer);
// Extracted answer vs ground_truth(): "," and "$" removed from the extracted text, then equal as
// numbers when both parse (reward_parse_number), else equal as strings (verl's comparison).
int gsm8k_is_correct(const char *extracted, const char *ground_truth);

// verl math.py, ported function by function (see reward.c for the exact rules).
char *math_last_boxed_only_string(const char *s);  // NULL: no \boxed / \fbox, or braces never close
char *math_remove_boxed(const char *s);            // NULL: verl's assertions fail (e.g. \fbox{...})
char *math_strip_string(const char *s);            // NULL: verl's strip_string raises
int math_is_equiv(const char *a, const char *b);   // strip both and compare; if one raises, raw a == b
// The boxed reward's judgement: math_is_equiv, or both normalised strings are numbers
// (reward_parse_number) with equal values. `answer` is reduced to its last \boxed{} when it has one.
int math_is_correct(const char *boxed_content, const char *answer);

// Numbers as the answers write them: [+-]? then a decimal (digits with an optional fraction, or
// ".digits"; the integer part may be grouped by commas as in 1,234,567) or \frac{decimal}{decimal}
// with a non-zero denominator. Nothing else (no spaces, exponents, inf/nan). 1 and *out when s is one
// and its value is finite.
int reward_parse_number(const char *s, double *out);
// Trimmed (ASCII whitespace) string equality.
int reward_exact_match(const char *response, const char *answer);
