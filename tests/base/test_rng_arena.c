// RNG reproducibility and moments; arena alignment and accounting.
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "base/arena.h"
#include "base/rng.h"

int main(void) {
    int failures = 0;
    Rng a, b;
    rng_init(&a, 42);
    rng_init(&b, 42);
    for (int i = 0; i < 1000; i++) failures += rng_next_u64(&a) != rng_next_u64(&b);

    // Standard normal: mean 0, variance 1 within 5 standard errors for 1e6 draws.
    rng_init(&a, 1);
    double s = 0, s2 = 0, n = 1e6;
    for (int i = 0; i < (int)n; i++) {
        double x = rng_normal(&a);
        s += x;
        s2 += x * x;
    }
    double mean = s / n, var = s2 / n - mean * mean;
    if (fabs(mean) > 5 / sqrt(n) || fabs(var - 1) > 5 * sqrt(2 / n)) {
        failures++;
        fprintf(stderr, "normal: mean %g var %g\n", mean, var);
    }
    double u = 0;
    for (int i = 0; i < (int)n; i++) u += rng_next_float(&a);
    if (fabs(u / n - 0.5) > 5 * sqrt(1.0 / 12 / n)) {
        failures++;
        fprintf(stderr, "uniform mean %g\n", u / n);
    }

    Arena ar;
    arena_init(&ar, 1000);
    char *p = arena_alloc(&ar, 10), *q = arena_alloc(&ar, 100);
    failures += ((uintptr_t)p % 64) != 0 || ((uintptr_t)q % 64) != 0 || q - p != 64 || ar.used != 64 + 128;
    arena_reset(&ar);
    failures += ar.used != 0 || ar.peak != 192;
    arena_free(&ar);
    printf("test_rng_arena: %s\n", failures ? "FAILED" : "ok");
    return failures != 0;
}
