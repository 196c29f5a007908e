// vl_rope_tool: M-RoPE for tests/model/vision_test.py. Reads from stdin
//   N IMAGE_PAD MERGE N_IMAGES D THETA S0 S1 S2, then N_IMAGES x (t h w), then N token ids;
// prints "ok DELTA" (or "refused"), the three position rows, then N rows of vl_rope_table's D values and N
// rows of rope_table's over the time positions.
#include <stdio.h>
#include <stdlib.h>

#include "base/util.h"
#include "model/vl_rope.h"
#include "nn/ops.h"

int main(void) {
    long long n;
    int pad, merge, n_img, D, sec[3];
    double theta;
    if (scanf("%lld %d %d %d %d %lf %d %d %d", &n, &pad, &merge, &n_img, &D, &theta, &sec[0], &sec[1], &sec[2]) != 9 ||
        n < 1 || n > 1 << 20 || n_img < 0 || n_img > 64 || D < 2 || D > 1024)
        die("vl_rope_tool: bad header");
    int (*grids)[3] = xcalloc((size_t)n_img + 1, sizeof *grids);
    for (int k = 0; k < n_img; k++)
        if (scanf("%d %d %d", &grids[k][0], &grids[k][1], &grids[k][2]) != 3) die("vl_rope_tool: bad grid");
    int32_t *ids = xmalloc((size_t)n * sizeof *ids), *pos3 = xmalloc((size_t)n * 3 * sizeof *pos3);
    for (long long i = 0; i < n; i++)
        if (scanf("%d", &ids[i]) != 1) die("vl_rope_tool: bad ids");
    int64_t delta;
    if (vl_rope_index(ids, n, pad, (const int(*)[3])grids, n_img, merge, pos3, &delta) != 0) {
        puts("refused");
        free(ids), free(pos3), free(grids);
        return 0;
    }
    printf("ok %lld\n", (long long)delta);
    for (int s = 0; s < 3; s++) {
        for (long long i = 0; i < n; i++) printf(i ? " %d" : "%d", pos3[s * n + i]);
        putchar('\n');
    }
    float *cs = xmalloc((size_t)(n * D) * sizeof *cs), *plain = xmalloc((size_t)(n * D) * sizeof *plain);
    vl_rope_table(cs, pos3, n, D, theta, sec);
    rope_table(plain, pos3, n, D, (RopeFreqs){.theta = theta});
    for (int t = 0; t < 2; t++)
        for (long long i = 0; i < n; i++) {
            const float *row = (t ? plain : cs) + i * D;
            for (int j = 0; j < D; j++) printf(j ? " %.9g" : "%.9g", row[j]);
            putchar('\n');
        }
    free(cs), free(plain), free(ids), free(pos3), free(grids);
    return 0;
}
