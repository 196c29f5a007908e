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

static const char TOOLS_INTRO[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
static const char TOOLS_OUTRO[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n";

void chat_tools_text(Buf *out, const cJSON *tools, uint32_t nul_sentinel) {
    for (const cJSON *e = tools ? tools->child : NULL; e; e = e->next) {
        buf_puts(out, "\n");
        json_dump_py(out, e, nul_sentinel);
    }
}

// The system turn of a conversation with tools: the system text (none: sys NULL), then the tools.
static void tools_system(Buf *out, const char *sys, size_t sys_len, const char *tools) {
    buf_puts(out, "<|im_start|>system\n");
    if (sys) {
        buf_append(out, sys, sys_len);
        buf_puts(out, "\n\n");
    }
    buf_puts(out, TOOLS_INTRO);
    buf_puts(out, tools);
    buf_puts(out, TOOLS_OUTRO);
}

int chat_tool_call(const cJSON *call, const char **name, const cJSON **arguments) {
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
    if (cJSON_IsObject(fn)) call = fn;
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(call, "name");
    *arguments = cJSON_GetObjectItemCaseSensitive(call, "arguments");
    if (!cJSON_IsString(nm) || !*arguments) return -1;
    *name = nm->valuestring;
    return 0;
}

static int has_calls(const ChatMessage *m) { return m->tool_calls && cJSON_GetArraySize(m->tool_calls) > 0; }

// The hermes blocks of m's tool calls. Qwen2.5 writes every arguments value as JSON (a string quoted);
// Qwen3 writes a string as it is. first_newline: a newline before the first block too.
static void tool_calls(Buf *out, const ChatMessage *m, int raw_strings, int first_newline) {
    for (const cJSON *c = m->tool_calls->child; c; c = c->next) {
        const char *name = "";
        const cJSON *args = NULL;
        chat_tool_call(c, &name, &args);  // checked by chat_render
        if (c != m->tool_calls->child || first_newline) buf_puts(out, "\n");
        buf_puts(out, "<tool_call>\n{\"name\": \"");
        buf_puts(out, name);
        buf_puts(out, "\", \"arguments\": ");
        if (raw_strings && cJSON_IsString(args)) {
            size_t n;
            char *a = json_string_bytes(args, m->nul_sentinel, &n);
            buf_append(out, a, n);
            free(a);
        } else {
            json_dump_py(out, args, m->nul_sentinel);
        }
        buf_puts(out, "}\n</tool_call>");
    }
}

// Message i, a tool response: consecutive ones share one user turn.
static void tool_response(Buf *out, const ChatMessage *msgs, int n, int i) {
    if (i == 0 || strcmp(msgs[i - 1].role, "tool")) buf_puts(out, "<|im_start|>user");
    buf_puts(out, "\n<tool_response>\n");
    buf_append(out, msgs[i].content, msgs[i].content_len);
    buf_puts(out, "\n</tool_response>");
    if (i == n - 1 || strcmp(msgs[i + 1].role, "tool")) buf_puts(out, "<|im_end|>\n");
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
    int has_content = content.n > 0;  // the template tests the content before its last lstrip
    buf_puts(out, "<|im_start|>assistant\n");
    if (think && (last || reasoning.n)) {
        reasoning = rstrip_nl(lstrip_nl(reasoning));
        content = lstrip_nl(content);
        buf_puts(out, "<think>\n");
        buf_append(out, reasoning.s, reasoning.n);
        buf_puts(out, "\n</think>\n\n");
    }
    buf_append(out, content.s, content.n);
    if (has_calls(m)) tool_calls(out, m, 1, has_content);
    buf_puts(out, "<|im_end|>\n");
}

static void qwen3_render(const Tokenizer *t, const ChatMessage *msgs, int n, const char *tools,
                         int add_generation_prompt, Buf *out) {
    int sys0 = n > 0 && !strcmp(msgs[0].role, "system");
    if (tools) tools_system(out, sys0 ? msgs[0].content : NULL, sys0 ? msgs[0].content_len : 0, tools);
    else if (sys0) turn(out, "system", msgs[0].content, msgs[0].content_len);
    int last_query = n - 1;  // the last user turn that is not a tool response
    for (int i = n - 1; i >= 0; i--)
        if (!strcmp(msgs[i].role, "user") &&
            !starts_ends((Span){msgs[i].content, msgs[i].content_len}, "<tool_response>", "</tool_response>")) {
            last_query = i;
            break;
        }
    for (int i = sys0; i < n; i++) {
        if (!strcmp(msgs[i].role, "assistant")) qwen3_assistant(out, &msgs[i], i > last_query, i == n - 1);
        else if (!strcmp(msgs[i].role, "tool")) tool_response(out, msgs, n, i);
        else turn(out, msgs[i].role, msgs[i].content, msgs[i].content_len);
    }
    if (add_generation_prompt) {
        buf_puts(out, "<|im_start|>assistant\n");
        if (t->no_thinking) buf_puts(out, "<think>\n\n</think>\n\n");
    }
}

// Qwen2.5's template (and plain ChatML): the default system prompt when the conversation has none.
static void qwen25_render(const Tokenizer *t, const ChatMessage *msgs, int n, const char *tools,
                          int add_generation_prompt, Buf *out) {
    int sys0 = n > 0 && !strcmp(msgs[0].role, "system");
    const char *sys = sys0 ? msgs[0].content : t->default_system;
    size_t sys_len = sys0 ? msgs[0].content_len : 0;
    if (!sys0 && sys) sys_len = strlen(sys);
    if (tools) tools_system(out, sys, sys_len, tools);
    else if (sys) turn(out, "system", sys, sys_len);
    for (int i = sys0; i < n; i++) {
        const ChatMessage *m = &msgs[i];
        if (!strcmp(m->role, "tool")) {
            tool_response(out, msgs, n, i);
        } else if (!strcmp(m->role, "assistant") && has_calls(m)) {
            buf_puts(out, "<|im_start|>assistant");
            if (m->content_len) buf_puts(out, "\n");
            buf_append(out, m->content, m->content_len);
            tool_calls(out, m, 0, 1);
            buf_puts(out, "<|im_end|>\n");
        } else {
            turn(out, m->role, m->content, m->content_len);
        }
    }
    if (add_generation_prompt) buf_puts(out, "<|im_start|>assistant\n");
}

int chat_render(const Tokenizer *t, const ChatMessage *msgs, int n, const char *tools, int add_generation_prompt,
                Buf *out, int *bad) {
    static const char *const roles[] = {"system", "user", "assistant", "tool"};
    for (int i = 0; i < n; i++) {
        int known = 0;
        for (size_t r = 0; r < sizeof roles / sizeof *roles; r++) known |= !strcmp(msgs[i].role, roles[r]);
        const char *name;
        const cJSON *args;
        int calls_ok = 1;
        if (has_calls(&msgs[i]))
            for (const cJSON *c = msgs[i].tool_calls->child; c; c = c->next) calls_ok &= !chat_tool_call(c, &name, &args);
        int tools_ok = t->tool_calls || (strcmp(msgs[i].role, "tool") && !has_calls(&msgs[i]));
        if (!known || !calls_ok || !tools_ok) {
            *bad = i;
            return -1;
        }
    }
    if (tools && !*tools) tools = NULL;  // the templates' `if tools`: an empty list is none
    if (t->thinking) qwen3_render(t, msgs, n, tools, add_generation_prompt, out);
    else qwen25_render(t, msgs, n, tools, add_generation_prompt, out);
    if (!out->data) buf_puts(out, "");
    return 0;
}

char *chat_render_json_try(const Tokenizer *t, const cJSON *msgs, const cJSON *tools, uint32_t nul_sentinel,
                           int add_generation_prompt, Buf *out) {
    if (!t->has_chat_template) return xprintf("\"messages\" given but %s has no chat template", t->path);
    if (!cJSON_IsArray(msgs)) return xprintf("\"messages\" must be an array");
    if (tools && !cJSON_IsNull(tools) && !cJSON_IsArray(tools)) return xprintf("\"tools\" must be an array");
    if (cJSON_GetArraySize(tools) > 0 && !t->tool_calls)
        return xprintf("\"tools\" given but the chat template of %s has no tool calls", t->path);
    Buf tools_text = {0};
    chat_tools_text(&tools_text, tools, nul_sentinel);
    char *err = chat_render_messages_try(t, msgs, tools_text.data, nul_sentinel, add_generation_prompt, out);
    buf_free(&tools_text);
    return err;
}

char *chat_render_messages_try(const Tokenizer *t, const cJSON *msgs, const char *tools, uint32_t nul_sentinel,
                               int add_generation_prompt, Buf *out) {
    if (!t->has_chat_template) return xprintf("\"messages\" given but %s has no chat template", t->path);
    if (!cJSON_IsArray(msgs)) return xprintf("\"messages\" must be an array");
    int n = cJSON_GetArraySize(msgs), i = 0, bad;
    char *err = NULL;
    ChatMessage *m = xcalloc((size_t)(n ? n : 1), sizeof *m);
    for (const cJSON *e = msgs->child; e && !err; e = e->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(e, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        const cJSON *reasoning = cJSON_GetObjectItemCaseSensitive(e, "reasoning_content");
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(e, "tool_calls");
        // OpenAI's assistant message that only calls tools has content null
        int null_ok = cJSON_GetArraySize(calls) > 0 && cJSON_IsNull(content);
        if (calls && !cJSON_IsNull(calls) && !cJSON_IsArray(calls))
            err = xprintf("message %d: \"tool_calls\" must be an array", i);
        else if (!cJSON_IsString(role) || (!cJSON_IsString(content) && !null_ok))
            err = xprintf("message %d needs string \"role\" and \"content\"", i);
        else if (reasoning && !cJSON_IsNull(reasoning) && !cJSON_IsString(reasoning))
            err = xprintf("message %d: \"reasoning_content\" must be a string or null", i);
        if (err) break;
        m[i].role = role->valuestring;
        m[i].content = null_ok ? xstrdup("") : json_string_bytes(content, nul_sentinel, &m[i].content_len);
        if (cJSON_IsString(reasoning)) m[i].reasoning = json_string_bytes(reasoning, nul_sentinel, &m[i].reasoning_len);
        m[i].tool_calls = calls;
        m[i].nul_sentinel = nul_sentinel;
    }
    if (!err && chat_render(t, m, n, tools, add_generation_prompt, out, &bad) != 0) {
        if (!t->tool_calls && (has_calls(&m[bad]) || !strcmp(m[bad].role, "tool")))
            err = xprintf("message %d: the chat template of %s has no tool calls (role \"%s\"%s)", bad, t->path,
                          m[bad].role, has_calls(&m[bad]) ? " with \"tool_calls\"" : "");
        else if (has_calls(&m[bad]))
            err = xprintf("message %d: each of \"tool_calls\" needs a string \"name\" and \"arguments\" (or a "
                          "\"function\" object with them)", bad);
        else
            err = xprintf("message %d has role \"%s\" (supported: system, user, assistant, tool)", bad, m[bad].role);
    }
    for (i = 0; i < n; i++) {
        free((char *)m[i].content);
        free((char *)m[i].reasoning);
    }
    free(m);
    return err;
}

void chat_render_json(const Tokenizer *t, const cJSON *msgs, const cJSON *tools, uint32_t nul_sentinel,
                      int add_generation_prompt, Buf *out, const char *where) {
    char *err = chat_render_json_try(t, msgs, tools, nul_sentinel, add_generation_prompt, out);
    if (err) die("%s: %s", where, err);
}

cJSON *chat_parse_tool_call(const char *text, size_t n, uint32_t *nul_sentinel, const char **error) {
    Span all = {text, n};
    if (n < 12 || memcmp(text + n - 12, "</tool_call>", 12) != 0) {
        *error = "the text does not end with </tool_call>";
        return NULL;
    }
    Span body = {text, n - 12};
    const char *open = find_last(body, "<tool_call>");
    if (!open) {
        *error = "</tool_call> without <tool_call>";
        return NULL;
    }
    body = (Span){open + 11, (size_t)(all.s + n - 12 - (open + 11))};
    cJSON *call = json_parse_line(body.s, body.n, nul_sentinel);  // whitespace around it allowed
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(call, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(call, "arguments");
    *error = NULL;
    if (!cJSON_IsObject(call)) *error = "the tool call is not a JSON object";
    else if (!cJSON_IsString(name)) *error = "the tool call has no string \"name\"";
    else if (!cJSON_IsObject(args)) *error = "the tool call's \"arguments\" is not an object";
    if (*error) {
        cJSON_Delete(call);
        return NULL;
    }
    return call;
}

void chat_tool_response_turn(const Tokenizer *t, const char *content, size_t n, Buf *out) {
    ChatMessage m = {.role = "tool", .content = content, .content_len = n};
    buf_puts(out, "<|im_end|>\n");
    tool_response(out, &m, 1, 0);
    buf_puts(out, "<|im_start|>assistant\n");
    if (t->thinking && t->no_thinking) buf_puts(out, "<think>\n\n</think>\n\n");
}

int chat_encode_prompt(Tokenizer *t, const char *text, size_t n, int chat, const char *tools, IdList *ids,
                       size_t *bad_offset) {
    if (!chat || !t->has_chat_template) return tokenizer_encode(t, text, n, ids, bad_offset);
    ChatMessage msg = {"user", text, n, NULL, 0, NULL, 0};
    Buf b = {0};
    int bad;
    chat_render(t, &msg, 1, tools, 1, &b, &bad);  // "user" is a known role: no error
    int rc = tokenizer_encode(t, b.data ? b.data : "", b.len, ids, bad_offset);
    buf_free(&b);
    return rc;
}
