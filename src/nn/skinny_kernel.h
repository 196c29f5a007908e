// The skinny kernel, written once and included by each level's file (skinny.c, skinny_avx512.c,
// skinny_avx512bf16.c), which first defines what differs:
//   SKINNY_BLOCK        the name of the block function this defines (nn/skinny.h's skinny_block_*), and
//   SKINNY_ROWS         of its static helper (a file may include this twice)
//   SkElem              the stored element (uint16_t for bf16, float), sk_f32(e) its value
//   SkIn                the inputs' element, when it is not SkElem (Q8_0's blocks)
//   SkVec, sk_zero()    the fp32 accumulator vector; SK_STEP elements a load, feeding SK_SUMS sums
//   SkW, sk_load_w(p)   SK_STEP weights loaded (and widened, where the level widens)
//   sk_mac(a, w, p)     adds the products of SK_STEP inputs at p with w into a[0 .. SK_SUMS-1]
//   sk_reduce(v)        v's lanes summed, in a fixed order
//   SK_ROWS             input rows a weight row serves at once (4; 2 where 16 registers are all there are)
// Each weight row streams once per SK_ROWS input rows (one weight row at a time: on the CPUs measured, four
// interleaved ones read memory at 60% down to a third of the speed), in steps of U loads that keep four
// independent sums a row: one sum's chain of adds waits on the add latency, which reads a core's memory at
// half its speed or less. A row's sums are the same whatever rows it is computed with, so a sequence
// decodes to the same numbers alone or in a batch.

#ifndef SkIn
#define SkIn SkElem
#endif

// Output column o of input rows b0 .. b0+R-1 (R 1, 2 or 4, a literal at each call: each gets its own
// unrolled loop) from weight row w.
static inline __attribute__((always_inline)) void SKINNY_ROWS(float *out, const SkIn *inp, const SkElem *w,
                                                              const SkElem *bias, int64_t o, int64_t b0, int R,
                                                              int64_t C, int64_t OC) {
    enum { U = 4 / SK_SUMS };
    int64_t cv = C - C % SK_STEP, c = 0;
    SkVec a[4][U][SK_SUMS];
    for (int b = 0; b < R; b++)
        for (int u = 0; u < U; u++)
            for (int s = 0; s < SK_SUMS; s++) a[b][u][s] = sk_zero();
    for (; c + U * SK_STEP <= cv; c += U * SK_STEP)
        for (int u = 0; u < U; u++) {
            SkW wv = sk_load_w(w + c + u * SK_STEP);
            for (int b = 0; b < R; b++) sk_mac(a[b][u], wv, inp + (b0 + b) * C + c + u * SK_STEP);
        }
    for (; c < cv; c += SK_STEP) {  // fewer than U loads left: into the first sums (a[b][u] with a variable u
                                    // would keep a in memory)
        SkW wv = sk_load_w(w + c);
        for (int b = 0; b < R; b++) sk_mac(a[b][0], wv, inp + (b0 + b) * C + c);
    }
    for (int b = 0; b < R; b++) {
        const SkIn *x = inp + (b0 + b) * C;
        SkVec v = a[b][0][0];
        for (int u = 0; u < U; u++)
            for (int s = u == 0; s < SK_SUMS; s++) v += a[b][u][s];
        float sum = sk_reduce(v);
        for (int64_t k = cv; k < C; k++) sum += sk_f32(x[k]) * sk_f32(w[k]);
        out[(b0 + b) * OC + o] = sum + (bias ? sk_f32(bias[o]) : 0.0f);
    }
}

// Output columns o0 .. o0+3 (those < OC) of all N rows.
void SKINNY_BLOCK(float *out, const SkIn *inp, const SkElem *weight, const SkElem *bias, int64_t o0, int64_t N,
                  int64_t C, int64_t OC) {
    for (int64_t o = o0; o < o0 + 4 && o < OC; o++) {
        const SkElem *w = weight + o * C;
        int64_t b0 = 0;
        for (; SK_ROWS == 4 && b0 + 4 <= N; b0 += 4) SKINNY_ROWS(out, inp, w, bias, o, b0, 4, C, OC);
        for (; b0 + 2 <= N; b0 += 2) SKINNY_ROWS(out, inp, w, bias, o, b0, 2, C, OC);
        if (b0 < N) SKINNY_ROWS(out, inp, w, bias, o, b0, 1, C, OC);
    }
}

#undef SKINNY_BLOCK
#undef SKINNY_ROWS
#undef SkElem
#undef SkIn
#undef sk_f32
#undef SkVec
#undef sk_zero
#undef SK_STEP
#undef SK_SUMS
#undef SkW
#undef sk_load_w
#undef sk_mac
#undef sk_reduce
#undef SK_ROWS
