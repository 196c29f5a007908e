#define _GNU_SOURCE  // memmem
#include "text/chat.h"

#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "text/tokenizer.h"

static JinjaTemplate *parse_or_die(const char *src, const char *name) {
    char *err;
    JinjaTemplate *t = jinja_parse(src, strlen(src), name, &err);
    if (!t) die("chat template: %s", err);
    return t;
}

const char *chat_config_token(const cJSON *config, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(config, key);
    if (cJSON_IsObject(it)) it = cJSON_GetObjectItemCaseSensitive(it, "content");
    return cJSON_IsString(it) ? it->valuestring : NULL;
}

static void config_token_var(ChatTemplate *c, const cJSON *config, const char *key) {
    const char *text = chat_config_token(config, key);
    if (text) chat_template_set(c, key, cJSON_CreateString(text));
}

// src as c's template, its text kept.
static void set_default(ChatTemplate *c, const char *src, const char *where) {
    c->tpl = parse_or_die(src, where);
    c->source = xstrdup(src);
}

static void set_template(ChatTemplate *c, const cJSON *tpl, const char *path) {
    if (cJSON_IsArray(tpl)) {  // [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
        for (const cJSON *e = tpl->child; e; e = e->next) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(e, "template");
            if (!cJSON_IsString(name) || !cJSON_IsString(text))
                die("%s: each of \"chat_template\" must be {\"name\": string, \"template\": string}", path);
            char *where = xprintf("%s (template \"%s\")", path, name->valuestring);
            if (!strcmp(name->valuestring, "default") && !c->tpl) set_default(c, text->valuestring, where);
            if (!strcmp(name->valuestring, "tool_use") && !c->tool_tpl)
                c->tool_tpl = parse_or_die(text->valuestring, where);
            free(where);
        }
        if (!c->tpl && c->tool_tpl) die("%s: \"chat_template\" has \"tool_use\" but no \"default\"", path);
    } else if (cJSON_IsString(tpl)) {
        set_default(c, tpl->valuestring, path);
    } else if (tpl && !cJSON_IsNull(tpl)) {
        die("%s: \"chat_template\" must be a string or a list of {\"name\", \"template\"}", path);
    }
    if (c->tpl) c->path = xstrdup(path);
}

static void describe(ChatTemplate *c) {
    if (!c->tpl) return;
    c->parts = jinja_loops_over_content(c->tpl) || (c->tool_tpl && jinja_loops_over_content(c->tool_tpl));
    // the hermes format the multi-turn rollout parses: a template that speaks of <tool_call> blocks when it
    // lists tools or writes an assistant's call
    Buf probe = {0};
    cJSON *msgs = cJSON_Parse(
        "[{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"\","
        " \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", "
        "\"arguments\": {}}}]}]");
    cJSON *tools = cJSON_Parse(
        "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"\", "
        "\"parameters\": {\"type\": \"object\", \"properties\": {}}}}]");
    if (!msgs || !tools) die("out of memory");
    char *err = chat_render(c, msgs, tools, NULL, 0, 0, &probe);
    c->tool_calls = !err && probe.data && strstr(probe.data, "<tool_call>");
    free(err);
    buf_free(&probe);
    cJSON_Delete(msgs);
    cJSON_Delete(tools);
}

// A template file into c->tpl.
static void read_template_file(ChatTemplate *c, const char *path) {
    size_t n;
    char *text = file_read_all(path, FILE_MAX_JSON, &n);
    char *err;
    c->tpl = jinja_parse(text, n, path, &err);
    if (!c->tpl) die("chat template: %s", err);
    c->source = text;
    c->path = xstrdup(path);
}

void chat_template_load(ChatTemplate *c, const char *dir, const cJSON *config, const char *config_path) {
    memset(c, 0, sizeof *c);
    char *jinja = path_join(dir, "chat_template.jinja"), *json = path_join(dir, "chat_template.json");
    if (file_exists(jinja)) {
        read_template_file(c, jinja);
    } else if (file_exists(json)) {
        cJSON *root = json_load_file(json, FILE_MAX_JSON);
        const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
        if (!tpl) die("%s: no \"chat_template\"", json);
        set_template(c, tpl, json);
        cJSON_Delete(root);
    } else if (config) {
        set_template(c, cJSON_GetObjectItemCaseSensitive(config, "chat_template"), config_path);
    }
    free(jinja);
    free(json);
    if (config) {
        config_token_var(c, config, "bos_token");
        config_token_var(c, config, "eos_token");
    }
    describe(c);
}

void chat_template_load_file(ChatTemplate *c, const char *path) {
    memset(c, 0, sizeof *c);
    read_template_file(c, path);
    describe(c);
}

void chat_template_free(ChatTemplate *c) {
    jinja_free(c->tpl);
    jinja_free(c->tool_tpl);
    free(c->source);
    free(c->path);
    cJSON_Delete(c->vars);
    memset(c, 0, sizeof *c);
}

void chat_template_set(ChatTemplate *c, const char *key, cJSON *value) {
    if (!value) die("out of memory");
    if (!c->vars && !(c->vars = cJSON_CreateObject())) die("out of memory");
    cJSON_DeleteItemFromObjectCaseSensitive(c->vars, key);
    cJSON_AddItemToObject(c->vars, key, value);
}

void chat_template_set_all(ChatTemplate *c, const cJSON *kwargs, const char *where) {
    if (!kwargs || cJSON_IsNull(kwargs)) return;
    if (!cJSON_IsObject(kwargs)) die("%s must be a mapping of template variables", where);
    for (const cJSON *e = kwargs->child; e; e = e->next)
        chat_template_set(c, e->string, cJSON_Duplicate(e, 1));
}

static int is_type(const cJSON *part, const char *type) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "type");
    return cJSON_IsString(t) && !strcmp(t->valuestring, type);
}

// msgs checked; content parts joined into a string for a template that takes strings (*joined: a copy made).
static char *check_messages(const ChatTemplate *c, const cJSON *msgs, cJSON **joined) {
    *joined = NULL;
    if (!cJSON_IsArray(msgs)) return xprintf("\"messages\" must be an array");
    int i = 0;
    for (const cJSON *m = msgs->child; m; m = m->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role))
            return xprintf("message %d needs a string \"role\"", i);
        if (content && !cJSON_IsString(content) && !cJSON_IsArray(content) && !cJSON_IsNull(content))
            return xprintf("message %d: \"content\" must be a string, a list of parts or null", i);
        if (calls && !cJSON_IsNull(calls) && !cJSON_IsArray(calls))
            return xprintf("message %d: \"tool_calls\" must be an array", i);
        int j = 0;
        for (const cJSON *p = cJSON_IsArray(content) ? content->child : NULL; p; p = p->next, j++) {
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(p, "text");
            int image = is_type(p, "image") || is_type(p, "image_url");
            if (!cJSON_IsObject(p) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(p, "type")))
                return xprintf("message %d, content part %d: a part must be an object with a string \"type\"",
                               i, j);
            if (is_type(p, "text") && !cJSON_IsString(text))
                return xprintf("message %d, content part %d: a text part needs a \"text\" string", i, j);
            if (!c->parts && !is_type(p, "text") && !(image && c->image_text))
                return xprintf(
                    "message %d, content part %d: the chat template of %s takes text, not \"%s\" parts", i, j,
                    c->path, cJSON_GetObjectItemCaseSensitive(p, "type")->valuestring);
        }
    }
    int any_parts = 0;
    for (const cJSON *m = msgs->child; m; m = m->next)
        any_parts |= cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(m, "content"));
    if (c->parts || !any_parts) return NULL;
    *joined = cJSON_Duplicate(msgs, 1);
    if (!*joined) die("out of memory");
    for (cJSON *m = (*joined)->child; m; m = m->next) {
        cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsArray(content)) continue;
        Buf text = {0};
        int prev_text = 0;
        for (const cJSON *p = content->child; p; p = p->next) {
            int is_text = is_type(p, "text");
            if (is_text && prev_text) buf_append(&text, "\n", 1);
            const char *s =
                is_text ? cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring : c->image_text;
            buf_append(&text, s, strlen(s));
            prev_text = is_text;
        }
        cJSON *str = cJSON_CreateString(text.data ? text.data : "");
        buf_free(&text);
        if (!str) die("out of memory");
        cJSON_ReplaceItemInObjectCaseSensitive(m, "content", str);
    }
    return NULL;
}

static void add_ref(cJSON *vars, const char *key, const cJSON *v) {
    cJSON_DeleteItemFromObjectCaseSensitive(vars, key);
    if (!cJSON_AddItemReferenceToObject(vars, key, (cJSON *)v)) die("out of memory");
}

char *chat_render(const ChatTemplate *c, const cJSON *msgs, const cJSON *tools, const cJSON *kwargs,
                  uint32_t nul_sentinel, int add_generation_prompt, Buf *out) {
    if (!c->tpl) return xprintf("\"messages\" given but the model has no chat template");
    if (tools && !cJSON_IsNull(tools) && !cJSON_IsArray(tools)) return xprintf("\"tools\" must be an array");
    if (kwargs && !cJSON_IsObject(kwargs)) return xprintf("\"chat_template_kwargs\" must be an object");
    if (cJSON_IsNull(tools)) tools = NULL;
    cJSON *joined;
    char *err = check_messages(c, msgs, &joined);
    if (err) return err;
    cJSON *vars = cJSON_CreateObject();
    if (!vars) die("out of memory");
    for (const cJSON *e = c->vars ? c->vars->child : NULL; e; e = e->next) add_ref(vars, e->string, e);
    for (const cJSON *e = kwargs ? kwargs->child : NULL; e; e = e->next) add_ref(vars, e->string, e);
    add_ref(vars, "messages", joined ? joined : msgs);
    // as transformers calls it: tools=None and documents=None when not given
    cJSON *none = cJSON_CreateNull();
    if (!none) die("out of memory");
    add_ref(vars, "tools", tools ? tools : none);
    if (!cJSON_GetObjectItemCaseSensitive(vars, "documents")) add_ref(vars, "documents", none);
    cJSON *gen = cJSON_CreateBool(add_generation_prompt);
    if (!gen) die("out of memory");
    cJSON_DeleteItemFromObjectCaseSensitive(vars, "add_generation_prompt");
    cJSON_AddItemToObject(vars, "add_generation_prompt", gen);
    err = jinja_render(tools && c->tool_tpl ? c->tool_tpl : c->tpl, vars, nul_sentinel, out);
    if (!err && !out->data) buf_append(out, "", 0);
    cJSON_Delete(vars);
    cJSON_Delete(none);
    cJSON_Delete(joined);
    return err;
}

void chat_render_or_die(const ChatTemplate *c, const cJSON *msgs, const cJSON *tools, const cJSON *kwargs,
                        uint32_t nul_sentinel, int add_generation_prompt, Buf *out, const char *where) {
    char *err = chat_render(c, msgs, tools, kwargs, nul_sentinel, add_generation_prompt, out);
    if (err) die("%s: %s", where, err);
}

// A JSON string of text[0..n), its U+0000 as *nul (a noncharacter absent from the text; 0 when none).
static cJSON *bytes_string(const char *text, size_t n, uint32_t *nul) {
    *nul = 0;
    Buf b = {0};
    for (uint32_t c = 0xFDD0; c <= 0xFDEF && memchr(text, 0, n) && !*nul; c++) {
        char u[3] = {(char)(0xE0 | (c >> 12)), (char)(0x80 | ((c >> 6) & 0x3F)), (char)(0x80 | (c & 0x3F))};
        if (!memmem(text, n, u, 3)) *nul = c;
    }
    for (size_t i = 0; i < n; i++) {
        if (text[i] || !*nul) {
            buf_append(&b, &text[i], 1);
            continue;
        }
        char u[3] = {(char)(0xE0 | (*nul >> 12)), (char)(0x80 | ((*nul >> 6) & 0x3F)),
                     (char)(0x80 | (*nul & 0x3F))};
        buf_append(&b, u, 3);
    }
    cJSON *s = cJSON_CreateString(b.data ? b.data : "");
    buf_free(&b);
    if (!s) die("out of memory");
    return s;
}

static cJSON *message(const char *role, cJSON *content) {
    cJSON *m = cJSON_CreateObject();
    if (!m || !cJSON_AddStringToObject(m, "role", role)) die("out of memory");
    cJSON_AddItemToObject(m, "content", content);
    return m;
}

// A prompt text as one user message, rendered with the generation prompt (tools: an array or NULL).
static char *chat_user_prompt(const ChatTemplate *c, const char *text, size_t n, const cJSON *tools, Buf *out) {
    uint32_t nul;
    cJSON *msgs = cJSON_CreateArray();
    if (!msgs) die("out of memory");
    cJSON_AddItemToArray(msgs, message("user", bytes_string(text, n, &nul)));
    char *err = chat_render(c, msgs, tools, NULL, nul, 1, out);
    cJSON_Delete(msgs);
    return err;
}

#define TURN_MARK "grpo-tool-call-mark-8d1f3c"  // plain ASCII: the same through tojson

char *chat_tool_response_turn(const ChatTemplate *c, const cJSON *tools, const char *content, size_t n,
                              Buf *out) {
    uint32_t nul;
    cJSON *msgs = cJSON_CreateArray();
    if (!msgs) die("out of memory");
    cJSON_AddItemToArray(msgs, message("user", cJSON_CreateString("?")));
    cJSON_AddItemToArray(msgs, message("assistant", cJSON_CreateString(TURN_MARK)));
    cJSON_AddItemToArray(msgs, message("tool", bytes_string(content, n, &nul)));
    Buf all = {0};
    char *err = chat_render(c, msgs, tools, NULL, nul, 1, &all);
    cJSON_Delete(msgs);
    const char *mark = err ? NULL : memmem(all.data, all.len, TURN_MARK, strlen(TURN_MARK));
    if (!err && !mark)
        err = xprintf("the chat template of %s drops an assistant turn before a tool message", c->path);
    if (!err) {
        const char *after = mark + strlen(TURN_MARK);
        buf_append(out, after, (size_t)(all.data + all.len - after));
    }
    buf_free(&all);
    return err;
}

char *chat_encode_prompt(Tokenizer *t, const char *text, size_t n, int chat, const cJSON *tools,
                         IdList *ids) {
    size_t bad;
    if (!chat || !t->chat.tpl) {
        if (tokenizer_encode(t, text, n, ids, &bad) != 0) return xprintf("not valid UTF-8 (byte %zu)", bad);
        return NULL;
    }
    Buf b = {0};
    char *err = chat_user_prompt(&t->chat, text, n, tools, &b);
    if (!err && tokenizer_encode(t, b.data, b.len, ids, &bad) != 0)
        err = xprintf("not valid UTF-8 (byte %zu of the chat template's rendering)", bad);
    buf_free(&b);
    return err;
}

// The last occurrence of pat in s[0..n).
static const char *find_last(const char *s, size_t n, const char *pat) {
    size_t k = strlen(pat);
    for (size_t i = n >= k ? n - k + 1 : 0; i-- > 0;)
        if (memcmp(s + i, pat, k) == 0) return s + i;
    return NULL;
}

cJSON *chat_parse_tool_call(const char *text, size_t n, uint32_t *nul_sentinel, const char **error) {
    if (n < 12 || memcmp(text + n - 12, "</tool_call>", 12) != 0) {
        *error = "the text does not end with </tool_call>";
        return NULL;
    }
    const char *open = find_last(text, n - 12, "<tool_call>");
    if (!open) {
        *error = "</tool_call> without <tool_call>";
        return NULL;
    }
    const char *body = open + 11;
    cJSON *call =
        json_parse_line(body, (size_t)(text + n - 12 - body), nul_sentinel);  // whitespace around it allowed
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

void chat_render_request(const ChatTemplate *c, const cJSON *req, uint32_t nul_sentinel, Buf *out,
                         const char *where) {
    const cJSON *gen = cJSON_GetObjectItemCaseSensitive(req, "add_generation_prompt");
    if (gen && !cJSON_IsBool(gen)) die("%s: \"add_generation_prompt\" must be true or false", where);
    cJSON *kwargs = cJSON_CreateObject();
    if (!kwargs) die("out of memory");
    for (const cJSON *e = req->child; e; e = e->next)
        if (strcmp(e->string, "messages") && strcmp(e->string, "tools") &&
            strcmp(e->string, "add_generation_prompt"))
            add_ref(kwargs, e->string, e);
    char *err = chat_render(c, cJSON_GetObjectItemCaseSensitive(req, "messages"),
                            cJSON_GetObjectItemCaseSensitive(req, "tools"), kwargs, nul_sentinel,
                            cJSON_IsTrue(gen), out);
    cJSON_Delete(kwargs);
    if (err) die("%s: %s", where, err);
}
