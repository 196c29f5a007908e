#include "model/vl_rope.h"

#include <math.h>

int vl_rope_index(const int32_t *ids, int64_t n, int32_t image_pad, const int (*grids)[3], int n_images, int merge,
                  int32_t *pos3, int64_t *delta) {
    int64_t i = 0, next = 0;  // next: the position after the last one given
    int k = 0;
    while (i < n) {
        if (ids[i] != image_pad) {
            for (int s = 0; s < 3; s++) pos3[s * n + i] = (int32_t)next;
            next++;
            i++;
            continue;
        }
        if (k == n_images) return -1;  // pads without an image
        if (merge < 1 || grids[k][0] < 1 || grids[k][1] < merge || grids[k][2] < merge || grids[k][1] % merge ||
            grids[k][2] % merge)
            return -1;
        int t = grids[k][0], h = grids[k][1] / merge, w = grids[k][2] / merge;
        int64_t run = (int64_t)t * h * w, top = 0;
        if (i + run > n) return -1;
        for (int64_t j = 0; j < run; j++) {
            if (ids[i + j] != image_pad) return -1;
            int64_t r = (j / w) % h, c = j % w;
            pos3[i + j] = (int32_t)next;  // an image's time position: 0 (images are one still frame)
            pos3[n + i + j] = (int32_t)(next + r);
            pos3[2 * n + i + j] = (int32_t)(next + c);
            top = r > top ? r : top;
            top = c > top ? c : top;
        }
        next += top + 1;
        i += run;  // pads right after are the next image's (as transformers splits them)
        k++;
    }
    if (k != n_images) return -1;
    *delta = next - n;
    return 0;
}

void vl_rope_table(float *cs, const int32_t *pos3, int64_t N, int D, double theta, const int section[3]) {
    int half = D / 2;
    for (int64_t row = 0; row < N; row++) {
        float *c = cs + row * D;
        for (int i = 0, s = 0, end = section[0]; i < half; i++) {
            while (i >= end && s < 2) end += section[++s];
            double a = (double)pos3[s * N + row] * pow(theta, -2.0 * i / D);  // as rope_table
            c[i] = (float)cos(a);
            c[half + i] = (float)sin(a);
        }
    }
}
