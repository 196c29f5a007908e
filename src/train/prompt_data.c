#include "train/prompt_data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/util.h"
#include "text/chat.h"

static char *field_text(const cJSON *it, uint32_t nul, const char *path, int64_t line, const char *key) {
    size_t n;
    if (cJSON_IsString(it)) return json_string_bytes(it, nul, &n);
    if (cJSON_IsNumber(it)) {
        char *s = cJSON_PrintUnformatted(it);
        if (!s) die("out of memory");
        return s;
    }
    die("%s:%lld: \"%s\" must be a string%s", path, (long long)line, key, it ? "" : " (missing)");
}

// The line's tools_kwargs ({tool name: {...}}): extra_info.tools_kwargs (verl) or tools_kwargs; NULL if none.
static cJSON *tools_kwargs_of(cJSON *root, const char *path, int64_t line) {
    cJSON *extra = cJSON_GetObjectItemCaseSensitive(root, "extra_info");
    cJSON *kw = cJSON_IsObject(extra) ? cJSON_GetObjectItemCaseSensitive(extra, "tools_kwargs") : NULL;
    if (!kw) kw = cJSON_GetObjectItemCaseSensitive(root, "tools_kwargs");
    if (!kw || cJSON_IsNull(kw)) return NULL;
    if (!cJSON_IsObject(kw)) die("%s:%lld: \"tools_kwargs\" must be an object {tool name: {...}}", path, (long long)line);
    return cJSON_Duplicate(kw, 1);
}

void prompt_data_load(PromptData *d, const char *path, const char *key, const char *prompt_key,
                      const char *answer_key, Tokenizer *tok, int chat_template, const char *tools,
                      int64_t max_prompt_length) {
    memset(d, 0, sizeof *d);
    JsonlReader r;
    jsonl_open(&r, path, key);
    size_t n_cap = 0;
    for (cJSON *root; (root = jsonl_next(&r));) {
        int64_t line = r.line;
        const cJSON *prompt_item = cJSON_GetObjectItemCaseSensitive(root, prompt_key);
        const cJSON *answer_item = cJSON_GetObjectItemCaseSensitive(root, answer_key);
        char *prompt = field_text(prompt_item, r.nul, path, line, prompt_key);
        char *answer = field_text(answer_item, r.nul, path, line, answer_key);
        IdList ids = {0};
        size_t bad_offset;
        if (chat_encode_prompt(tok, prompt, strlen(prompt), chat_template, tools, &ids, &bad_offset) != 0)
            die("%s:%lld: \"%s\" is not valid UTF-8", path, (long long)line, prompt_key);
        if (ids.n == 0) die("%s:%lld: the prompt is empty", path, (long long)line);
        if ((int64_t)ids.n > max_prompt_length)
            die("%s:%lld: the prompt has %zu tokens, max_prompt_length is %lld", path, (long long)line, ids.n,
                (long long)max_prompt_length);
        if ((size_t)d->n == n_cap) {
            n_cap = n_cap ? 2 * n_cap : 64;
            d->s = xrealloc(d->s, n_cap * sizeof *d->s);
        }
        d->s[d->n++] = (PromptSample){prompt, answer, ids.ids, (int64_t)ids.n, line, tools_kwargs_of(root, path, line)};
        cJSON_Delete(root);
    }
    jsonl_close(&r);
    if (d->n == 0) die("%s: no prompts (the file is empty)", path);
}

void prompt_data_free(PromptData *d) {
    for (int64_t i = 0; i < d->n; i++) {
        free(d->s[i].prompt);
        free(d->s[i].answer);
        free(d->s[i].ids);
        cJSON_Delete(d->s[i].tools_kwargs);
    }
    free(d->s);
    memset(d, 0, sizeof *d);
}
