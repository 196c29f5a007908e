#include "text/chat.h"

#include <stdlib.h>
#include <string.h>

#include "base/json.h"

static void turn(Buf *out, const char *role, const char *content, size_t len) {
    buf_append(out, "<|im_start|>", 12);
    buf_append(out, role, strlen(role));
    buf_append(out, "\n", 1);
    buf_append(out, content, len);
    buf_append(out, "<|im_end|>\n", 11);
}

int chat_render(const Tokenizer *t, const ChatMessage *msgs, int n, int add_generation_prompt, Buf *out, int *bad) {
    for (int i = 0; i < n; i++)
        if (strcmp(msgs[i].role, "system") && strcmp(msgs[i].role, "user") && strcmp(msgs[i].role, "assistant")) {
            *bad = i;
            return -1;
        }
    if (t->default_system && (n == 0 || strcmp(msgs[0].role, "system") != 0)) turn(out, "system", t->default_system, strlen(t->default_system));
    for (int i = 0; i < n; i++) turn(out, msgs[i].role, msgs[i].content, msgs[i].content_len);
    if (add_generation_prompt) buf_append(out, "<|im_start|>assistant\n", 22);
    if (!out->data) buf_append(out, "", 0);
    return 0;
}

void chat_render_json(const Tokenizer *t, const cJSON *msgs, uint32_t nul_sentinel, int add_generation_prompt,
                      Buf *out, const char *where) {
    if (!t->has_chat_template) die("%s: \"messages\" given but %s has no chat template", where, t->path);
    if (!cJSON_IsArray(msgs)) die("%s: \"messages\" must be an array", where);
    int n = cJSON_GetArraySize(msgs), i = 0, bad;
    ChatMessage *m = xcalloc((size_t)n, sizeof *m);
    for (const cJSON *e = msgs->child; e; e = e->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(e, "role"), *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsString(role) || !cJSON_IsString(content))
            die("%s: message %d needs string \"role\" and \"content\"", where, i);
        m[i].role = role->valuestring;
        m[i].content = json_string_bytes(content, nul_sentinel, &m[i].content_len);
    }
    if (chat_render(t, m, n, add_generation_prompt, out, &bad) != 0)
        die("%s: message %d has role \"%s\" (supported: system, user, assistant)", where, bad, m[bad].role);
    for (i = 0; i < n; i++) free((char *)m[i].content);
    free(m);
}

int chat_encode_prompt(Tokenizer *t, const char *text, size_t n, int chat, IdList *ids, size_t *bad_offset) {
    if (!chat || !t->has_chat_template) return tokenizer_encode(t, text, n, ids, bad_offset);
    ChatMessage msg = {"user", text, n};
    Buf b = {0};
    int bad;
    chat_render(t, &msg, 1, 1, &b, &bad);  // "user" is a known role: no error
    int rc = tokenizer_encode(t, b.data ? b.data : "", b.len, ids, bad_offset);
    buf_free(&b);
    return rc;
}
