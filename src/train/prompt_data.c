#define _POSIX_C_SOURCE 200809L
#include "train/prompt_data.h"

#include <errno.h>
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

void prompt_data_load(PromptData *d, const char *path, const char *key, const char *prompt_key,
                      const char *answer_key, Tokenizer *tok, int chat_template, int64_t max_prompt_length) {
    memset(d, 0, sizeof *d);
    FILE *f = fopen(path, "r");
    if (!f) die("%s: cannot open %s: %s", key, path, strerror(errno));
    char *buf = NULL;
    size_t cap = 0, n_cap = 0;
    for (int64_t line = 1; line_read(f, &buf, &cap, path, line) >= 0; line++) {
        if (strspn(buf, " \t\r\n") == strlen(buf)) continue;
        uint32_t nul;
        cJSON *root = json_parse_line(buf, strlen(buf), &nul);
        if (!cJSON_IsObject(root)) die("%s:%lld: not a JSON object", path, (long long)line);
        char *prompt = field_text(cJSON_GetObjectItemCaseSensitive(root, prompt_key), nul, path, line, prompt_key);
        char *answer = field_text(cJSON_GetObjectItemCaseSensitive(root, answer_key), nul, path, line, answer_key);
        IdList ids = {0};
        size_t bad_offset;
        if (chat_encode_prompt(tok, prompt, strlen(prompt), chat_template, &ids, &bad_offset) != 0)
            die("%s:%lld: \"%s\" is not valid UTF-8", path, (long long)line, prompt_key);
        if (ids.n == 0) die("%s:%lld: the prompt is empty", path, (long long)line);
        if ((int64_t)ids.n > max_prompt_length)
            die("%s:%lld: the prompt has %zu tokens, max_prompt_length is %lld", path, (long long)line, ids.n,
                (long long)max_prompt_length);
        if ((size_t)d->n == n_cap) {
            n_cap = n_cap ? 2 * n_cap : 64;
            d->prompt = xrealloc(d->prompt, n_cap * sizeof *d->prompt);
            d->answer = xrealloc(d->answer, n_cap * sizeof *d->answer);
            d->ids = xrealloc(d->ids, n_cap * sizeof *d->ids);
            d->len = xrealloc(d->len, n_cap * sizeof *d->len);
            d->line = xrealloc(d->line, n_cap * sizeof *d->line);
        }
        d->prompt[d->n] = prompt;
        d->answer[d->n] = answer;
        d->ids[d->n] = ids.ids;
        d->len[d->n] = (int64_t)ids.n;
        d->line[d->n++] = line;
        cJSON_Delete(root);
    }
    if (ferror(f)) die("cannot read data file %s", path);
    fclose(f);
    free(buf);
    if (d->n == 0) die("%s: no prompts (the file is empty)", path);
}

void prompt_data_free(PromptData *d) {
    for (int64_t i = 0; i < d->n; i++) {
        free(d->prompt[i]);
        free(d->answer[i]);
        free(d->ids[i]);
    }
    free(d->prompt);
    free(d->answer);
    free(d->ids);
    free(d->len);
    free(d->line);
    memset(d, 0, sizeof *d);
}
