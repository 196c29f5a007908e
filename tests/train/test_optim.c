// Loss-scale manager and the non-finite gradient check that decides whether a step is skipped.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "train/optim.h"

static int failures = 0;
#define CHECK(cond, ...)                  \
    do {                                  \
        if (!(cond)) {                    \
            failures++;                   \
            fprintf(stderr, __VA_ARGS__); \
            fputc('\n', stderr);          \
        }                                 \
    } while (0)

int main(void) {
    // An injected inf or NaN anywhere in a large slab is found (the check runs in parallel chunks).
    size_t n = 1000003;
    float *g = calloc(n, sizeof *g);
    if (!g) return 1;
    CHECK(grad_all_finite(g, n), "a zero slab reads as non-finite");
    size_t where[] = {0, n / 2, n - 1};
    for (size_t i = 0; i < 3; i++) {
        g[where[i]] = INFINITY;
        CHECK(!grad_all_finite(g, n), "inf at %zu not found", where[i]);
        g[where[i]] = NAN;
        CHECK(!grad_all_finite(g, n), "NaN at %zu not found", where[i]);
        g[where[i]] = 0.0f;
    }
    free(g);

    // Dynamic scale: halves on each overflow, doubles after `window` clean steps in a row.
    LossScaler s = {1024.0, 3, 0};
    loss_scaler_update(&s, 1);
    CHECK(s.scale == 512.0 && s.good == 0, "overflow: scale %g, want 512", s.scale);
    loss_scaler_update(&s, 0);
    loss_scaler_update(&s, 0);
    CHECK(s.scale == 512.0 && s.good == 2, "two clean steps: scale %g good %lld", s.scale, (long long)s.good);
    loss_scaler_update(&s, 1);
    CHECK(s.scale == 256.0 && s.good == 0, "overflow resets the clean count: scale %g", s.scale);
    for (int i = 0; i < 3; i++) loss_scaler_update(&s, 0);
    CHECK(s.scale == 512.0 && s.good == 0, "window of clean steps: scale %g, want 512", s.scale);
    // Static scale (window 0) never moves.
    LossScaler f = {1024.0, 0, 0};
    loss_scaler_update(&f, 1);
    loss_scaler_update(&f, 0);
    CHECK(f.scale == 1024.0, "static scale moved to %g", f.scale);

    printf("test_optim: %s\n", failures ? "FAILED" : "ok");
    return failures != 0;
}
