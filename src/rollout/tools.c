#include "rollout/tools.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/util.h"
#include "text/chat.h"
#include "text/utf8.h"

// A schema field: absent (NULL), or of the wanted kind; anything else dies naming the tool.
static const cJSON *field(const cJSON *o, const char *k, cJSON_bool (*is)(const cJSON *), const char *what,
                          const char *where, int i) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (v && !is(v)) die("%s: tool %d: \"%s\" must be %s", where, i, k, what);
    return v;
}

static void tool_load(ToolSet *ts, int i, const cJSON *e, const char *where, double timeout_s, double memory_mb) {
    static const char *const keys[] = {"name", "description", "parameters", "type", "function", "command",
                                       "timeout_s"};
    if (!cJSON_IsObject(e)) die("%s: tool %d is not an object", where, i);
    for (const cJSON *k = e->child; k; k = k->next) {
        int known = 0;
        for (size_t j = 0; j < sizeof keys / sizeof *keys; j++) known |= !strcmp(k->string, keys[j]);
        if (!known)
            die("%s: tool %d: unknown key \"%.60s\" (a tool has \"name\", \"description\", \"parameters\" (or "
                "\"function\" holding them), \"command\" and may have \"timeout_s\")", where, i, k->string);
    }
    const cJSON *fn = field(e, "function", cJSON_IsObject, "an object", where, i);
    const cJSON *def = fn ? fn : e;
    const cJSON *name = field(def, "name", cJSON_IsString, "a string", where, i);
    const cJSON *command = field(e, "command", cJSON_IsString, "a string (a shell command)", where, i);
    field(def, "description", cJSON_IsString, "a string", where, i);
    field(def, "parameters", cJSON_IsObject, "an object (a JSON schema)", where, i);
    if (!name || !*name->valuestring) die("%s: tool %d has no \"name\"", where, i);
    if (!command || !*command->valuestring) die("%s: tool \"%s\" has no \"command\"", where, name->valuestring);
    for (int j = 0; j < i; j++)
        if (!strcmp(ts->tools[j].name, name->valuestring)) die("%s: two tools named \"%s\"", where, name->valuestring);
    double timeout = json_get_number_or(e, "timeout_s", timeout_s, where);
    if (!(timeout > 0)) die("%s: tool \"%s\": \"timeout_s\" must be > 0", where, name->valuestring);

    cJSON *schema = cJSON_CreateObject(), *f = fn ? cJSON_Duplicate(fn, 1) : cJSON_CreateObject();
    if (!schema || !f || !cJSON_AddStringToObject(schema, "type", "function")) die("out of memory");
    cJSON_AddItemToObject(schema, "function", f);
    if (!fn) {
        static const char *const parts[] = {"name", "description", "parameters"};
        for (size_t j = 0; j < 3; j++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, parts[j]);
            if (v) cJSON_AddItemToObject(f, parts[j], cJSON_Duplicate(v, 1));
        }
    }
    cJSON_AddItemToArray(ts->schemas, schema);
    Tool *t = &ts->tools[i];
    t->name = xstrdup(name->valuestring);
    t->procs = xcalloc((size_t)ts->concurrency, sizeof *t->procs);
    for (int k = 0; k < ts->concurrency; k++)
        program_init(&t->procs[k], command->valuestring, timeout, 1.0, memory_mb);
}

void toolset_load(ToolSet *ts, const char *path, const char *key, int concurrency, double timeout_s,
                  double memory_mb) {
    memset(ts, 0, sizeof *ts);
    char *where = xprintf("%s: %s", key, path);
    file_check_readable(key, path);
    cJSON *root = json_load_file(path, 16 << 20);
    if (!cJSON_IsArray(root) || cJSON_GetArraySize(root) == 0)
        die("%s: expected a JSON array of tools, [{\"name\", \"description\", \"parameters\", \"command\"}, ...]",
            where);
    ts->n = cJSON_GetArraySize(root);
    ts->concurrency = concurrency > 0 ? concurrency : 1;
    ts->tools = xcalloc((size_t)ts->n, sizeof *ts->tools);
    ts->schemas = cJSON_CreateArray();
    if (!ts->schemas) die("out of memory");
    int i = 0;
    for (const cJSON *e = root->child; e; e = e->next, i++) tool_load(ts, i, e, where, timeout_s, memory_mb);
    cJSON_Delete(root);
    free(where);
}

static const Tool *find(const ToolSet *ts, const char *name) {
    for (int i = 0; i < ts->n; i++)
        if (!strcmp(ts->tools[i].name, name)) return &ts->tools[i];
    return NULL;
}

// The request line: {"name", "arguments", "tools_kwargs"}, made valid UTF-8.
static void request(Buf *out, const cJSON *call, uint32_t nul, const cJSON *kwargs) {
    Buf raw = {0};
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(call, "name");
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(kwargs, name->valuestring);
    buf_append(&raw, "{\"name\": ", 9);
    json_dump_py(&raw, name, nul);
    buf_append(&raw, ", \"arguments\": ", 15);
    json_dump_py(&raw, cJSON_GetObjectItemCaseSensitive(call, "arguments"), nul);
    buf_append(&raw, ", \"tools_kwargs\": ", 18);
    if (cJSON_IsObject(kw)) json_dump_py(&raw, kw, 0);
    else buf_append(&raw, "{}", 2);
    buf_append(&raw, "}\n", 2);
    utf8_append_lossy(out, raw.data, raw.len);
    buf_free(&raw);
}

static void call_one(ToolSet *ts, ToolCall *c, int slot) {
    uint32_t nul;
    const char *why;
    c->error = 1;
    cJSON *call = chat_parse_tool_call(c->text, c->n, &nul, &why);
    if (!call) {
        c->content = xprintf("error: %s", why);
        return;
    }
    const char *name = cJSON_GetObjectItemCaseSensitive(call, "name")->valuestring;
    const Tool *t = find(ts, name);
    if (!t) {
        c->content = xprintf("error: unknown tool \"%.100s\"", name);
        cJSON_Delete(call);
        return;
    }
    Program *p = &t->procs[slot];
    Buf req = {0};
    request(&req, call, nul, c->kwargs);
    cJSON *reply = program_call(p, req.data, req.len);
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(reply, "content");
    if (cJSON_IsString(content)) {
        c->content = xstrdup(content->valuestring);
        c->error = 0;
    } else {
        if (reply) program_reject(p, "reply without a string \"content\"%s", "");
        c->content = xprintf("error: the tool \"%s\" failed: %s", name, p->last_error);
    }
    cJSON_Delete(reply);
    cJSON_Delete(call);
    buf_free(&req);
}

void toolset_run(ToolSet *ts, ToolCall *calls, int n) {
    double t0 = time_now();
#pragma omp parallel for num_threads(ts->concurrency) schedule(dynamic) if (n > 1)
    for (int i = 0; i < n; i++) call_one(ts, &calls[i], omp_get_thread_num());
    for (int i = 0; i < n; i++) {
        ts->calls++;
        ts->errors += calls[i].error;
    }
    ts->seconds += time_now() - t0;
}

void toolset_free(ToolSet *ts) {
    for (int i = 0; i < ts->n; i++) {
        for (int k = 0; k < ts->concurrency; k++) program_free(&ts->tools[i].procs[k]);
        free(ts->tools[i].procs);
        free(ts->tools[i].name);
    }
    free(ts->tools);
    cJSON_Delete(ts->schemas);
    memset(ts, 0, sizeof *ts);
}

void tools_check_template(const ToolHook *h, const char *key) {
    Buf text = {0};
    char *err = chat_tool_response_turn(&h->tok->chat, h->tools->schemas, "probe", 5, &text);
    if (err) die("%s: the chat template cannot render a tool's response: %s", key, err);
    buf_free(&text);
}

void tools_rollout_turns(void *tool_hook, RolloutToolTurn *turns, int n) {
    ToolHook *h = tool_hook;
    ToolCall *calls = xcalloc((size_t)n, sizeof *calls);
    for (int i = 0; i < n; i++)
        calls[i] = (ToolCall){.text = turns[i].text, .n = turns[i].n,
                              .kwargs = h->kwargs ? h->kwargs[turns[i].prompt] : NULL};
    toolset_run(h->tools, calls, n);
    for (int i = 0; i < n; i++) {
        Buf content = {0}, text = {0};
        utf8_append_lossy(&content, calls[i].content, strlen(calls[i].content));  // what the tokenizer takes
        char *err = chat_tool_response_turn(&h->tok->chat, h->tools->schemas, content.data ? content.data : "",
                                            content.len, &text);
        if (err) die("a tool's response: %s", err);
        size_t bad;
        if (tokenizer_encode(h->tok, text.data, text.len, &turns[i].append, &bad) != 0)
            die("internal: a tool turn is not valid UTF-8 at byte %zu", bad);
        turns[i].content = content.data ? content.data : xstrdup("");  // the sample's record keeps it
        buf_free(&text);
        free(calls[i].content);
    }
    free(calls);
}
