// Int8 weights for decode (model/decoder.h's DecoderQ8).
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "model/decoder.h"
#include "nn/q8.h"
#include "nn/skinny.h"

// q's tensor table for config c with layout w: each quantized tensor's slab offset, elements and first block.
// Returns the input scratch's blocks (SKINNY_MAX_ROWS rows of the widest input), or 0 when an input width is
// not a multiple of Q8_BLOCK.
static size_t q8_layout(DecoderQ8 *q, const DecoderConfig *c, const DecoderLayout *w) {
    int64_t L = c->layers, C = c->hidden, Q = c->heads * c->head_dim, KV = c->kv_heads * c->head_dim, widest = 0;
    const size_t off[DECODER_Q8_TENSORS] = {w->wq, w->wk, w->wv, w->wo, w->wgate, w->wup, w->wdown, w->lm_head};
    const int64_t rows[DECODER_Q8_TENSORS] = {L * Q, L * KV, L * KV, L * C, L * c->inter, L * c->inter, L * C, c->vocab};
    const int64_t cols[DECODER_Q8_TENSORS] = {C, C, C, Q, C, C, c->inter, C};
    memset(q, 0, sizeof *q);
    for (int i = 0; i < DECODER_Q8_TENSORS; i++) {
        if (cols[i] % Q8_BLOCK) return 0;
        q->off[i] = off[i];
        q->n[i] = (size_t)(rows[i] * cols[i]);
        q->first[i] = q->n_blocks;
        q->n_blocks += q->n[i] / Q8_BLOCK;
        widest = cols[i] > widest ? cols[i] : widest;
    }
    return (size_t)(SKINNY_MAX_ROWS * widest / Q8_BLOCK);
}

size_t decoder_q8_bytes(const DecoderConfig *c) {
    DecoderLayout w;
    DecoderQ8 q;
    decoder_layout(c, &w);
    size_t scratch = q8_layout(&q, c, &w);
    return scratch ? q.n_blocks * sizeof(Q8Block) + scratch * sizeof(Q8In) : 0;
}

void decoder_q8_init(DecoderQ8 *q, const Decoder *m, const char *what) {
    const DecoderConfig *c = &m->cfg;
    if (m->be->on_device)
        die("%s: int8 weights run on the CPU only (%s computes in bf16)", what, m->be->name);
    size_t scratch = q8_layout(q, c, &m->w);
    if (!scratch)
        die("%s: int8 weights need the hidden (%lld), attention (%lld) and intermediate (%lld) sizes to be "
            "multiples of %d", what, (long long)c->hidden, (long long)(c->heads * c->head_dim), (long long)c->inter,
            Q8_BLOCK);
    q->blocks = xmalloc(q->n_blocks * sizeof *q->blocks);
    q->xq = xmalloc(scratch * sizeof *q->xq);
}

void decoder_q8_quantize(DecoderQ8 *q, const Decoder *m) {
    for (int i = 0; i < DECODER_Q8_TENSORS; i++)  // one row of all its values: every row a whole number of blocks
        q8_quantize(q->blocks + q->first[i], decoder_at(m, q->off[i]), m->dtype, 1, (int64_t)q->n[i]);
}

const Q8Block *decoder_q8_at(const DecoderQ8 *q, size_t off) {
    for (int i = 0; i < DECODER_Q8_TENSORS; i++)
        if (off >= q->off[i] && off < q->off[i] + q->n[i]) return q->blocks + q->first[i] + (off - q->off[i]) / Q8_BLOCK;
    die("internal: no int8 copy of slab offset %zu", off);
}

void decoder_q8_free(DecoderQ8 *q) {
    free(q->blocks);
    free(q->xq);
    memset(q, 0, sizeof *q);
}
