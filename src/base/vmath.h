// Row math that vectorises: e^x as a polynomial (the compiler turns the loops over it into SIMD code, where
// libm's expf is one call per element), and max / sum-of-exponentials over a row in 16 interleaved lanes,
// so the reduction order is fixed by the code (same bits with or without SIMD, on any CPU), not serial.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#define VMATH_LANES 16

// e^x within ~1 ulp (Cephes' expf polynomial after Cody-Waite reduction); 0 below -87 (where expf would
// give denormals), +inf above 88, NaN for NaN.
static inline float exp_approx(float x) {
    float xc = x < -87.0f ? -87.0f : x;
    xc = xc > 88.0f ? 88.0f : xc;
    float t = xc * 1.44269504088896341f + 12582912.0f;  // 1.5 * 2^23: rounds x / ln 2 to an integer n
    float n = t - 12582912.0f;
    float r = fmaf(n, -0.693359375f, xc);  // x - n ln 2, ln 2 split in two
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r) + 1.0f;
    uint32_t bits;
    memcpy(&bits, &t, 4);
    bits = (bits - 0x4B400000u + 127u) << 23;  // n + 127 in the exponent field: 2^n
    float scale;
    memcpy(&scale, &bits, 4);
    float y = p * scale;
    y = x < -87.0f ? 0.0f : y;
    y = x > 88.0f ? INFINITY : y;
    return x != x ? x : y;
}

// max_i x[i] (NaNs ignored unless all are NaN).
static inline float row_max(const float *x, int64_t n) {
    float lane[VMATH_LANES];
    for (int l = 0; l < VMATH_LANES; l++) lane[l] = -INFINITY;
    int64_t i = 0;
    for (; i + VMATH_LANES <= n; i += VMATH_LANES)
        for (int l = 0; l < VMATH_LANES; l++) lane[l] = x[i + l] > lane[l] ? x[i + l] : lane[l];
    for (int l = 0; i + l < n; l++) lane[l] = x[i + l] > lane[l] ? x[i + l] : lane[l];
    float mx = lane[0];
    for (int l = 1; l < VMATH_LANES; l++) mx = lane[l] > mx ? lane[l] : mx;
    return n > 0 && mx == -INFINITY && x[0] != x[0] ? x[0] : mx;
}

// out[i] = e^((x[i] - shift) * scale) (out may be x; NULL: not stored); returns their sum, accumulated in
// double per lane.
static inline double row_exp_sum(float *out, const float *x, int64_t n, float shift, float scale) {
    double lane[VMATH_LANES] = {0};
    int64_t i = 0;
    for (; i + VMATH_LANES <= n; i += VMATH_LANES)
        for (int l = 0; l < VMATH_LANES; l++) {
            float e = exp_approx((x[i + l] - shift) * scale);
            if (out) out[i + l] = e;
            lane[l] += e;
        }
    for (int l = 0; i + l < n; l++) {
        float e = exp_approx((x[i + l] - shift) * scale);
        if (out) out[i + l] = e;
        lane[l] += e;
    }
    double sum = 0.0;
    for (int l = 0; l < VMATH_LANES; l++) sum += lane[l];
    return sum;
}
