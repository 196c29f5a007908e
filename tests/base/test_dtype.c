// dtype conversions against outside peers: the compiler's own _Float16 for F16, and the
// definition of round-to-nearest-even (checked in double) for BF16.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/dtype.h"
#include "base/rng.h"

static int failures = 0;
#define CHECK(cond, ...)                 \
    do {                                 \
        if (!(cond)) {                   \
            failures++;                  \
            fprintf(stderr, __VA_ARGS__); \
            fputc('\n', stderr);         \
        }                                \
    } while (0)

static void test_f16_all_values(void) {
    for (uint32_t h = 0; h < 65536; h++) {
        _Float16 ref;
        uint16_t bits = (uint16_t)h;
        memcpy(&ref, &bits, 2);
        float want = (float)ref, got = f16_to_f32(bits);
        if (isnan(want)) CHECK(isnan(got), "f16 %04x: want NaN", h);
        else CHECK(memcmp(&want, &got, 4) == 0, "f16 %04x: got %g want %g", h, got, want);
    }
}

// f32 -> f16 (the fp16 compute copy and fp16 gradients) against the compiler's conversion.
static void test_f32_to_f16(void) {
    Rng rng;
    rng_init(&rng, 11);
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)rng_next_u64(&rng);
        if (i % 2) u = (u & 0x8fffffffu) | 0x30000000u;  // half the draws near f16's range
        float f;
        memcpy(&f, &u, 4);
        _Float16 ref = (_Float16)f;
        uint16_t want, got = f32_to_f16(f);
        memcpy(&want, &ref, 2);
        if (isnan(f)) CHECK((got & 0x7c00) == 0x7c00 && (got & 0x3ff), "f32 %08x: want a NaN, got %04x", u, got);
        else CHECK(got == want, "f32 %08x (%g): f16 %04x, want %04x", u, f, got, want);
    }
    const float edges[] = {65504.0f, 65519.99f, 65520.0f, 1e30f, 5.9604645e-8f, 2.9802322e-8f, 2.98023259e-8f, 6.1035156e-5f};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        _Float16 ref = (_Float16)edges[i];
        uint16_t want;
        memcpy(&want, &ref, 2);
        CHECK(f32_to_f16(edges[i]) == want, "f32 %g: f16 %04x, want %04x", edges[i], f32_to_f16(edges[i]), want);
    }
}

static void test_bf16_round_trip_and_rounding(void) {
    for (uint32_t h = 0; h < 65536; h++) {  // every bf16 value survives f32 and back
        float f = bf16_to_f32((uint16_t)h);
        if (!isnan(f)) CHECK(f32_to_bf16(f) == h, "bf16 %04x does not round-trip", h);
    }
    Rng rng;
    rng_init(&rng, 7);
    for (int i = 0; i < 1000000; i++) {
        uint32_t u = (uint32_t)rng_next_u64(&rng);
        float f;
        memcpy(&f, &u, 4);
        if (isnan(f) || isinf(f)) continue;
        uint16_t r = f32_to_bf16(f);
        // The two bf16 neighbours of f are truncation and truncation + 1 ulp (same sign).
        uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
        double d = f, dlo = bf16_to_f32(lo), dhi = bf16_to_f32(hi);
        if ((hi & 0x7fff) == 0x7f80) dhi = copysign(ldexp(1.0, 128), d);  // IEEE: round as if 2^128 existed
        double elo = fabs(d - dlo), ehi = fabs(dhi - d);
        uint16_t want = elo < ehi ? lo : ehi < elo ? hi : ((lo & 1) ? hi : lo);
        CHECK(r == want, "f32 %08x: bf16 %04x, want %04x", u, r, want);
    }
}

int main(void) {
    test_f16_all_values();
    test_bf16_round_trip_and_rounding();
    test_f32_to_f16();
    printf("test_dtype: %s\n", failures ? "FAILED" : "ok");
    return failures != 0;
}
