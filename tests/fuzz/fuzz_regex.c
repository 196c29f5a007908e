// guided_regex's compiler on an arbitrary pattern (the whole input, as a request's 16 KiB at most): it must
// refuse with a reason or give an automaton whose start reaches a match within its dist, each state's table
// in range, and a walk over the input itself that stays in range; its longest match no shorter than its shortest,
// and its product with itself (regex_intersect) of the same shortest match (or too large). An odd first byte
// compiles it as REGEX_ECMA.
#include <stdlib.h>

#include "fuzz.h"
#include "rollout/regex_dfa.h"

static void body(const uint8_t *data, size_t size, void *ctx) {
    (void)ctx;
    if (size > (16 << 10)) return;
    RegexDfa d;
    int flags = size && data[0] & 1 ? REGEX_ECMA : 0;
    char *err = regex_compile((const char *)data, size, flags, NULL, &d);
    if (err) {
        if (!err[0]) fuzz_fail("refused without a reason");
        free(err);
        return;
    }
    for (int s = 0; s < d.n; s++) {
        if (d.dist[s] < 0 || d.dist[s] > d.n) fuzz_fail("a state's distance to a match is out of range");
        for (int c = 0; c < d.n_cls; c++) {
            int32_t to = d.next[(size_t)s * (size_t)d.n_cls + (size_t)c];
            if (to < -1 || to >= d.n) fuzz_fail("a transition out of range");
            if (to >= 0 && d.dist[s] > d.dist[to] + 1) fuzz_fail("a distance longer than a step and its target's");
        }
    }
    regex_walk(&d, 0, (const char *)data, size);
    int64_t most = regex_longest(&d);
    if (most >= 0 && most < d.dist[0]) fuzz_fail("the longest match is shorter than the shortest");
    RegexDfa same;  // the product with itself matches what it does: the same shortest match
    char *why = regex_intersect(&d, &d, NULL, &same);
    if (!why && same.dist[0] != d.dist[0]) fuzz_fail("the product with itself has another shortest match");
    if (!why) regex_free(&same);
    free(why);
    regex_free(&d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_run(body, data, size, NULL);
    return 0;
}
