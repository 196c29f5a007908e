// grad_tool MODEL_DIR IN.json OUT.safetensors [--recompute] [--fused]
// Runs decoder_train_forward + decoder_backward on the sequences of IN.json
// ({"tokens": [[...]], "targets": [[...]], "dlogp": [[...]]}, optionally "dent": [[...]], the
// weights of each row's entropy in the loss, and "logit_scale": s) and writes "logp" (N),
// "entropy" (N, with dent) and "grad.<HF name>" for every parameter tensor, so grad_parity.py can
// compare with PyTorch autograd.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "base/json.h"
#include "base/util.h"
#include "io/safetensors.h"
#include "model/decoder.h"

static const cJSON *list_at(const cJSON *root, const char *key, int b, int *len) {
    const cJSON *it = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, key), b);
    if (!cJSON_IsArray(it)) die("IN.json: \"%s\"[%d] is not a list", key, b);
    *len = cJSON_GetArraySize(it);
    return it;
}

int main(int argc, char **argv) {
    if (argc < 4) die("usage: grad_tool MODEL_DIR IN.json OUT.safetensors [--recompute] [--fused]");
    int recompute = 0, fused = 0;
    for (int i = 4; i < argc; i++) {
        if (strcmp(argv[i], "--recompute") == 0) recompute = 1;
        else if (strcmp(argv[i], "--fused") == 0) fused = 1;
        else die("grad_tool: unknown option %s", argv[i]);
    }
    Decoder m;
    decoder_load(&m, argv[1], DTYPE_F32);
    cJSON *root = json_load_file(argv[2], SIZE_MAX);
    int B = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(root, "tokens"));
    int64_t *seq_off = xcalloc((size_t)B + 1, sizeof *seq_off), max_seq = 1;
    for (int b = 0; b < B; b++) {
        int len;
        list_at(root, "tokens", b, &len);
        seq_off[b + 1] = seq_off[b] + len;
        max_seq = len > max_seq ? len : max_seq;
    }
    int64_t N = seq_off[B];
    int32_t *tokens = xmalloc((size_t)N * 4), *targets = xmalloc((size_t)N * 4);
    float *dlogp = xmalloc((size_t)N * 4), *logp = xmalloc((size_t)N * 4), *ent = xmalloc((size_t)N * 4);
    int has_dent = cJSON_GetObjectItemCaseSensitive(root, "dent") != NULL;
    float *dent = has_dent ? xmalloc((size_t)N * 4) : NULL;
    for (int b = 0; b < B; b++) {
        int n1, n2, n3;
        const cJSON *tk = list_at(root, "tokens", b, &n1), *tg = list_at(root, "targets", b, &n2),
                    *dl = list_at(root, "dlogp", b, &n3);
        if (n1 != n2 || n1 != n3) die("IN.json: sequence %d: tokens, targets and dlogp differ in length", b);
        for (int i = 0; i < n1; i++) {
            tokens[seq_off[b] + i] = (int32_t)cJSON_GetArrayItem(tk, i)->valuedouble;
            targets[seq_off[b] + i] = (int32_t)cJSON_GetArrayItem(tg, i)->valuedouble;
            dlogp[seq_off[b] + i] = (float)cJSON_GetArrayItem(dl, i)->valuedouble;
        }
        if (!has_dent) continue;
        int n4;
        const cJSON *de = list_at(root, "dent", b, &n4);
        if (n4 != n1) die("IN.json: sequence %d: dent differs in length", b);
        for (int i = 0; i < n1; i++) dent[seq_off[b] + i] = (float)cJSON_GetArrayItem(de, i)->valuedouble;
    }
    Arena arena;
    arena_init(&arena, decoder_train_bytes(m.be, &m.cfg, m.dtype, N, max_seq, recompute));
    DecoderTrain t;
    decoder_train_init(&t, m.be, &m.cfg, m.dtype, N, max_seq, recompute, &arena);
    const cJSON *ls = cJSON_GetObjectItemCaseSensitive(root, "logit_scale");
    if (ls) t.logit_scale = (float)ls->valuedouble;
    float *grads = xcalloc(m.n_params, sizeof(float));
    if (fused && has_dent) die("grad_tool: --fused has no entropy term");
    if (fused) decoder_train_forward_fused(&m, grads, tokens, targets, seq_off, B, dlogp, &t, logp);
    else decoder_train_forward(&m, tokens, targets, seq_off, B, &t, logp, has_dent ? ent : NULL);
    decoder_backward(&m, grads, dlogp, dent, &t);

    Decoder gm = {.cfg = m.cfg, .dtype = DTYPE_F32, .params = grads, .n_params = m.n_params};
    decoder_layout(&m.cfg, &gm.w);
    int n = decoder_tensors(&gm, NULL);
    DecoderTensor *ts = xmalloc((size_t)n * sizeof *ts);
    decoder_tensors(&gm, ts);
    StWriteTensor *ws = xcalloc((size_t)n + 2, sizeof *ws);
    char (*names)[96] = xmalloc((size_t)n * sizeof *names);
    ws[0] = (StWriteTensor){.name = "logp", .ndim = 1, .shape = {N}, .data = logp};
    for (int i = 0; i < n; i++) {
        snprintf(names[i], sizeof names[i], "grad.%s", ts[i].name);
        ws[i + 1] = (StWriteTensor){.name = names[i], .ndim = ts[i].ndim, .data = ts[i].data};
        memcpy(ws[i + 1].shape, ts[i].shape, sizeof ts[i].shape);
    }
    if (has_dent) ws[n + 1] = (StWriteTensor){.name = "entropy", .ndim = 1, .shape = {N}, .data = ent};
    safetensors_write(argv[3], ws, n + 1 + has_dent, DTYPE_F32);
    fprintf(stderr, "grad_tool: %d sequences, %lld tokens, %d gradient tensors\n", B, (long long)N, n);
    free(names);
    free(ws);
    free(ts);
    free(grads);
    decoder_train_free(&t);
    arena_free(&arena);
    free(tokens);
    free(targets);
    free(dlogp);
    free(logp);
    free(ent);
    free(dent);
    free(seq_off);
    cJSON_Delete(root);
    decoder_free(&m);
    return 0;
}
