// A vision-language batch's image inputs: M-RoPE's rotation table and the rows image features replace.
#include "model/decoder.h"

#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "model/vl_rope.h"

int decoder_vl_inputs(const Decoder *m, const int32_t *tokens, const int64_t *seq_off, int B, const int64_t *prompt_len,
                    const float *const *feats, const int (*const *grids)[3], const int *n_images, int merge,
                    DecoderVlInputs *in) {
    const DecoderConfig *c = &m->cfg;
    int64_t N = seq_off[B], D = c->head_dim, longest = 0;
    int32_t pad = (int32_t)c->image_pad_id;
    memset(in, 0, sizeof *in);
    in->N = N;
    in->rope = xmalloc((size_t)(N * D) * sizeof *in->rope + 1);
    in->image_rows = xmalloc((size_t)N * sizeof *in->image_rows + 1);
    in->image_feats = xmalloc((size_t)N * sizeof *in->image_feats + 1);
    in->delta = xmalloc((size_t)B * sizeof *in->delta + 1);
    for (int b = 0; b < B; b++)
        if (seq_off[b + 1] - seq_off[b] > longest) longest = seq_off[b + 1] - seq_off[b];
    int32_t *pos3 = xmalloc((size_t)(3 * longest) * sizeof *pos3 + 1);
    for (int b = 0; b < B; b++) {
        int64_t lo = seq_off[b], n = seq_off[b + 1] - lo, np = prompt_len ? prompt_len[b] : n;
        if (vl_rope_index(tokens + lo, np, pad, grids[b], n_images[b], merge, pos3, &in->delta[b]) != 0) {
            free(pos3);
            decoder_vl_inputs_free(in);
            return -1;
        }
        // pos3 is 3 rows of n: the prompt's positions move to their rows' places, the response's count on
        for (int s = 2; s >= 0; s--) {
            memmove(pos3 + s * n, pos3 + s * np, (size_t)np * sizeof *pos3);
            for (int64_t i = np; i < n; i++) pos3[s * n + i] = (int32_t)(i + in->delta[b]);
        }
        vl_rope_table(in->rope + lo * D, pos3, n, (int)D, c->rope.theta, c->mrope_section);
        for (int64_t i = lo, k = 0; i < lo + np; i++)  // the prompt's pads, in order, are the features' rows
            if (tokens[i] == pad) {
                in->image_rows[in->n_image_rows] = i;
                in->image_feats[in->n_image_rows++] = feats[b] + (k++) * c->hidden;
            }
    }
    free(pos3);
    return 0;
}

void decoder_vl_inputs_free(DecoderVlInputs *in) {
    free(in->rope);
    free(in->image_rows);
    free(in->image_feats);
    free(in->image_grads);
    free(in->delta);
    memset(in, 0, sizeof *in);
}
