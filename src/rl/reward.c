#define _GNU_SOURCE  // open_memstream
#include "rl/reward.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <errno.h>
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/program.h"
#include "base/util.h"
#include "text/utf8.h"

// ================================================================ small string helpers
// Python works on code points where verl indexes strings (s[0], len(s)); these give the same
// answers on UTF-8. An invalid byte counts as one character (Python never sees one: its inputs
// are str).

static size_t cp_len(const char *s) {
    unsigned char c = (unsigned char)s[0];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    for (size_t i = 1; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) return 1;
    return n;
}

static size_t cp_count(const char *s) {
    size_t n = 0;
    for (size_t i = 0; s[i]; i += cp_len(s + i)) n++;
    return n;
}

static char *str_ndup(const char *s, size_t n) {
    char *d = xmalloc(n + 1);
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

static char *buf_take(Buf *b) {
    if (!b->data) return xstrdup("");
    return b->data;
}

static void buf_puts(Buf *b, const char *s) { buf_append(b, s, strlen(s)); }

// Python's s.replace(from, to): non-overlapping, left to right. Frees s.
static char *replace_all(char *s, const char *from, const char *to) {
    if (!strstr(s, from)) return s;
    size_t nf = strlen(from);
    Buf b = {0};
    const char *p = s, *q;
    while ((q = strstr(p, from))) {
        buf_append(&b, p, (size_t)(q - p));
        buf_puts(&b, to);
        p = q + nf;
    }
    buf_puts(&b, p);
    free(s);
    return buf_take(&b);
}

static size_t count_occurrences(const char *s, const char *sub) {
    size_t n = 0, ns = strlen(sub);
    for (const char *q = strstr(s, sub); q; q = strstr(q + ns, sub)) n++;
    return n;
}

static int is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

static char *trim_dup(const char *s) {
    size_t a = 0, b = strlen(s);
    while (a < b && is_ascii_space(s[a])) a++;
    while (b > a && is_ascii_space(s[b - 1])) b--;
    return str_ndup(s + a, b - a);
}

static char *remove_chars(const char *s, const char *drop) {
    size_t n = strlen(s), o = 0;
    char *d = xmalloc(n + 1);
    for (size_t i = 0; i < n; i++)
        if (!strchr(drop, s[i])) d[o++] = s[i];
    d[o] = '\0';
    return d;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

// ================================================================ numbers

// Decimal at s (grammar in reward.h, without sign): its length, or 0.
static size_t scan_decimal(const char *s) {
    size_t i = 0, nd = 0;
    while (is_digit(s[i])) i++, nd++;
    if (nd >= 1 && nd <= 3 && s[i] == ',' && is_digit(s[i + 1])) {  // grouped: d{1,3}(,ddd)+
        size_t j = i;
        int groups = 0;
        while (s[j] == ',' && is_digit(s[j + 1]) && is_digit(s[j + 2]) && is_digit(s[j + 3]) && !is_digit(s[j + 4])) {
            j += 4;
            groups++;
        }
        if (groups) i = j;  // otherwise the digits alone (a caller requiring more then rejects the comma)
    }
    if (s[i] == '.') {
        i++;
        size_t nf = 0;
        while (is_digit(s[i])) i++, nf++;
        if (nd == 0 && nf == 0) return 0;
    } else if (nd == 0) {
        return 0;
    }
    return i;
}

static double decimal_value(const char *s, size_t n) {
    char *plain = xmalloc(n + 1);
    size_t o = 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] != ',') plain[o++] = s[i];
    plain[o] = '\0';
    double v = strtod(plain, NULL);  // correctly rounded, like Python's float()
    free(plain);
    return v;
}

int reward_parse_number(const char *s, double *out) {
    double sign = 1;
    if (*s == '+' || *s == '-') sign = *s++ == '-' ? -1 : 1;
    double v;
    if (strncmp(s, "\\frac{", 6) == 0) {
        const char *p = s + 6;
        size_t na = scan_decimal(p);
        if (!na || p[na] != '}' || p[na + 1] != '{') return 0;
        const char *q = p + na + 2;
        size_t nb = scan_decimal(q);
        if (!nb || q[nb] != '}' || q[nb + 1] != '\0') return 0;
        double den = decimal_value(q, nb);
        if (den == 0) return 0;
        v = decimal_value(p, na) / den;
    } else {
        size_t n = scan_decimal(s);
        if (!n || s[n] != '\0') return 0;
        v = decimal_value(s, n);
    }
    if (!isfinite(v)) return 0;
    *out = sign * v;
    return 1;
}

static int numbers_equal(const char *a, const char *b) {
    double x, y;
    return reward_parse_number(a, &x) && reward_parse_number(b, &y) && x == y;
}

// ================================================================ gsm8k (verl gsm8k.py)

static int gsm8k_class(char c) { return is_digit(c) || c == '.' || c == ','; }

// Length of a match of "-?[0-9.,]+" at s, 0 if none (the optional '-' backtracks away, and then
// the class cannot match at '-', so "-x" does not match here).
static size_t gsm8k_number_at(const char *s) {
    size_t i = s[0] == '-' ? 1 : 0;
    size_t j = i;
    while (gsm8k_class(s[j])) j++;
    return j > i ? j : 0;
}

char *gsm8k_extract_solution(const char *response, int flexible, int64_t clip_chars) {
    const char *s = response;
    if (clip_chars > 0) {  // solution_str[-clip:] in code points
        size_t n = cp_count(s);
        for (size_t skip = n > (size_t)clip_chars ? n - (size_t)clip_chars : 0; skip; skip--) s += cp_len(s);
    }
    const char *best = NULL;
    size_t best_len = 0;
    if (!flexible) {  // re.findall("#### (\-?[0-9\.\,]+)"): scan, resuming after each match
        for (size_t i = 0; s[i];) {
            size_t m = strncmp(s + i, "#### ", 5) == 0 ? gsm8k_number_at(s + i + 5) : 0;
            if (m) {
                best = s + i + 5;
                best_len = m;
                i += 5 + m;
            } else {
                i++;
            }
        }
        if (!best) return NULL;
        char *raw = str_ndup(best, best_len);
        char *out = remove_chars(raw, ",$");
        free(raw);
        return out;
    }
    // re.findall("(\-?[0-9\.\,]+)"), then the last match that is not "." ("" cannot match); when
    // every match is ".", Python's loop variable is left at the first match.
    const char *first = NULL;
    size_t first_len = 0;
    for (size_t i = 0; s[i];) {
        size_t m = gsm8k_number_at(s + i);
        if (!m) {
            i++;
            continue;
        }
        if (!first) first = s + i, first_len = m;
        if (!(m == 1 && s[i] == '.')) best = s + i, best_len = m;
        i += m;
    }
    if (!first) return NULL;
    return best ? str_ndup(best, best_len) : str_ndup(first, first_len);
}

char *gsm8k_ground_truth(const char *answer) {
    const char *tail = answer;  // answer.split("####")[-1]
    for (const char *q = strstr(answer, "####"); q; q = strstr(q + 4, "####")) tail = q + 4;
    char *t = trim_dup(tail);
    char *out = remove_chars(t, ",$");
    free(t);
    return out;
}

int gsm8k_is_correct(const char *extracted, const char *ground_truth) {
    char *e = remove_chars(extracted, ",$");
    double x, y;
    int ok = reward_parse_number(e, &x) && reward_parse_number(ground_truth, &y) ? x == y : strcmp(e, ground_truth) == 0;
    free(e);
    return ok;
}

// ================================================================ boxed (verl math.py)
// A port of last_boxed_only_string, remove_boxed, fix_fracs, fix_a_slash_b, remove_right_units,
// fix_sqrt, strip_string and is_equiv from verl/utils/reward_score/math.py (the hendrycks_math
// normalisation of lm-evaluation-harness). Where Python raises (an assert, an IndexError on an
// empty string) these return NULL and the caller does what verl's try/except does.

char *math_last_boxed_only_string(const char *s) {
    const char *q = strstr(s, "\\boxed ");
    if (q) {  // "\\boxed " + string.split("\\boxed ")[-1].split("$")[0]
        const char *tail = q + 7;
        while ((q = strstr(tail, "\\boxed "))) tail = q + 7;
        Buf b = {0};
        buf_puts(&b, "\\boxed ");
        buf_append(&b, tail, strcspn(tail, "$"));
        return buf_take(&b);
    }
    const char *idx = NULL;  // rfind("\\boxed"), else rfind("\\fbox")
    for (q = strstr(s, "\\boxed"); q; q = strstr(q + 1, "\\boxed")) idx = q;
    if (!idx)
        for (q = strstr(s, "\\fbox"); q; q = strstr(q + 1, "\\fbox")) idx = q;
    if (!idx) return NULL;
    int open = 0;  // the first '}' that brings the count back to 0 closes it
    for (const char *p = idx; *p; p++) {
        if (*p == '{') open++;
        if (*p == '}' && --open == 0) return str_ndup(idx, (size_t)(p - idx + 1));
    }
    return NULL;
}

char *math_remove_boxed(const char *s) {
    if (strstr(s, "\\boxed ")) return strncmp(s, "\\boxed ", 7) == 0 ? xstrdup(s + 7) : NULL;
    size_t n = strlen(s);
    if (strncmp(s, "\\boxed{", 7) != 0 || s[n - 1] != '}' || n < 8) return NULL;
    return str_ndup(s + 7, n - 8);
}

// fix_fracs: "\frac12" -> "\frac{1}{2}", "\frac1{2}" -> "\frac{1}{2}"; a and b are the first two
// characters after \frac. NULL where Python raises (nothing after a \frac).
static char *fix_fracs(const char *s) {
    if (!strstr(s, "\\frac")) return xstrdup(s);
    Buf b = {0};
    const char *q = strstr(s, "\\frac");
    buf_append(&b, s, (size_t)(q - s));
    while (q) {
        const char *sub = q + 5;
        const char *next = strstr(sub, "\\frac");
        size_t n = next ? (size_t)(next - sub) : strlen(sub);
        buf_puts(&b, "\\frac");
        if (n == 0) {  // substr[0] on ""
            buf_free(&b);
            return NULL;
        }
        if (sub[0] == '{') {
            buf_append(&b, sub, n);
        } else {
            size_t la = cp_len(sub);
            if (la >= n) {  // assert len(substr) >= 2 fails: the input comes back unchanged
                buf_free(&b);
                return xstrdup(s);
            }
            size_t lb = cp_len(sub + la);
            buf_puts(&b, "{");
            buf_append(&b, sub, la);
            if (!(lb == 1 && sub[la] == '{')) {
                buf_puts(&b, "}{");
                buf_append(&b, sub + la, lb);
                buf_puts(&b, "}");
            } else {
                buf_puts(&b, "}{");
            }
            buf_append(&b, sub + la + lb, n - la - lb);
        }
        q = next;
    }
    return buf_take(&b);
}

// str(int(x)) == x: "0", or digits without a leading zero, optionally negative (not "-0").
static int is_canonical_int(const char *s, size_t n) {
    size_t i = 0;
    if (n > 0 && s[0] == '-') i = 1;
    if (i == n) return 0;
    for (size_t k = i; k < n; k++)
        if (!is_digit(s[k])) return 0;
    if (s[i] == '0') return n - i == 1 && i == 0;
    return 1;
}

// fix_a_slash_b: "a/b" with integers a, b written as Python prints them -> "\frac{a}{b}".
static char *fix_a_slash_b(char *s) {
    const char *slash = strchr(s, '/');
    if (!slash || strchr(slash + 1, '/')) return s;
    size_t na = (size_t)(slash - s);
    const char *b = slash + 1;
    if (!is_canonical_int(s, na) || !is_canonical_int(b, strlen(b))) return s;
    Buf out = {0};
    buf_puts(&out, "\\frac{");
    buf_append(&out, s, na);
    buf_puts(&out, "}{");
    buf_puts(&out, b);
    buf_puts(&out, "}");
    free(s);
    return buf_take(&out);
}

// fix_sqrt: "\sqrt3" -> "\sqrt{3}" (the one character after \sqrt). NULL where Python raises.
static char *fix_sqrt(const char *s) {
    const char *q = strstr(s, "\\sqrt");
    if (!q) return xstrdup(s);
    Buf b = {0};
    buf_append(&b, s, (size_t)(q - s));
    while (q) {
        const char *sub = q + 5;
        const char *next = strstr(sub, "\\sqrt");
        size_t n = next ? (size_t)(next - sub) : strlen(sub);
        if (n == 0) {  // split[0] on ""
            buf_free(&b);
            return NULL;
        }
        if (sub[0] != '{') {
            size_t la = cp_len(sub);
            buf_puts(&b, "\\sqrt{");
            buf_append(&b, sub, la);
            buf_puts(&b, "}");
            buf_append(&b, sub + la, n - la);
        } else {
            buf_puts(&b, "\\sqrt");
            buf_append(&b, sub, n);
        }
        q = next;
    }
    return buf_take(&b);
}

char *math_strip_string(const char *in) {
    char *s = xstrdup(in);
    s = replace_all(s, "\n", "");           // linebreaks
    s = replace_all(s, "\\!", "");          // inverse spaces
    s = replace_all(s, "\\\\", "\\");       // "\\" -> "\"
    s = replace_all(s, "tfrac", "frac");
    s = replace_all(s, "dfrac", "frac");
    s = replace_all(s, "\\left", "");
    s = replace_all(s, "\\right", "");
    s = replace_all(s, "^{\\circ}", "");    // degrees
    s = replace_all(s, "^\\circ", "");
    s = replace_all(s, "\\$", "");          // dollars
    size_t units = count_occurrences(s, "\\text{ ");  // remove_right_units
    if (units > 1) {  // assert len(splits) == 2
        free(s);
        return NULL;
    }
    if (units == 1) *strstr(s, "\\text{ ") = '\0';
    s = replace_all(s, "\\%", "");          // percentage; verl has this line twice ("\\%" and "\%" are
    s = replace_all(s, "\\%", "");          // the same string), and the second pass catches "\\%%"
    s = replace_all(s, " .", " 0.");
    s = replace_all(s, "{.", "{0.");
    if (!*s) return s;
    if (s[0] == '.') {
        char *t = xmalloc(strlen(s) + 2);
        t[0] = '0';
        strcpy(t + 1, s);
        free(s);
        s = t;
    }
    const char *eq = strchr(s, '=');  // "k = 3" -> " 3": exactly one '=' and at most 2 characters before
    if (eq && !strchr(eq + 1, '=')) {
        char *left = str_ndup(s, (size_t)(eq - s));
        int short_left = cp_count(left) <= 2;
        free(left);
        if (short_left) {
            char *t = xstrdup(eq + 1);
            free(s);
            s = t;
        }
    }
    char *t = fix_sqrt(s);
    free(s);
    if (!t) return NULL;
    s = replace_all(t, " ", "");
    t = fix_fracs(s);
    free(s);
    if (!t) return NULL;
    s = t;
    if (strcmp(s, "0.5") == 0) {
        free(s);
        s = xstrdup("\\frac{1}{2}");
    }
    return fix_a_slash_b(s);
}

int math_is_equiv(const char *a, const char *b) {
    char *sa = math_strip_string(a), *sb = math_strip_string(b);
    int eq = sa && sb ? strcmp(sa, sb) == 0 : strcmp(a, b) == 0;
    free(sa);
    free(sb);
    return eq;
}

// A ground truth holding a \boxed{} is reduced to its content; otherwise it is used as is.
static char *boxed_ground_truth(const char *answer) {
    char *last = math_last_boxed_only_string(answer);
    char *content = last ? math_remove_boxed(last) : NULL;
    free(last);
    return content ? content : xstrdup(answer);
}

int math_is_correct(const char *content, const char *answer) {
    char *gt = boxed_ground_truth(answer);
    int ok = math_is_equiv(content, gt);
    if (!ok) {
        char *sa = math_strip_string(content), *sb = math_strip_string(gt);
        ok = sa && sb && numbers_equal(sa, sb);
        free(sa);
        free(sb);
    }
    free(gt);
    return ok;
}

int reward_exact_match(const char *response, const char *answer) {
    char *a = trim_dup(response), *b = trim_dup(answer);
    int eq = strcmp(a, b) == 0;
    free(a);
    free(b);
    return eq;
}

// ================================================================ specs

static const char *const KIND_NAMES[REWARD_KIND_COUNT] = {"gsm8k", "boxed", "format", "exact", "program"};

const char *reward_kind_name(RewardKind kind) {
    return (int)kind >= 0 && (int)kind < REWARD_KIND_COUNT ? KIND_NAMES[kind] : "?";
}

int reward_kind_parse(const char *name, RewardKind *out) {
    for (int k = 0; k < REWARD_KIND_COUNT; k++)
        if (strcmp(name, KIND_NAMES[k]) == 0) {
            *out = (RewardKind)k;
            return 1;
        }
    return 0;
}

void reward_spec_defaults(RewardSpec *spec, RewardKind kind) {
    memset(spec, 0, sizeof *spec);
    spec->kind = kind;
    spec->weight = 1;
    spec->score = 1;
    spec->format_score = 0;
    spec->pattern = REWARD_FORMAT_DEFAULT_PATTERN;
    spec->dotall = 1;
    spec->timeout_s = 10;
    spec->grace_s = 2;
    spec->memory_mb = 16384;  // a scorer past 16 GiB of data is a runaway; its allocations fail, it scores 0
}

static const char *const KEYS_GSM8K[] = {"weight", "name", "method", "score", "format_score", "clip_chars",
                                         "strip_think", NULL};
static const char *const KEYS_BOXED[] = {"weight", "name", "score", "format_score", "strip_think", NULL};
static const char *const KEYS_FORMAT[] = {"weight", "name", "pattern", "dotall", NULL};
static const char *const KEYS_EXACT[] = {"weight", "name", "strip_think", NULL};
static const char *const KEYS_PROGRAM[] = {"weight", "name", "command", "timeout", "grace", "memory_mb", NULL};

const char *const *reward_spec_keys(RewardKind kind) {
    switch (kind) {
    case REWARD_GSM8K: return KEYS_GSM8K;
    case REWARD_BOXED: return KEYS_BOXED;
    case REWARD_FORMAT: return KEYS_FORMAT;
    case REWARD_EXACT: return KEYS_EXACT;
    case REWARD_PROGRAM: return KEYS_PROGRAM;
    default: return KEYS_EXACT + 2;  // empty list
    }
}

static int parse_double(const char *v, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || errno || !isfinite(x)) return 0;
    *out = x;
    return 1;
}

int reward_spec_set(RewardSpec *spec, const char *key, const char *value, char *err, size_t err_len) {
    int known = 0;
    for (const char *const *k = reward_spec_keys(spec->kind); *k; k++) known |= strcmp(*k, key) == 0;
    if (!known) return 0;
    double x;
    if (!strcmp(key, "name") || !strcmp(key, "pattern") || !strcmp(key, "command")) {
        if (!*value) {
            snprintf(err, err_len, "%s must not be empty", key);
            return -1;
        }
        if (!strcmp(key, "name")) spec->name = value;
        else if (!strcmp(key, "pattern")) spec->pattern = value;
        else spec->command = value;
    } else if (!strcmp(key, "method")) {
        if (strcmp(value, "strict") && strcmp(value, "flexible")) {
            snprintf(err, err_len, "method must be strict or flexible, not \"%s\"", value);
            return -1;
        }
        spec->flexible = strcmp(value, "flexible") == 0;
    } else if (!strcmp(key, "dotall") || !strcmp(key, "strip_think")) {
        if (strcmp(value, "true") && strcmp(value, "false")) {
            snprintf(err, err_len, "%s must be true or false, not \"%s\"", key, value);
            return -1;
        }
        int on = strcmp(value, "true") == 0;
        if (!strcmp(key, "dotall")) spec->dotall = on;
        else spec->strip_think = on;
    } else if (!strcmp(key, "clip_chars")) {
        if (!parse_double(value, &x) || x < 0 || x != floor(x) || x > 1e15) {
            snprintf(err, err_len, "clip_chars must be an integer >= 0, not \"%s\"", value);
            return -1;
        }
        spec->clip_chars = (int64_t)x;
    } else {
        if (!parse_double(value, &x)) {
            snprintf(err, err_len, "%s must be a finite number, not \"%s\"", key, value);
            return -1;
        }
        if ((!strcmp(key, "timeout") && x <= 0) || (!strcmp(key, "grace") && x < 0) ||
            (!strcmp(key, "memory_mb") && x < 0)) {
            snprintf(err, err_len, "%s must be %s 0 seconds, not %s", key, strcmp(key, "grace") ? ">" : ">=", value);
            return -1;
        }
        if (!strcmp(key, "weight")) spec->weight = x;
        else if (!strcmp(key, "score")) spec->score = x;
        else if (!strcmp(key, "format_score")) spec->format_score = x;
        else if (!strcmp(key, "timeout")) spec->timeout_s = x;
        else if (!strcmp(key, "memory_mb")) spec->memory_mb = x;
        else spec->grace_s = x;
    }
    return 1;
}

// ================================================================ the set

void reward_set_init(RewardSet *set, const RewardSpec *specs, int n) {
    memset(set, 0, sizeof *set);
    if (n < 0 || n > REWARD_MAX_SPECS) die("rewards: %d rewards given, at most %d are supported", n, REWARD_MAX_SPECS);
    for (int i = 0; i < n; i++) {
        RewardItem *it = &set->items[i];
        it->spec = specs[i];
        RewardSpec *s = &it->spec;
        if ((int)s->kind < 0 || (int)s->kind >= REWARD_KIND_COUNT) die("rewards[%d]: unknown reward kind %d", i, (int)s->kind);
        if (!isfinite(s->weight) || !isfinite(s->score) || !isfinite(s->format_score))
            die("rewards[%d] (%s): weight, score and format_score must be finite", i, reward_kind_name(s->kind));
        it->name = xstrdup(s->name ? s->name : reward_kind_name(s->kind));
        s->name = it->name;
        s->pattern = s->command = NULL;
        if (s->kind == REWARD_FORMAT) {
            it->pattern = xstrdup(specs[i].pattern ? specs[i].pattern : REWARD_FORMAT_DEFAULT_PATTERN);
            s->pattern = it->pattern;
            // Anchored at both ends: the whole response must match (Python's re.fullmatch).
            uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED | PCRE2_ENDANCHORED | (s->dotall ? PCRE2_DOTALL : 0);
            int err;
            PCRE2_SIZE off;
            pcre2_code *re = pcre2_compile((PCRE2_SPTR)it->pattern, PCRE2_ZERO_TERMINATED, opts, &err, &off, NULL);
            if (!re) {
                PCRE2_UCHAR msg[256];
                pcre2_get_error_message(err, msg, sizeof msg);
                die("rewards[%d] (format): pattern \"%s\" does not compile at offset %zu: %s", i, it->pattern,
                    (size_t)off, (char *)msg);
            }
            pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  // best effort: the interpreter gives the same matches
            it->regex = re;
            it->match_data = pcre2_match_data_create_from_pattern(re, NULL);
            if (!it->match_data) die("out of memory compiling a format reward regex");
        }
        if (s->kind == REWARD_PROGRAM) {
            if (!specs[i].command || !*specs[i].command) die("rewards[%d] (program): no command given", i);
            if (!(s->timeout_s > 0) || !(s->grace_s >= 0)) die("rewards[%d] (program): timeout must be > 0 and grace >= 0", i);
            it->command = xstrdup(specs[i].command);
            s->command = it->command;
            it->program = xmalloc(sizeof *it->program);
            program_init(it->program, it->command, s->timeout_s, s->grace_s, s->memory_mb);
        }
        set->n = i + 1;
    }
}

static int format_matches(const RewardItem *it, const char *response) {
    // A match error (invalid UTF-8, match limit) counts as no match.
    int rc = pcre2_match((const pcre2_code *)it->regex, (PCRE2_SPTR)response, strlen(response), 0, 0,
                         (pcre2_match_data *)it->match_data, NULL);
    return rc >= 0;
}

const char *reward_after_think(const char *response) {
    const char *close = NULL;
    for (const char *p = strstr(response, "</think>"); p; p = strstr(p + 1, "</think>")) close = p;
    if (close) return close + strlen("</think>");
    return strstr(response, "<think>") ? "" : response;
}

// The program reward's request {"prompt", "response", "answer"[, "messages"][, "extra_info"]}, with the
// strings made valid UTF-8 (U+FFFD); messages and extra_info are JSON already.
static char *program_request(const char *prompt, const char *response, const char *answer, const char *messages,
                             const char *extra_info, size_t *len) {
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    if (!f) die("open_memstream failed: %s", strerror(errno));
    const char *keys[3] = {"prompt", "response", "answer"}, *vals[3] = {prompt, response, answer};
    fputc('{', f);
    for (int i = 0; i < 3; i++) {
        Buf clean = {0};
        utf8_append_lossy(&clean, vals[i], strlen(vals[i]));
        fprintf(f, "%s\"%s\": ", i ? ", " : "", keys[i]);
        json_write_string(f, clean.data ? clean.data : "", clean.len);
        buf_free(&clean);
    }
    if (messages) fprintf(f, ", \"messages\": %s", messages);
    if (extra_info) {
        Buf clean = {0};  // a Parquet string may hold invalid UTF-8, which JSON cannot carry
        utf8_append_lossy(&clean, extra_info, strlen(extra_info));
        fprintf(f, ", \"extra_info\": %s", clean.data ? clean.data : "null");
        buf_free(&clean);
    }
    fputs("}\n", f);
    if (fclose(f) != 0) die("writing a reward request failed");
    *len = n;
    return text;
}

// The answer a scorer extracted, for majority votes: the first REWARD_PRED_MAX - 1 bytes of s.
static void set_pred(char *pred, const char *s) {
    snprintf(pred, REWARD_PRED_MAX, "%s", s);
}

// The program's reward, or 0 when the call fails (*ok = 0); its optional "acc" (true/false, 1/0) into *correct
// and "pred" (a string) into pred, as verl's compute_score dictionaries give them.
static double program_reward(Program *p, const RewardRow *row, const char *response, int *ok, int *correct,
                             char *pred) {
    size_t n;
    char *req = program_request(row->prompt, response, row->answer, row->messages, row->extra_info, &n);
    cJSON *reply = program_call(p, req, n);
    free(req);
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(reply, "reward");
    *ok = cJSON_IsNumber(r) && isfinite(r->valuedouble);
    double reward = *ok ? r->valuedouble : 0;
    const cJSON *acc = cJSON_GetObjectItemCaseSensitive(reply, "acc"), *pr = cJSON_GetObjectItemCaseSensitive(reply, "pred");
    if (*ok && cJSON_IsBool(acc)) *correct = cJSON_IsTrue(acc);
    if (*ok && cJSON_IsNumber(acc)) *correct = acc->valuedouble != 0;
    if (*ok && cJSON_IsString(pr)) set_pred(pred, pr->valuestring);
    if (reply && !*ok) {
        char *shown = cJSON_PrintUnformatted(reply);
        program_reject(p, "reply without a finite number \"reward\": %.40s", shown ? shown : "?");
        free(shown);
    }
    cJSON_Delete(reply);
    return reward;
}

// One spec's unweighted value; *correct is 1/0 for the correctness kinds (and a program that says), left alone
// otherwise; pred (REWARD_PRED_MAX bytes) gets the answer it extracted, when it has one.
static double item_score(const RewardItem *it, const RewardRow *row, const char *response, int *correct,
                         int *program_failed, char *pred) {
    const RewardSpec *s = &it->spec;
    const char *answer = row->answer;
    if (s->strip_think) response = reward_after_think(response);
    switch (s->kind) {
    case REWARD_GSM8K: {
        char *got = gsm8k_extract_solution(response, s->flexible, s->clip_chars);
        *correct = 0;
        if (!got) return 0;
        set_pred(pred, got);
        char *gt = gsm8k_ground_truth(answer);
        *correct = gsm8k_is_correct(got, gt);
        free(got);
        free(gt);
        return *correct ? s->score : s->format_score;
    }
    case REWARD_BOXED: {
        char *last = math_last_boxed_only_string(response);
        char *content = last ? math_remove_boxed(last) : NULL;
        free(last);
        *correct = 0;
        if (!content) return 0;  // verl: no box, or remove_boxed's assert (caught) -> 0
        set_pred(pred, content);
        *correct = math_is_correct(content, answer);
        free(content);
        return *correct ? s->score : s->format_score;
    }
    case REWARD_FORMAT: return format_matches(it, response) ? 1 : 0;
    case REWARD_EXACT: {
        size_t skip = strspn(response, " \t\n\r\f\v");
        set_pred(pred, response + skip);
        return (*correct = reward_exact_match(response, answer)) ? 1 : 0;
    }
    case REWARD_PROGRAM: {
        int ok;
        double r = program_reward(it->program, row, response, &ok, correct, pred);
        if (!ok) *program_failed += 1;
        return r;
    }
    default: return 0;
    }
}

int reward_rule_of_data_source(const char *data_source) {
    static const char *const boxed[] = {"lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"};
    if (!data_source) return -1;
    if (!strcmp(data_source, "openai/gsm8k")) return REWARD_GSM8K;
    for (size_t i = 0; i < sizeof boxed / sizeof *boxed; i++)
        if (!strcmp(data_source, boxed[i])) return REWARD_BOXED;
    return -1;
}

double reward_score(const RewardSet *set, const char *prompt, const char *response, const char *answer,
                    const char *messages, RewardDetail *detail) {
    RewardRow row = {prompt, answer, messages, NULL, -1};
    return reward_score_row(set, &row, response, detail);
}

double reward_score_row(const RewardSet *set, const RewardRow *row, const char *response, RewardDetail *detail) {
    RewardDetail d;
    memset(&d, 0, sizeof d);
    d.correct = -1;
    for (int i = 0; i < set->n; i++) {
        int c = -1;
        RewardKind kind = set->items[i].spec.kind;
        if (row->rule >= 0 && (kind == REWARD_GSM8K || kind == REWARD_BOXED) && (int)kind != row->rule) continue;
        char pred[REWARD_PRED_MAX] = "";
        double v = item_score(&set->items[i], row, response, &c, &d.program_failures, pred);
        if (!d.pred[0] && pred[0]) memcpy(d.pred, pred, sizeof pred);  // the first scorer's answer
        d.values[i] = v;
        d.total += set->items[i].spec.weight * v;
        if (c >= 0) d.correct = (d.correct == -1 ? 1 : d.correct) && c;
    }
    if (detail) *detail = d;
    return d.total;
}

void reward_set_free(RewardSet *set) {
    for (int i = 0; i < set->n; i++) {
        RewardItem *it = &set->items[i];
        if (it->program) {
            program_free(it->program);
            free(it->program);
        }
        if (it->match_data) pcre2_match_data_free((pcre2_match_data *)it->match_data);
        if (it->regex) pcre2_code_free((pcre2_code *)it->regex);
        free(it->name);
        free(it->pattern);
        free(it->command);
    }
    memset(set, 0, sizeof *set);
}

const char *reward_last_error(const RewardSet *set) {
    for (int i = 0; i < set->n; i++)
        if (set->items[i].program && set->items[i].program->last_error[0]) return set->items[i].program->last_error;
    return "another rank's program";
}
