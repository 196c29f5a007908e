// M-RoPE, the multimodal rotary embedding of Qwen2-VL and Qwen2.5-VL's language model: each token has three
// positions (time, row, column); rope dimension pair i takes its angle from one of them, chosen by
// mrope_section (Qwen2.5-VL-7B: [16, 24, 24] pairs of a 128-wide head). Text tokens have three equal positions,
// so on text M-RoPE is plain RoPE.
#pragma once
#include <stdint.h>

// transformers' get_rope_index for images (Qwen2.5-VL, no video): text positions count on from the last
// position; the image_pad tokens of image k (grid t, h, w in patches: the next t * h * w / merge^2 pads) take
// (the text position before them + 1) + (0, row, column) over its merged grid. pos3: 3 rows of n (time, row,
// column). *delta: max position + 1 - n, what decode adds to a token's index. Returns 0, or -1 when the pads
// do not match the grids (a run cut short, pads or grids left over).
int vl_rope_index(const int32_t *ids, int64_t n, int32_t image_pad, const int (*grids)[3], int n_images, int merge,
                  int32_t *pos3, int64_t *delta);
// cs (N, D): rope_table's layout (the cosines of the D/2 angles, then their sines) for three positions per
// row: pair i uses position pos3[s * N + row] with s its section of `section` (3 counts summing to D/2).
void vl_rope_table(float *cs, const int32_t *pos3, int64_t N, int D, double theta, const int section[3]);
