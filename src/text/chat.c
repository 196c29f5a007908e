#define _GNU_SOURCE  // memmem
#include "text/chat.h"

#include <stdlib.h>
#include <string.h>

#include "base/json.h"

static void buf_puts(Buf *b, const char *s) { buf_append(b, s, strlen(s)); }

static void turn(Buf *out, const char *role, const char *content, size_t len) {
    buf_puts(out, "<|im_start|>");
    buf_puts(out, role);
    buf_puts(out, "\n");
    buf_append(out, content, len);
    buf_puts(out, "<|im_end|>\n");
}

// A byte range of a message, trimmed and split as the Jinja template does with Python's str methods.
typedef struct {
    const char *s;
    size_t n;
} Span;

static Span lstrip_nl(Span x) {
    while (x.n && x.s[0] == '\n') x.s++, x.n--;
    return x;
}

static Span rstrip_nl(Span x) {
    while (x.n && x.s[x.n - 1] == '\n') x.n--;
    return x;
}

static const char *find_last(Span x, const char *pat) {
    size_t k = strlen(pat);
    for (size_t i = x.n >= k ? x.n - k + 1 : 0; i-- > 0;)
        if (memcmp(x.s + i, pat, k) == 0) return x.s + i;
    return NULL;
}

static int starts_ends(Span x, const char *head, const char *tail) {
    size_t h = strlen(head), t = strlen(tail);
    return x.n >= h + t && !memcmp(x.s, head, h) && !memcmp(x.s + x.n - t, tail, t);
}

// One assistant turn of Qwen3's template. think: this turn comes after the last user query.
static void qwen3_assistant(Buf *out, const ChatMessage *m, int think, int last) {
    Span content = {m->content, m->content_len}, reasoning = {"", 0};
    const char *close = memmem(content.s, content.n, "</think>", 8);
    if (m->reasoning) {
        reasoning = (Span){m->reasoning, m->reasoning_len};
    } else if (close) {  // content = after the last </think>; reasoning = before the first, after <think>
        const char *after = find_last(content, "</think>") + 8;
        Span before = rstrip_nl((Span){content.s, (size_t)(close - content.s)});
        const char *open = find_last(before, "<think>");
        if (open) before = (Span){open + 7, before.n - (size_t)(open + 7 - before.s)};
        reasoning = lstrip_nl(before);
        content = lstrip_nl((Span){after, content.n - (size_t)(after - content.s)});
    }
    buf_puts(out, "<|im_start|>assistant\n");
    if (think && (last || reasoning.n)) {
        reasoning = rstrip_nl(lstrip_nl(reasoning));
        content = lstrip_nl(content);
        buf_puts(out, "<think>\n");
        buf_append(out, reasoning.s, reasoning.n);
        buf_puts(out, "\n</think>\n\n");
    }
    buf_append(out, content.s, content.n);
    buf_puts(out, "<|im_end|>\n");
}

static void qwen3_render(const Tokenizer *t, const ChatMessage *msgs, int n, int add_generation_prompt, Buf *out) {
    if (n > 0 && !strcmp(msgs[0].role, "system")) turn(out, "system", msgs[0].content, msgs[0].content_len);
    int last_query = n - 1;  // the last user turn that is not a tool response
    for (int i = n - 1; i >= 0; i--)
        if (!strcmp(msgs[i].role, "user") &&
            !starts_ends((Span){msgs[i].content, msgs[i].content_len}, "<tool_response>", "</tool_response>")) {
            last_query = i;
            break;
        }
    for (int i = 0; i < n; i++) {
        if (!strcmp(msgs[i].role, "assistant")) qwen3_assistant(out, &msgs[i], i > last_query, i == n - 1);
        else if (i > 0 || strcmp(msgs[i].role, "system")) turn(out, msgs[i].role, msgs[i].content, msgs[i].content_len);
    }
    if (add_generation_prompt) {
        buf_puts(out, "<|im_start|>assistant\n");
        if (t->no_thinking) buf_puts(out, "<think>\n\n</think>\n\n");
    }
}

int chat_render(const Tokenizer *t, const ChatMessage *msgs, int n, int add_generation_prompt, Buf *out, int *bad) {
    for (int i = 0; i < n; i++)
        if (strcmp(msgs[i].role, "system") && strcmp(msgs[i].role, "user") && strcmp(msgs[i].role, "assistant")) {
            *bad = i;
            return -1;
        }
    if (t->thinking) {
        qwen3_render(t, msgs, n, add_generation_prompt, out);
        if (!out->data) buf_puts(out, "");
        return 0;
    }
    if (t->default_system && (n == 0 || strcmp(msgs[0].role, "system") != 0)) turn(out, "system", t->default_system, strlen(t->default_system));
    for (int i = 0; i < n; i++) turn(out, msgs[i].role, msgs[i].content, msgs[i].content_len);
    if (add_generation_prompt) buf_puts(out, "<|im_start|>assistant\n");
    if (!out->data) buf_puts(out, "");
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
        const cJSON *reasoning = cJSON_GetObjectItemCaseSensitive(e, "reasoning_content");
        if (!cJSON_IsString(role) || !cJSON_IsString(content))
            die("%s: message %d needs string \"role\" and \"content\"", where, i);
        if (reasoning && !cJSON_IsNull(reasoning) && !cJSON_IsString(reasoning))
            die("%s: message %d: \"reasoning_content\" must be a string or null", where, i);
        m[i].role = role->valuestring;
        m[i].content = json_string_bytes(content, nul_sentinel, &m[i].content_len);
        if (cJSON_IsString(reasoning)) m[i].reasoning = json_string_bytes(reasoning, nul_sentinel, &m[i].reasoning_len);
    }
    if (chat_render(t, m, n, add_generation_prompt, out, &bad) != 0)
        die("%s: message %d has role \"%s\" (supported: system, user, assistant)", where, bad, m[bad].role);
    for (i = 0; i < n; i++) {
        free((char *)m[i].content);
        free((char *)m[i].reasoning);
    }
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
