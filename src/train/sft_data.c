#include "train/sft_data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/util.h"
#include "text/chat.h"
#include "text/tokenizer.h"

typedef struct {
    JsonlReader r;  // the file, its current line and that line's U+0000 sentinel
    const char *path, *model_dir;
    Tokenizer tok;
    int tok_loaded;
} Loader;

static void read_ids(Loader *L, const cJSON *arr, const char *key, int64_t vocab, IdList *out) {
    if (!cJSON_IsArray(arr))
        die("%s:%lld: \"%s\" must be a list of token ids", L->path, (long long)L->r.line, key);
    int64_t i = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++) {
        int64_t v;
        if (!json_as_int(e, 0, vocab - 1, &v))
            die("%s:%lld: \"%s\"[%lld] is not a token id in [0, %lld)", L->path, (long long)L->r.line, key,
                (long long)i, (long long)vocab);
        idlist_push(out, (int32_t)v);
    }
}

static void encode_text(Loader *L, const cJSON *item, const char *key, int chat, IdList *out) {
    if (!cJSON_IsString(item)) die("%s:%lld: \"%s\" must be a string", L->path, (long long)L->r.line, key);
    if (!L->tok_loaded) {
        char *tj = path_join(L->model_dir, "tokenizer.json");
        if (!file_exists(tj))
            die("%s:%lld: text lines need a tokenizer: %s does not exist (or give prompt_ids/completion_ids)", L->path,
                (long long)L->r.line, tj);
        tokenizer_load(&L->tok, tj);
        free(tj);
        L->tok_loaded = 1;
    }
    size_t n, bad_offset;
    char *text = json_string_bytes(item, L->r.nul, &n);
    if (chat_encode_prompt(&L->tok, text, n, chat, NULL, out, &bad_offset) != 0)
        die("%s:%lld: \"%s\" is not valid UTF-8 (byte %zu)", L->path, (long long)L->r.line, key, bad_offset);
    free(text);
}

void sft_data_load(SftData *d, const char *path, const char *key, const char *model_dir, const Qwen2Config *c,
                   int64_t max_length) {
    memset(d, 0, sizeof *d);
    d->path = xstrdup(path);
    Loader L = {.path = path, .model_dir = model_dir};
    jsonl_open(&L.r, path, key);
    size_t n_cap = 0;
    for (cJSON *root; (root = jsonl_next(&L.r));) {
        int64_t line = L.r.line;
        const cJSON *pi = cJSON_GetObjectItemCaseSensitive(root, "prompt_ids");
        const cJSON *ci = cJSON_GetObjectItemCaseSensitive(root, "completion_ids");
        IdList ids = {0};
        int64_t plen;
        if (pi || ci) {
            read_ids(&L, pi, "prompt_ids", c->vocab, &ids);
            plen = (int64_t)ids.n;
            read_ids(&L, ci, "completion_ids", c->vocab, &ids);
        } else {
            const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
            const cJSON *comp = cJSON_GetObjectItemCaseSensitive(root, "completion");
            if (!p || !comp)
                die("%s:%lld: a line needs \"prompt\" and \"completion\" (or \"prompt_ids\" and \"completion_ids\")",
                    path, (long long)line);
            encode_text(&L, p, "prompt", 1, &ids);
            plen = (int64_t)ids.n;
            encode_text(&L, comp, "completion", 0, &ids);
            if ((int64_t)ids.n == plen) die("%s:%lld: the completion is empty", path, (long long)line);
            int32_t eos = L.tok.eos_id >= 0 ? L.tok.eos_id : (int32_t)c->eos_id;
            if (eos < 0) die("%s: no eos token in tokenizer_config.json or config.json to end completions", model_dir);
            idlist_push(&ids, eos);
            for (size_t i = 0; i < ids.n; i++)
                if (ids.ids[i] >= c->vocab)
                    die("%s:%lld: token id %d does not fit the model's vocab_size %lld", path, (long long)line,
                        ids.ids[i], (long long)c->vocab);
        }
        if (plen == 0)
            die("%s:%lld: the prompt is empty (the first completion token needs a token before it)", path,
                (long long)line);
        if ((int64_t)ids.n == plen) die("%s:%lld: the completion is empty", path, (long long)line);
        if ((int64_t)ids.n > max_length) {
            if (plen >= max_length)
                die("%s:%lld: the prompt alone has %lld tokens, --max-length is %lld", path, (long long)line,
                    (long long)plen, (long long)max_length);
            ids.n = (size_t)max_length;
            d->n_truncated++;
        }
        if ((size_t)d->n == n_cap) {
            n_cap = n_cap ? 2 * n_cap : 64;
            d->s = xrealloc(d->s, n_cap * sizeof *d->s);
        }
        d->s[d->n++] = (SftSample){ids.ids, (int64_t)ids.n, plen, line};
        cJSON_Delete(root);
    }
    jsonl_close(&L.r);
    if (L.tok_loaded) tokenizer_free(&L.tok);
    if (d->n == 0) die("%s: no samples (the file is empty)", path);
}

void sft_data_free(SftData *d) {
    for (int64_t i = 0; i < d->n; i++) free(d->s[i].ids);
    free(d->s);
    free(d->path);
    memset(d, 0, sizeof *d);
}
