// The OpenAI request and response formats of grpo serve (see api.h).
#define _GNU_SOURCE  // memmem, open_memstream
#include "serve/api.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "text/chat.h"
#include "text/utf8.h"

#define API_STOP_MAX 16
#define API_CHOICE_MAX 256               // guided_choice's strings at most
#define API_CHOICE_BYTES (64 << 10)      // and their bytes (the mask reads them for each token of the vocabulary)
#define API_REGEX_BYTES (16 << 10)       // guided_regex's pattern at most
#define API_MASK_CACHE_BYTES (16 << 20)  // a constrained request's masks cached (mask_cache.h) at most

// ---------------------------------------------------------------------------------------------
// parsing

static int fail(ApiError *err, int status, const char *param, char *message) {
    err->status = status;
    err->param = param;
    free(err->message);  // an inner check's, said again by the caller
    err->message = message;
    return -1;
}

// An optional number in [lo, hi] (absent or null: *out keeps its default). Returns -1 with err when not.
static int get_number(const cJSON *root, const char *key, double lo, double hi, double *out, ApiError *err) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!e || cJSON_IsNull(e)) return 0;
    if (!cJSON_IsNumber(e) || !(e->valuedouble >= lo && e->valuedouble <= hi))
        return fail(err, 400, key, xprintf("\"%s\" must be a number in [%g, %g]", key, lo, hi));
    *out = e->valuedouble;
    return 0;
}

static int get_int(const cJSON *root, const char *key, int64_t lo, int64_t hi, int64_t *out, ApiError *err) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!e || cJSON_IsNull(e)) return 0;
    if (!json_as_int(e, lo, hi, out))
        return fail(err, 400, key,
                    xprintf("\"%s\" must be an integer in [%lld, %lld]", key, (long long)lo, (long long)hi));
    return 0;
}

static int get_bool(const cJSON *root, const char *key, int *out, ApiError *err) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!e || cJSON_IsNull(e)) return 0;
    if (!cJSON_IsBool(e)) return fail(err, 400, key, xprintf("\"%s\" must be true or false", key));
    *out = cJSON_IsTrue(e);
    return 0;
}

// Each field of root must be in names or more (NULL-terminated lists; more may be NULL): any other is refused,
// as OpenAI's API does, rather than silently ignored.
static int only_fields(const cJSON *root, const char *const *names, const char *const *more, ApiError *err) {
    for (const cJSON *e = root->child; e; e = e->next) {
        snprintf(err->own_param, sizeof err->own_param, "%s", e->string);  // the body is freed before the answer
        if (!str_listed(e->string, names) && !str_listed(e->string, more))
            return fail(err, 400, err->own_param,
                        xprintf("unknown field \"%.100s\" (grpo serve refuses what it would ignore)", e->string));
    }
    return 0;
}

// The request's fields: each known one is read, or refused below when it asks for what grpo does not do. user
// and metadata change nothing.
static int check_known(const cJSON *root, int chat, ApiError *err) {
    static const char *const both[] = {
        "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "n", "seed",
        "stop", "stream", "stream_options", "logprobs", "return_token_ids", "presence_penalty",
        "frequency_penalty", "repetition_penalty", "logit_bias", "min_tokens", "ignore_eos", "stop_token_ids",
        "include_stop_str_in_output", "skip_special_tokens", "user", "metadata", "best_of", "response_format",
        "guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend", NULL};
    static const char *const completions[] = {"prompt", "echo", "suffix", NULL};
    static const char *const chats[] = {"messages", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
                                        "chat_template_kwargs", NULL};
    return only_fields(root, both, chat ? chats : completions, err);
}

// Fields OpenAI or vLLM have and grpo does not do: refused unless they ask for nothing.
static int check_unsupported(const cJSON *root, ApiError *err) {
    static const char *const guided[] = {"guided_grammar"};
    for (size_t i = 0; i < sizeof guided / sizeof guided[0]; i++) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, guided[i]);
        if (e && !cJSON_IsNull(e))
            return fail(err, 400, guided[i],
                        xprintf("\"%s\" is not supported (response_format json_object and json_schema, "
                                "guided_json, guided_choice and guided_regex are)", guided[i]));
    }
    const cJSON *backend = cJSON_GetObjectItemCaseSensitive(root, "guided_decoding_backend");  // vLLM's choice
    if (backend && !cJSON_IsNull(backend) && !cJSON_IsString(backend))  // of engine: grpo has one, same outputs
        return fail(err, 400, "guided_decoding_backend", xprintf("\"guided_decoding_backend\" must be a string"));
    const cJSON *parallel = cJSON_GetObjectItemCaseSensitive(root, "parallel_tool_calls");
    if (parallel && !cJSON_IsNull(parallel) && !cJSON_IsTrue(parallel))
        return fail(err, 400, "parallel_tool_calls",
                    xprintf("\"parallel_tool_calls\" must be true: the model may call several tools"));
    const cJSON *suffix = cJSON_GetObjectItemCaseSensitive(root, "suffix");
    if (suffix && !cJSON_IsNull(suffix))
        return fail(err, 400, "suffix", xprintf("\"suffix\" is not supported"));
    const cJSON *best = cJSON_GetObjectItemCaseSensitive(root, "best_of");
    if (best && !cJSON_IsNull(best) && !(cJSON_IsNumber(best) && best->valuedouble == 1))
        return fail(err, 400, "best_of", xprintf("\"best_of\" is not supported (only 1)"));
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    const char *mode = cJSON_IsString(choice) ? choice->valuestring : "";
    if (choice && !cJSON_IsNull(choice) && strcmp(mode, "auto") != 0 && strcmp(mode, "none") != 0)
        return fail(err, 400, "tool_choice", xprintf("\"tool_choice\" must be \"auto\" or \"none\""));
    return 0;
}

// A token id array into ids; -1 with err naming `what` when it is not one.
static int parse_ids(const cJSON *arr, int64_t vocab, IdList *ids, const char *what, ApiError *err) {
    int64_t i = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++) {
        int64_t v;
        if (!json_as_int(e, 0, vocab - 1, &v))
            return fail(
                err, 400, what,
                xprintf("%s[%lld] is not a token id in [0, %lld)", what, (long long)i, (long long)vocab));
        idlist_push(ids, (int32_t)v);
    }
    return 0;
}

static int encode(Tokenizer *tok, const char *text, size_t n, IdList *ids, const char *param, ApiError *err) {
    size_t bad;
    if (!tok) return fail(err, 400, param, xprintf("text needs a tokenizer, and the model has none"));
    if (tokenizer_encode(tok, text, n, ids, &bad) != 0)
        return fail(err, 400, param, xprintf("invalid UTF-8 at byte %zu", bad));
    return 0;
}

// "prompt": a string, an array of ids, or an array of either.
static int parse_prompts(ApiJob *job, const cJSON *prompt, uint32_t nul, Tokenizer *tok, int64_t vocab,
                         ApiError *err) {
    if (!prompt || cJSON_IsNull(prompt)) return fail(err, 400, "prompt", xprintf("\"prompt\" is required"));
    int list = cJSON_IsArray(prompt) && prompt->child &&
               (cJSON_IsString(prompt->child) || cJSON_IsArray(prompt->child));
    int n = list ? cJSON_GetArraySize(prompt) : 1;
    if (!cJSON_IsString(prompt) && !cJSON_IsArray(prompt))
        return fail(err, 400, "prompt", xprintf("\"prompt\" must be a string, token ids, or a list of them"));
    job->prompts = xcalloc((size_t)n, sizeof *job->prompts);
    job->n_prompts = n;
    const cJSON *e = list ? prompt->child : prompt;
    for (int i = 0; i < n; i++, e = e->next) {
        if (cJSON_IsString(e)) {
            size_t len;
            char *text = json_string_bytes(e, nul, &len);
            int rc = encode(tok, text, len, &job->prompts[i], "prompt", err);
            free(text);
            if (rc) return -1;
        } else if (cJSON_IsArray(e)) {
            if (parse_ids(e, vocab, &job->prompts[i], "prompt", err)) return -1;
        } else {
            return fail(err, 400, "prompt", xprintf("\"prompt\"[%d] must be a string or token ids", i));
        }
    }
    return 0;
}

// The structured-output mode asked for, as errors name it.
static const char *json_mode(const ApiJob *job) {
    if (job->cfg.regex) return "guided_regex";
    return job->cfg.n_choices ? "guided_choice" : job->json_any ? "json_object" : "json_schema";
}

// Whether the output is constrained (JSON mode, a schema, guided_choice or guided_regex): sampled through a mask,
// ended by a stop id.
static int constrained(const ApiJob *job) { return job->cfg.json_object || job->cfg.n_choices || job->cfg.regex; }

static int parse_messages(ApiJob *job, const cJSON *root, uint32_t nul, Tokenizer *tok, const ApiLimits *lim,
                          int generation, ApiError *err) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    if (!cJSON_IsArray(msgs) || !msgs->child)
        return fail(err, 400, "messages", xprintf("\"messages\" must be a non-empty array"));
    if (!tok) return fail(err, 400, "messages", xprintf("chat needs a tokenizer, and the model has none"));
    Buf text = {0};
    const cJSON *kwargs = cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs");
    if (cJSON_IsNull(kwargs)) kwargs = NULL;
    char *why = lim->vl ? vl_message_images(msgs, 0, &job->images, &job->n_images) : NULL;
    if (why) return fail(err, 400, "messages", why);
    why = chat_render(&tok->chat, msgs, tools, kwargs, nul, generation, &text);
    if (why) {
        buf_free(&text);
        return fail(err, 400, "messages", why);
    }
    job->prompts = xcalloc(1, sizeof *job->prompts);
    job->n_prompts = 1;
    int none = cJSON_IsString(choice) && !strcmp(choice->valuestring, "none");
    job->tools = cJSON_GetArraySize(tools) > 0 && !none;
    job->cfg.end_at_tool_call = job->tools;  // the client runs the tool: the model's turn ends with its call
    if (job->tools && constrained(job))  // a </tool_call> inside a string would end the output
        return fail(err, 400, job->json_field, xprintf("%s cannot be used with tools", json_mode(job)));
    job->reasoning = lim->reasoning;
    int rc = encode(tok, text.data ? text.data : "", text.len, &job->prompts[0], "messages", err);
    buf_free(&text);
    if (rc || !lim->vl) return rc;
    why = vl_expand_images(&lim->vl->proc, (int32_t)lim->model->cfg.image_pad_id, job->images, job->n_images, 0,
                           &job->prompts[0]);
    return why ? fail(err, 400, "messages", why) : 0;
}

// Field `field` of root, a list of at most `most` non-empty strings without U+0000 (or one string, with `one`),
// into *out (malloc'd copies, *n of them; as many as were read on an error). Absent or null: none.
static int string_list(const cJSON *root, const char *field, uint32_t nul, int most, int one, char ***out, int *n,
                       ApiError *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, field);
    if (!v || cJSON_IsNull(v)) return 0;
    int single = one && cJSON_IsString(v), count = single ? 1 : cJSON_GetArraySize(v);
    if (!single && !cJSON_IsArray(v))
        return fail(err, 400, field,
                    xprintf("\"%s\" must be %sa list of strings", field, one ? "a string or " : ""));
    if (count > most) return fail(err, 400, field, xprintf("\"%s\" holds at most %d strings", field, most));
    *out = xcalloc((size_t)(count ? count : 1), sizeof **out);
    const cJSON *e = single ? v : v->child;
    for (int i = 0; i < count; i++, e = e->next) {
        size_t len;
        if (!cJSON_IsString(e)) return fail(err, 400, field, xprintf("\"%s\"[%d] must be a string", field, i));
        (*out)[i] = json_string_bytes(e, nul, &len);
        *n = i + 1;
        if (len == 0 || strlen((*out)[i]) != len)
            return fail(err, 400, field,
                        xprintf("\"%s\"[%d] must be a non-empty string without U+0000", field, i));
    }
    return 0;
}

static int parse_stop(ApiJob *job, const cJSON *root, uint32_t nul, ApiError *err) {
    int rc = string_list(root, "stop", nul, API_STOP_MAX, 1, &job->stop, &job->cfg.n_stop_strings, err);
    job->cfg.stop_strings = (const char *const *)job->stop;
    return rc;
}

// vLLM's "guided_choice": the output is one of these strings (choice_mask).
static int parse_choice(ApiJob *job, const cJSON *root, uint32_t nul, ApiError *err) {
    if (string_list(root, "guided_choice", nul, API_CHOICE_MAX, 0, &job->choice, &job->cfg.n_choices, err))
        return -1;
    job->cfg.choices = (const char *const *)job->choice;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "guided_choice");
    if (!v || cJSON_IsNull(v)) return 0;
    size_t bytes = 0;
    for (int i = 0; i < job->cfg.n_choices; i++) bytes += strlen(job->choice[i]);
    if (job->cfg.n_choices == 0 || bytes > API_CHOICE_BYTES)
        return fail(err, 400, "guided_choice",
                    xprintf("\"guided_choice\" must hold at least one string, %d bytes at most in all",
                            API_CHOICE_BYTES));
    if (job->cfg.json_object)
        return fail(err, 400, "guided_choice",
                    xprintf("\"guided_choice\" and \"%s\" both given", job->json_field));
    job->json_field = "guided_choice";
    return 0;
}

// vLLM's "guided_regex": the output is a full match of the pattern (regex_dfa.h), then a stop token.
static int parse_regex(ApiJob *job, const cJSON *root, uint32_t nul, ApiError *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "guided_regex");
    if (!v || cJSON_IsNull(v)) return 0;
    size_t len = 0;
    char *pattern = cJSON_IsString(v) ? json_string_bytes(v, nul, &len) : NULL;
    char *why = !pattern || len == 0 || len > API_REGEX_BYTES || strlen(pattern) != len
                    ? xprintf("\"guided_regex\" must be a non-empty string without U+0000, %d bytes at most",
                              API_REGEX_BYTES)
                : job->cfg.json_object || job->cfg.n_choices
                    ? xprintf("\"guided_regex\" and \"%s\" both given", job->json_field)
                    : NULL;
    if (!why && (why = regex_compile(pattern, len, 0, NULL, &job->regex)) == NULL) {
        job->cfg.regex = &job->regex;
        job->json_field = "guided_regex";
    }
    free(pattern);
    return why ? fail(err, 400, "guided_regex", why) : 0;
}

// "logit_bias": {"token id": bias in [-100, 100]}, as OpenAI.
static int parse_bias(ApiJob *job, const cJSON *root, int64_t vocab, ApiError *err) {
    const cJSON *bias = cJSON_GetObjectItemCaseSensitive(root, "logit_bias");
    if (!bias || cJSON_IsNull(bias)) return 0;
    if (!cJSON_IsObject(bias))
        return fail(err, 400, "logit_bias", xprintf("\"logit_bias\" must be an object of token ids to biases"));
    int n = cJSON_GetArraySize(bias);
    job->bias_ids = xcalloc((size_t)(n ? n : 1), sizeof *job->bias_ids);
    job->bias = xcalloc((size_t)(n ? n : 1), sizeof *job->bias);
    int i = 0;
    for (const cJSON *e = bias->child; e; e = e->next, i++) {
        char *end;
        long long id = strtoll(e->string, &end, 10);
        int repeated = 0;
        for (int k = 0; k < i; k++) repeated |= job->bias_ids[k] == id;
        if (!(*e->string >= '0' && *e->string <= '9') || *end || id < 0 || id >= vocab || repeated)
            return fail(err, 400, "logit_bias",
                        xprintf("\"logit_bias\" key \"%.40s\" is not a token id in [0, %lld), or repeats one",
                                e->string, (long long)vocab));
        if (!cJSON_IsNumber(e) || !(e->valuedouble >= -100 && e->valuedouble <= 100))
            return fail(err, 400, "logit_bias", xprintf("\"logit_bias\"[\"%lld\"] must be a number in [-100, 100]",
                                                        id));
        job->bias_ids[i] = (int32_t)id;
        job->bias[i] = (float)e->valuedouble;
    }
    job->cfg.proc.bias_ids = job->bias_ids;
    job->cfg.proc.bias = job->bias;
    job->cfg.proc.n_bias = n;
    return 0;
}

// The stop ids: the model's (none with ignore_eos) and "stop_token_ids".
static int parse_stop_ids(ApiJob *job, const cJSON *root, const ApiLimits *lim, int64_t vocab, ApiError *err) {
    int ignore_eos = 0;
    if (get_bool(root, "ignore_eos", &ignore_eos, err)) return -1;
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(root, "stop_token_ids");
    if (ids && !cJSON_IsNull(ids) && !cJSON_IsArray(ids))
        return fail(err, 400, "stop_token_ids", xprintf("\"stop_token_ids\" must be a list of token ids"));
    int n = cJSON_GetArraySize(ids);
    if (n > API_STOP_MAX)
        return fail(err, 400, "stop_token_ids", xprintf("\"stop_token_ids\" holds at most %d ids", API_STOP_MAX));
    job->stop_ids = xcalloc((size_t)(lim->n_stop_ids + n + 1), sizeof *job->stop_ids);
    int k = 0;
    for (int i = 0; i < lim->n_stop_ids && !ignore_eos; i++) job->stop_ids[k++] = lim->stop_ids[i];
    int i = 0;
    for (const cJSON *e = ids ? ids->child : NULL; e; e = e->next, i++) {
        int64_t v;
        if (!json_as_int(e, 0, vocab - 1, &v))
            return fail(err, 400, "stop_token_ids",
                        xprintf("\"stop_token_ids\"[%d] is not a token id in [0, %lld)", i, (long long)vocab));
        job->stop_ids[k++] = (int32_t)v;
    }
    job->cfg.stop_ids = job->stop_ids;
    job->cfg.n_stop_ids = k;
    return 0;
}

// nul: the request's U+0000 sentinel, which the schema must not hold (its strings would differ).
static int compile_schema(ApiJob *job, const cJSON *schema, const char *field, uint32_t nul, ApiError *err) {
    char *text = nul ? cJSON_PrintUnformatted(schema) : NULL;
    if (nul && !text) die("out of memory printing a schema");
    int held = text && json_holds_nul(text, nul);
    free(text);
    if (held) return fail(err, 400, field, xprintf("%s: U+0000 in the schema is not supported", field));
    char *why = NULL;
    job->schema = json_schema_compile(schema, &why);
    if (!job->schema) {
        fail(err, 400, field, xprintf("%s: %s", field, why));
        free(why);
        return -1;
    }
    job->cfg.json_schema = job->schema;
    return 0;
}

// "response_format": {"type": "text"}, {"type": "json_object"} (JSON mode: json_mask.h), or {"type": "json_schema",
// "json_schema": {"name": ..., "schema": {...}}} (structured outputs: json_schema.h); or vLLM's "guided_json": a
// schema (or its JSON text).
static int parse_format(ApiJob *job, const cJSON *root, uint32_t nul, ApiError *err) {
    static const char *const fields[] = {"type", "json_schema", NULL};
    static const char *const inner[] = {"name", "schema", "strict", "description", NULL};
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(root, "response_format");
    const cJSON *guided = cJSON_GetObjectItemCaseSensitive(root, "guided_json");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(format, "type");
    const cJSON *spec = cJSON_GetObjectItemCaseSensitive(format, "json_schema");
    const char *t = cJSON_IsString(type) ? type->valuestring : "";
    if (guided && !cJSON_IsNull(guided)) {
        if (format && !cJSON_IsNull(format))
            return fail(err, 400, "guided_json", xprintf("\"guided_json\" and \"response_format\" both given"));
        job->json_field = "guided_json";
        job->cfg.json_object = 1;
        if (!cJSON_IsString(guided)) return compile_schema(job, guided, "guided_json", nul, err);
        uint32_t its_nul = 0;  // as the request's own JSON: nothing after it, the last of duplicate keys
        cJSON *parsed = NULL;
        if (!json_holds_nul(guided->valuestring, nul))
            parsed = json_parse_line(guided->valuestring, strlen(guided->valuestring), &its_nul);
        if (!parsed)
            return fail(err, 400, "guided_json",
                        xprintf("\"guided_json\" is a string that is not JSON (or holds U+0000)"));
        int rc = compile_schema(job, parsed, "guided_json", its_nul, err);
        cJSON_Delete(parsed);
        return rc;
    }
    if (!format || cJSON_IsNull(format)) return 0;
    if (!cJSON_IsObject(format) || only_fields(format, fields, NULL, err) ||
        (strcmp(t, "text") && strcmp(t, "json_object") && strcmp(t, "json_schema")) ||
        (spec != NULL) != !strcmp(t, "json_schema"))
        return fail(err, 400, "response_format",
                    xprintf("\"response_format\" must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                            "{\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}}}"));
    job->json_field = "response_format";
    job->cfg.json_object = strcmp(t, "text") != 0;
    if (!spec && job->cfg.json_object) {  // json_object: the schema of any object
        cJSON *object = cJSON_Parse("{\"type\": \"object\"}");
        if (!object) die("out of memory");
        int rc = compile_schema(job, object, "response_format", nul, err);
        cJSON_Delete(object);
        job->json_any = 1;
        return rc;
    }
    if (!spec) return 0;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(spec, "name");
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(spec, "schema");
    if (!cJSON_IsObject(spec) || only_fields(spec, inner, NULL, err) || !cJSON_IsString(name) || !schema)
        return fail(err, 400, "response_format",
                    xprintf("\"response_format\".json_schema must be {\"name\": \"...\", \"schema\": {...}} "
                            "(\"strict\" and \"description\" optional)"));
    return compile_schema(job, schema, "response_format", nul, err);
}

static int parse_logprobs(ApiJob *job, const cJSON *root, ApiError *err) {
    job->logprobs = -1;
    if (!job->chat) {
        int64_t k = -1;
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "logprobs");
        if (cJSON_IsBool(e))
            k = cJSON_IsTrue(e) ? 0 : -1;  // some clients send true/false
        else if (get_int(root, "logprobs", 0, API_TOP_MAX, &k, err))
            return -1;
        job->logprobs = (int)k;
        return 0;
    }
    int on = 0;
    int64_t k = 0;
    if (get_bool(root, "logprobs", &on, err) || get_int(root, "top_logprobs", 0, API_TOP_MAX, &k, err))
        return -1;
    if (k > 0 && !on)
        return fail(err, 400, "top_logprobs", xprintf("\"top_logprobs\" needs \"logprobs\": true"));
    job->logprobs = on ? (int)k : -1;
    return 0;
}

static int parse_fields(ApiJob *job, const cJSON *root, uint32_t nul, const ApiLimits *lim, int64_t vocab,
                        ApiError *err) {
    double t = 1.0, top_p = 1.0, min_p = 0.0, rep = 1.0, presence = 0.0, frequency = 0.0;
    int64_t top_k = 0, n = 1, seed = 0, min_tokens = 0;
    int64_t max_tokens = job->chat ? -1 : 16;  // OpenAI's defaults: 16, and the room left for chat
    if (get_number(root, "temperature", 0.0, 100.0, &t, err) ||
        get_number(root, "top_p", 1e-9, 1.0, &top_p, err) ||
        get_int(root, "top_k", -1, INT32_MAX, &top_k, err) || get_int(root, "n", 1, lim->max_n, &n, err) ||
        get_int(root, "seed", -(INT64_C(1) << 53), INT64_C(1) << 53, &seed, err) ||
        get_int(root, "max_tokens", 0, INT32_MAX, &max_tokens, err) ||
        get_int(root, "max_completion_tokens", 0, INT32_MAX, &max_tokens, err) ||
        parse_stop(job, root, nul, err) || parse_logprobs(job, root, err) ||
        get_bool(root, "stream", &job->stream, err) ||
        get_bool(root, "return_token_ids", &job->return_token_ids, err) || check_unsupported(root, err) ||
        get_number(root, "min_p", 0.0, 1.0, &min_p, err) ||
        get_number(root, "repetition_penalty", 1e-6, 100.0, &rep, err) ||
        get_number(root, "presence_penalty", -2.0, 2.0, &presence, err) ||
        get_number(root, "frequency_penalty", -2.0, 2.0, &frequency, err) ||
        get_int(root, "min_tokens", 0, INT32_MAX, &min_tokens, err) ||
        get_bool(root, "include_stop_str_in_output", &job->cfg.include_stop_str, err) ||
        get_bool(root, "skip_special_tokens", &job->cfg.skip_special, err) ||
        parse_bias(job, root, vocab, err) || parse_stop_ids(job, root, lim, vocab, err) ||
        parse_format(job, root, nul, err) || parse_choice(job, root, nul, err) || parse_regex(job, root, nul, err))
        return -1;
    if (constrained(job) && min_tokens > 0)  // it would mask the stop ids a complete output needs
        return fail(err, 400, "min_tokens", xprintf("\"min_tokens\" cannot be used with %s", json_mode(job)));
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(root, "stop_token_ids");  // text tokens: masked inside
    if (constrained(job) && (job->cfg.n_stop_strings || cJSON_GetArraySize(ids) > 0))  // or cut the output
        return fail(err, 400, job->cfg.n_stop_strings ? "stop" : "stop_token_ids",
                    xprintf("%s ends at the model's stop token: \"stop\" and \"stop_token_ids\" would "
                            "cut the output", json_mode(job)));
    if (constrained(job) && job->cfg.n_stop_ids == 0)
        return fail(err, 400, job->json_field,
                    xprintf("%s ends the output with a stop token id: none is left (ignore_eos, or a model "
                            "without eos)", json_mode(job)));
    if (job->cfg.json_object || job->cfg.regex) job->cfg.mask_cache = mask_cache_new(API_MASK_CACHE_BYTES);
    if (max_tokens >= 0 && min_tokens > max_tokens)
        return fail(err, 400, "min_tokens", xprintf("\"min_tokens\" %lld exceeds max_tokens %lld",
                                                    (long long)min_tokens, (long long)max_tokens));
    if (!job->chat && get_bool(root, "echo", &job->echo, err)) return -1;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && !cJSON_IsNull(so) && !cJSON_IsObject(so))
        return fail(err, 400, "stream_options", xprintf("\"stream_options\" must be an object"));
    static const char *const so_fields[] = {"include_usage", NULL};
    if (cJSON_IsObject(so) && (only_fields(so, so_fields, NULL, err) || get_bool(so, "include_usage", &job->include_usage,
                                                                            err)))
        return -1;
    const cJSON *se = cJSON_GetObjectItemCaseSensitive(root, "seed");
    job->has_seed = se && !cJSON_IsNull(se);
    job->seed = (uint64_t)seed;
    // as vLLM: a temperature below 1e-5 is greedy (dividing the logits by it would overflow)
    job->cfg.sampler.temperature = t < 1e-5 ? 0.0f : (float)t;
    job->cfg.sampler.top_p = (float)top_p;
    job->cfg.sampler.top_k = top_k < 0 ? 0 : (int)top_k;
    job->cfg.sampler.min_p = (float)min_p;
    job->cfg.proc.repetition_penalty = (float)rep;
    job->cfg.proc.presence_penalty = (float)presence;
    job->cfg.proc.frequency_penalty = (float)frequency;
    job->cfg.proc.min_tokens = (int)min_tokens;
    job->cfg.share_prefill = 1;
    job->n = (int)n;
    job->max_tokens = (int)max_tokens;
    return 0;
}

int api_parse(ApiJob *job, int chat, const char *body, size_t n, Tokenizer *tok, const ApiLimits *lim,
              int64_t vocab, ApiError *err) {
    memset(job, 0, sizeof *job);
    memset(err, 0, sizeof *err);
    job->chat = chat;
    job->vocab = vocab;
    size_t bad = utf8_check(body, n);
    if (bad < n) return fail(err, 400, NULL, xprintf("the body is not valid UTF-8 (byte %zu)", bad));
    uint32_t nul;
    cJSON *root = json_parse_line(body, n, &nul);
    int rc = -1;
    if (!cJSON_IsObject(root)) {
        fail(err, 400, NULL, xprintf("the body is not a JSON object"));
        goto out;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model && !cJSON_IsNull(model) &&
        (!cJSON_IsString(model) || strcmp(model->valuestring, lim->model_name))) {
        fail(err, 404, "model",
             xprintf("the model \"%.100s\" does not exist (this server has \"%s\")",
                     cJSON_IsString(model) ? model->valuestring : "?", lim->model_name));
        goto out;
    }
    if (check_known(root, chat, err) || parse_fields(job, root, nul, lim, vocab, err)) goto out;
    if (constrained(job) && !tok) {
        fail(err, 400, job->json_field,
             xprintf("%s needs the model's tokenizer: this server has none", json_mode(job)));
        goto out;
    }
    if (job->cfg.n_stop_strings && !tok) {  // stop strings are matched in decoded text
        fail(err, 400, "stop",
             xprintf("\"stop\" needs the model's tokenizer: this server has none (token ids only)"));
        goto out;
    }
    if (chat ? parse_messages(job, root, nul, tok, lim, 1, err)
             : parse_prompts(job, cJSON_GetObjectItemCaseSensitive(root, "prompt"), nul, tok, vocab, err))
        goto out;
    if ((int64_t)job->n_prompts * job->n > lim->max_batch) {
        fail(err, 400, "n",
             xprintf("%d prompts x n = %d choices exceed the server's --max-batch %d", job->n_prompts, job->n,
                     lim->max_batch));
        goto out;
    }
    for (int i = 0; i < job->n_prompts; i++) {
        int64_t len = (int64_t)job->prompts[i].n, room = lim->max_len - len;
        if (len == 0) {
            fail(err, 400, chat ? "messages" : "prompt", xprintf("prompt %d is empty", i));
            goto out;
        }
        if (job->max_tokens < 0) job->max_tokens = room > 0 ? (int)(room < INT32_MAX ? room : INT32_MAX) : 1;
        int64_t least = job->schema ? 1 + json_schema_least(job->schema)  // and a stop token
                        : job->cfg.regex ? 1 + job->regex.dist[0]
                                         : 0;
        for (int c = 0; c < job->cfg.n_choices; c++) {
            int64_t bytes = 1 + (int64_t)strlen(job->choice[c]);  // a token a byte at worst
            if (c == 0 || bytes < least) least = bytes;
        }
        if (constrained(job) && job->max_tokens < least) {
            fail(err, 400, "max_tokens",
                 xprintf("%s needs max_tokens >= %lld (its shortest answer, a token a byte, and a stop token)",
                         json_mode(job), (long long)least));
            goto out;
        }
        if (len + (job->max_tokens > 0 ? job->max_tokens : 1) > lim->max_len) {
            fail(err, 400, "max_tokens",
                 xprintf(
                     "prompt %d has %lld tokens; with max_tokens %d that exceeds the server's --max-len %lld",
                     i, (long long)len, job->max_tokens, (long long)lim->max_len));
            goto out;
        }
    }
    job->rp = xcalloc((size_t)job->n_prompts, sizeof *job->rp);
    job->rr = xcalloc((size_t)job->n_prompts, sizeof *job->rr);
    job->choices = xcalloc((size_t)job->n_prompts * (size_t)job->n, sizeof *job->choices);
    job->samples = xcalloc((size_t)job->n_prompts * (size_t)job->n, sizeof *job->samples);
    for (int i = 0; i < job->n_prompts * job->n; i++) job->choices[i].s = &job->samples[i];
    int want_prompt = job->echo && job->logprobs >= 0;
    if (want_prompt) {
        job->prompt_lp = xcalloc((size_t)job->n_prompts, sizeof *job->prompt_lp);
        job->prompt_tops = xcalloc((size_t)job->n_prompts, sizeof *job->prompt_tops);
    }
    for (int i = 0; i < job->n_prompts; i++) {
        job->rp[i] = (RolloutPrompt){.ids = job->prompts[i].ids,
                                     .n = (int64_t)job->prompts[i].n,
                                     .max_new_tokens = job->max_tokens > 0 ? job->max_tokens : 1,
                                     .has_seed = job->has_seed,
                                     .seed = job->seed};
        if (want_prompt) {
            job->prompt_lp[i] = xcalloc(job->prompts[i].n, sizeof **job->prompt_lp);
            job->prompt_tops[i] = xcalloc(job->prompts[i].n, sizeof **job->prompt_tops);
        }
    }
    int64_t need = api_job_kv_positions(job);
    if (lim->kv_positions > 0 && need > lim->kv_positions) {
        fail(err, 400, "max_tokens",
             xprintf("%d sequences (prompts x n) of prompt + max_tokens need %lld positions of KV cache; the "
                     "server's holds %lld (--kv-cache-mb)",
                     job->n_prompts * job->n, (long long)need, (long long)lim->kv_positions));
        goto out;
    }
    rc = 0;
out:
    cJSON_Delete(root);
    return rc;
}

int api_job_check_images(ApiJob *job, const ApiLimits *lim, ApiError *err) {
    for (int i = 0; i < job->n_images; i++) {
        VlImage whole = job->images[i];
        char *why = vl_image_grid_try(&lim->vl->proc, &whole, 1);
        if (!why && memcmp(whole.grid, job->images[i].grid, sizeof whole.grid) != 0)
            why = xprintf("%s: its header and its pixels disagree on its size", whole.path);
        if (why) return fail(err, 400, "messages", why);
    }
    return 0;
}

void api_job_images(ApiJob *job, const ApiLimits *lim) {
    if (!job->n_images) return;
    job->image_feats = vl_prompt_features(lim->vl, job->images, job->n_images, "a request's images");
    job->rp[0].vl = vl_prompt_inputs(lim->model, job->rp[0].ids, job->rp[0].n, job->images, job->n_images,
                                     job->image_feats, lim->vl->proc.merge, &job->image_in);
    for (int i = 0; i < job->n_images; i++) {  // the features are all the engine reads
        free(job->images[i].bytes);
        job->images[i].bytes = NULL;
    }
}

int64_t api_job_kv_positions(const ApiJob *job) {
    int64_t n = 0;
    for (int i = 0; i < job->n_prompts; i++) n += job->n * (job->rp[i].n + job->rp[i].max_new_tokens);
    return n;
}

void api_job_free(ApiJob *job) {
    for (int i = 0; i < job->n_prompts; i++) {
        free(job->prompts[i].ids);
        if (job->prompt_lp) free(job->prompt_lp[i]);
        if (job->prompt_tops) free(job->prompt_tops[i]);
    }
    for (int i = 0; job->choices && i < job->n_prompts * job->n; i++) {
        rollout_sample_free(&job->samples[i]);
        free(job->choices[i].tops);
    }
    free(job->samples);
    for (int i = 0; i < job->cfg.n_stop_strings; i++) free(job->stop[i]);
    free(job->stop);
    for (int i = 0; i < job->cfg.n_choices; i++) free(job->choice[i]);
    free(job->choice);
    free(job->stop_ids);
    json_schema_free(job->schema);
    regex_free(&job->regex);
    mask_cache_free(job->cfg.mask_cache);
    free(job->bias_ids);
    free(job->bias);
    for (int i = 0; i < job->n_images; i++) vl_image_free(&job->images[i]);
    free(job->images);
    free(job->image_feats);
    decoder_vl_inputs_free(&job->image_in);
    free(job->prompts);
    free(job->prompt_lp);
    free(job->prompt_tops);
    free(job->choices);
    free(job->rr);
    free(job->rp);
    memset(job, 0, sizeof *job);
}

// ---------------------------------------------------------------------------------------------
// log-probs

// log p of row[id] and the k most likely tokens of softmax(row * scale), in double.
static float row_logprobs(const float *row, int64_t V, double scale, int32_t id, int k, ApiTop *top) {
    double mx = -INFINITY, sum = 0.0;
    for (int64_t v = 0; v < V; v++) mx = row[v] * scale > mx ? row[v] * scale : mx;
    for (int64_t v = 0; v < V; v++) sum += exp(row[v] * scale - mx);
    double lse = mx + log(sum);
    int n = 0;
    for (int64_t v = 0; v < V && k > 0; v++) {  // insertion into the k best so far, best first
        float lp = (float)(row[v] * scale - lse);
        if (!(lp > -INFINITY)) continue;  // masked (JSON mode, min_tokens): not a candidate
        if (n == k && !(lp > top->lp[n - 1])) continue;
        int j = n < k ? n++ : n - 1;
        for (; j > 0 && top->lp[j - 1] < lp; j--) {
            top->lp[j] = top->lp[j - 1];
            top->id[j] = top->id[j - 1];
        }
        top->lp[j] = lp;
        top->id[j] = (int32_t)v;
    }
    for (int j = n; j < API_TOP_MAX; j++) top->id[j] = -1;
    return id >= 0 ? (float)(row[id] * scale - lse) : 0.0f;
}

void api_logits(void *user, int prompt, int sample, int64_t row0, int64_t rows, const float *logits) {
    ApiJob *job = user;
    int64_t V = job->vocab;
    int k = job->logprobs > 0 ? job->logprobs : 0;
    if (sample < 0) {  // the prompt's: row i gives token i + 1 under softmax(logits), as grpo score
        const IdList *ids = &job->prompts[prompt];
        for (int64_t r = 0; r < rows; r++) {
            int64_t i = row0 + r;
            if (i + 1 >= (int64_t)ids->n) continue;
            job->prompt_lp[prompt][i + 1] =
                row_logprobs(logits + r * V, V, 1.0, ids->ids[i + 1], k, &job->prompt_tops[prompt][i + 1]);
        }
        return;
    }
    ApiChoice *c = &job->choices[prompt * job->n + sample];
    if (c->n_tops == c->cap_tops) {
        c->cap_tops = c->cap_tops ? 2 * c->cap_tops : 16;
        c->tops = xrealloc(c->tops, (size_t)c->cap_tops * sizeof *c->tops);
    }
    double T = job->cfg.sampler.temperature > 0 ? job->cfg.sampler.temperature : 1.0;
    row_logprobs(logits, V, 1.0 / T, -1, k, &c->tops[c->n_tops++]);
}

// ---------------------------------------------------------------------------------------------
// writing

static void write_text(FILE *f, const char *s, size_t n);

// A token as text (its bytes made valid UTF-8), or "token_id:N" without a tokenizer.
static void write_token(FILE *f, const Tokenizer *tok, int32_t id) {
    size_t len = 0;
    const char *b = tok ? tokenizer_id_bytes(tok, id, &len) : NULL;
    char name[24];
    if (!tok) {
        snprintf(name, sizeof name, "token_id:%d", id);
        b = name;
        len = strlen(name);
    }
    write_text(f, b, b ? len : 0);
}

static void write_token_bytes(FILE *f, const Tokenizer *tok, int32_t id) {
    size_t len = 0;
    const unsigned char *b = tok ? (const unsigned char *)tokenizer_id_bytes(tok, id, &len) : NULL;
    fputc('[', f);
    for (size_t i = 0; b && i < len; i++) fprintf(f, i ? ", %u" : "%u", b[i]);
    fputc(']', f);
}

static void write_text(FILE *f, const char *s, size_t n) {
    Buf clean = {0};
    utf8_append_lossy(&clean, s ? s : "", n);
    json_write_string(f, clean.data ? clean.data : "", clean.len);
    buf_free(&clean);
}

static void write_ids(FILE *f, const int32_t *ids, int64_t n) {
    fputc('[', f);
    for (int64_t i = 0; i < n; i++) fprintf(f, i ? ", %d" : "%d", ids[i]);
    fputc(']', f);
}

// Tokens a choice reports: none when max_tokens is 0 (the engine's one sample is dropped).
static int out_tokens(const ApiJob *job, const ApiChoice *c) { return job->max_tokens == 0 ? 0 : c->s->n; }

static size_t out_text_len(const ApiJob *job, const ApiChoice *c) {
    return job->max_tokens == 0 ? 0 : (size_t)c->s->text_end;
}

// Completions' top_logprobs entry: {"token": lp, ...} (k of them). k = 0 (`"logprobs": 0`): the chosen
// token alone, {"token": its lp}, as vLLM and OpenAI give.
static void write_top_map(FILE *f, const Tokenizer *tok, const ApiTop *top, int k, int32_t id, double lp) {
    fputc('{', f);
    if (k == 0) {
        write_token(f, tok, id);
        fputs(": ", f);
        json_write_number(f, lp);
    }
    for (int j = 0; j < k && top->id[j] >= 0; j++) {
        if (j) fputs(", ", f);
        write_token(f, tok, top->id[j]);
        fputs(": ", f);
        json_write_number(f, top->lp[j]);
    }
    fputc('}', f);
}

// The bytes token id adds to a text (0 without a tokenizer; none for a special token with skip:
// skip_special_tokens); first: the text's first token, less the leading spaces decode strips there.
static size_t text_bytes(const Tokenizer *tok, int32_t id, int skip, int first) {
    size_t len = 0;
    const char *b = tok && !(skip && tokenizer_id_special(tok, id)) ? tokenizer_id_bytes(tok, id, &len) : NULL;
    return b && first ? len - tokenizer_lead_strip(tok, b, len) : len;
}

// The bytes tokens ids[0..n) add to a text (text_bytes; first: ids[0] begins it).
static size_t token_bytes(const Tokenizer *tok, const int32_t *ids, int64_t n, int skip, int first) {
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) total += text_bytes(tok, ids[i], skip, first && i == 0);
    return total;
}

// An echoed prompt's text, as decode gives it (the first token's stripped spaces left out), then the spaces the
// rollout left out of the completion's start (a SentencePiece-style decoder's Strip), which follow a prompt.
static void echo_text(const ApiJob *job, const Tokenizer *tok, const IdList *ids, const ApiChoice *c, Buf *text) {
    for (size_t t = 0; tok && t < ids->n; t++) {
        size_t bl = 0;
        const char *b = tokenizer_id_bytes(tok, ids->ids[t], &bl);
        size_t lead = b && t == 0 ? tokenizer_lead_strip(tok, b, bl) : 0;
        if (b) buf_append(text, b + lead, bl - lead);
    }
    if (!c || !tok || out_tokens(job, c) == 0) return;
    static const char SPACES[] = "        ";
    _Static_assert(sizeof SPACES == TOKENIZER_MAX_STRIP + 1, "a space for each the decoder may strip");
    size_t len = text_bytes(tok, c->s->tokens[0], job->cfg.skip_special, 0);
    buf_append(text, SPACES, len - text_bytes(tok, c->s->tokens[0], job->cfg.skip_special, 1));
}

// Completions' logprobs object over tokens [from, to) of a choice, with the prompt's first when with_prompt.
// text_offset counts from the start of the whole text (the echoed prompt's, then the choice's), so a stream's
// chunks continue where the last one stopped.
static void write_completion_logprobs(FILE *f, const ApiJob *job, const Tokenizer *tok, int p,
                                      const ApiChoice *c, int from, int to, int with_prompt) {
    const IdList *ids = &job->prompts[p];
    int np = with_prompt ? (int)ids->n : 0, k = job->logprobs;
    size_t offset = 0;
    if (!with_prompt) {
        offset = token_bytes(tok, c->s->tokens, from, job->cfg.skip_special, !job->echo);
        if (job->echo) offset += token_bytes(tok, ids->ids, (int64_t)ids->n, 0, 1);
    }
    fputs("{\"tokens\": [", f);
    for (int i = 0; i < np + to - from; i++) {
        if (i) fputs(", ", f);
        write_token(f, tok, i < np ? ids->ids[i] : c->s->tokens[from + i - np]);
    }
    fputs("], \"token_logprobs\": [", f);
    for (int i = 0; i < np + to - from; i++) {
        if (i) fputs(", ", f);
        if (i == 0 && np)
            fputs("null", f);
        else
            json_write_number(f, i < np ? job->prompt_lp[p][i] : c->s->logprobs[from + i - np]);
    }
    fputs("], \"top_logprobs\": [", f);
    for (int i = 0; i < np + to - from; i++) {
        if (i) fputs(", ", f);
        if (i == 0 && np)
            fputs("null", f);
        else
            write_top_map(f, tok, i < np ? &job->prompt_tops[p][i] : &c->tops[from + i - np], k,
                          i < np ? ids->ids[i] : c->s->tokens[from + i - np],
                          i < np ? job->prompt_lp[p][i] : c->s->logprobs[from + i - np]);
    }
    fputs("], \"text_offset\": [", f);
    for (int i = 0; i < np + to - from; i++) {
        int32_t id = i < np ? ids->ids[i] : c->s->tokens[from + i - np];
        int64_t at = i < np ? i : (job->echo ? (int64_t)ids->n : 0) + from + i - np;  // its place in the text
        fprintf(f, i ? ", %zu" : "%zu", offset);
        offset += text_bytes(tok, id, i >= np && job->cfg.skip_special, at == 0);
    }
    fputs("]}", f);
}

// Chat's logprobs.content entries for tokens [from, to) of a choice.
static void write_chat_logprobs(FILE *f, const ApiJob *job, const Tokenizer *tok, const ApiChoice *c,
                                int from, int to) {
    fputs("{\"content\": [", f);
    for (int i = from; i < to; i++) {
        fputs(i > from ? ", {\"token\": " : "{\"token\": ", f);
        write_token(f, tok, c->s->tokens[i]);
        fputs(", \"logprob\": ", f);
        json_write_number(f, c->s->logprobs[i]);
        fputs(", \"bytes\": ", f);
        write_token_bytes(f, tok, c->s->tokens[i]);
        fputs(", \"top_logprobs\": [", f);
        for (int j = 0; j < job->logprobs && c->tops[i].id[j] >= 0; j++) {
            fputs(j ? ", {\"token\": " : "{\"token\": ", f);
            write_token(f, tok, c->tops[i].id[j]);
            fputs(", \"logprob\": ", f);
            json_write_number(f, c->tops[i].lp[j]);
            fputs(", \"bytes\": ", f);
            write_token_bytes(f, tok, c->tops[i].id[j]);
            fputc('}', f);
        }
        fputs("]}", f);
    }
    fputs("]}", f);
}

#define THINK_OPEN "<think>"
#define THINK_CLOSE "</think>"

// Qwen3's reasoning (job->reasoning, vLLM's --reasoning-parser qwen3): a chat text that opens with <think>
// holds its reasoning up to </think> (all of it when none comes), its content after; another text is all
// content. Of text[0, n): the reasoning [r0, r1), where the content starts (c0: SIZE_MAX while the reasoning is
// still open, or the text may yet open with <think>).
typedef struct {
    size_t r0, r1, c0;
    int open;
} Think;

static Think think_split(const ApiJob *job, const char *text, size_t n, int ended) {
    size_t lo = strlen(THINK_OPEN), lc = strlen(THINK_CLOSE);
    if (!job->reasoning) return (Think){0, 0, 0, 0};
    if (n < lo && !ended && !memcmp(text, THINK_OPEN, n)) return (Think){n, n, SIZE_MAX, 1};
    if (n < lo || memcmp(text, THINK_OPEN, lo)) return (Think){0, 0, 0, 0};
    const char *close = memmem(text + lo, n - lo, THINK_CLOSE, lc);
    if (!close) return (Think){lo, n, ended ? n : SIZE_MAX, !ended};
    return (Think){lo, (size_t)(close - text), (size_t)(close - text) + lc, 0};
}

// The hermes tool calls of a chat answer, [{["index",] "id", "type": "function", "function": {"name",
// "arguments"}}, ...] from call `from` on appended to out (may be NULL), and the length of the content before
// the first one. Returns how many calls the text has; 0 when it has none or one does not parse (then it is
// all content).
static int tool_calls(const char *text, size_t n, const char *id, int with_index, int from, Buf *out,
                      size_t *content_len) {
    const char *first = memmem(text, n, "<tool_call>", 11);
    if (!first) return 0;
    char *calls = NULL;
    size_t calls_len = 0;
    FILE *g = open_memstream(&calls, &calls_len);
    if (!g) die("open_memstream failed");
    int count = 0, ok = 1;
    for (const char *at = first; at && ok; count++) {
        const char *end = memmem(at, (size_t)(text + n - at), "</tool_call>", 12);
        uint32_t nul;
        const char *why;
        cJSON *call = end ? chat_parse_tool_call(at, (size_t)(end + 12 - at), &nul, &why) : NULL;
        if (!call) {
            ok = 0;
            break;
        }
        at = memmem(end + 12, (size_t)(text + n - end - 12), "<tool_call>", 11);
        if (count < from) {
            cJSON_Delete(call);
            continue;
        }
        Buf args = {0};
        json_dump_py(&args, cJSON_GetObjectItemCaseSensitive(call, "arguments"), nul);
        const char *name = cJSON_GetObjectItemCaseSensitive(call, "name")->valuestring;
        fputs(count > from ? ", {" : "{", g);
        if (with_index) fprintf(g, "\"index\": %d, ", count);
        fprintf(g, "\"id\": \"call_%s_%d\", \"type\": \"function\", \"function\": {\"name\": ", id, count);
        write_text(g, name, strlen(name));  // the model's bytes: made valid UTF-8
        fputs(", \"arguments\": ", g);
        write_text(g, args.data, args.len);
        fputs("}}", g);
        buf_free(&args);
        cJSON_Delete(call);
    }
    if (fclose(g) != 0) die("writing tool calls failed");
    if (ok && out) buf_append(out, calls, calls_len);
    if (ok) {
        size_t c = (size_t)(first - text);
        while (c > 0 && (text[c - 1] == '\n' || text[c - 1] == ' ')) c--;
        *content_len = c;
    }
    free(calls);
    return ok ? count : 0;
}

// A chat choice's tool calls (job->tools) in its content (from byte start), as tool_calls, from call `from`
// on: those of the whole text once it has ended, else those of its complete <tool_call> blocks so far.
// *content_len: where the content before the first call ends (an offset in the whole text).
static int choice_tool_calls(const ApiJob *job, const ApiChoice *c, int i, int ended, size_t start, int with_index,
                             int from, Buf *out, size_t *content_len) {
    char id[64];
    snprintf(id, sizeof id, "%s_%d", job->id, i);
    size_t n = out_text_len(job, c);
    if (start > n) return 0;
    const char *text = (c->s->text.data ? c->s->text.data : "") + start;
    n -= start;
    for (const char *close = ended ? NULL : memmem(text, n, "</tool_call>", 12); !ended;) {
        if (!close) return 0;
        const char *next = memmem(close + 12, (size_t)(text + n - close - 12), "</tool_call>", 12);
        if (!next) {
            n = (size_t)(close + 12 - text);
            break;
        }
        close = next;
    }
    size_t len = 0;
    int count = job->tools ? tool_calls(text, n, id, with_index, from, out, &len) : 0;
    if (count) *content_len = start + len;
    return count;
}

static const char *finish_name(const RolloutSample *s) {
    return s->finish == FINISH_STOP ? "stop" : "length";
}

static void write_usage(FILE *f, const ApiJob *job) {
    int64_t prompt = 0, done = 0, cached = 0;
    for (int i = 0; i < job->n_prompts; i++) prompt += (int64_t)job->prompts[i].n;
    for (int i = 0; i < job->n_prompts; i++) cached += job->rr[i].cached;
    for (int i = 0; i < job->n_prompts * job->n; i++) done += out_tokens(job, &job->choices[i]);
    fprintf(f,
            "{\"prompt_tokens\": %lld, \"completion_tokens\": %lld, \"total_tokens\": %lld, "
            "\"prompt_tokens_details\": {\"cached_tokens\": %lld}}",
            (long long)prompt, (long long)done, (long long)(prompt + done), (long long)cached);
}

static void write_head(FILE *f, const ApiJob *job, const char *object, const char *model) {
    fprintf(f, "{\"id\": \"%s\", \"object\": \"%s\", \"created\": %lld, \"model\": ", job->id, object,
            (long long)job->created);
    json_write_string(f, model, strlen(model));
}

// How many tool calls a finished chat choice made.
static int finished_calls(const ApiJob *job, const ApiChoice *c, int i) {
    size_t content = out_text_len(job, c);
    Think t = think_split(job, c->s->text.data ? c->s->text.data : "", content, 1);
    return choice_tool_calls(job, c, i, 1, t.c0, 0, 0, NULL, &content);
}

// A chat choice's message: content (or null), its reasoning, and tool calls.
static void write_message(FILE *f, const ApiJob *job, const ApiChoice *c, int i) {
    const char *text = c->s->text.data ? c->s->text.data : "";
    size_t content = out_text_len(job, c);
    Think t = think_split(job, text, content, 1);
    Buf calls = {0};
    int tool = choice_tool_calls(job, c, i, 1, t.c0, 0, 0, &calls, &content);
    fputs("{\"role\": \"assistant\", \"content\": ", f);
    if ((tool || t.r1 > t.r0) && content <= t.c0)
        fputs("null", f);
    else
        write_text(f, text + t.c0, content - t.c0);
    if (t.r1 > t.r0) {
        fputs(", \"reasoning_content\": ", f);
        write_text(f, text + t.r0, t.r1 - t.r0);
    }
    if (tool) fprintf(f, ", \"tool_calls\": [%.*s]", (int)calls.len, calls.data);
    fputc('}', f);
    buf_free(&calls);
}

char *api_response(const ApiJob *job, const Tokenizer *tok, const char *model) {
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    if (!f) die("open_memstream failed");
    write_head(f, job, job->chat ? "chat.completion" : "text_completion", model);
    fputs(", \"choices\": [", f);
    for (int i = 0; i < job->n_prompts * job->n; i++) {
        const ApiChoice *c = &job->choices[i];
        int p = i / job->n, nt = out_tokens(job, c);
        fprintf(f, "%s{\"index\": %d, ", i ? ", " : "", i);
        if (job->chat) {
            fputs("\"message\": ", f);
            write_message(f, job, c, i);
        } else {
            fputs("\"text\": ", f);
            Buf text = {0};
            if (job->echo) echo_text(job, tok, &job->prompts[p], c, &text);
            buf_append(&text, c->s->text.data ? c->s->text.data : "", out_text_len(job, c));
            write_text(f, text.data, text.len);
            buf_free(&text);
        }
        fputs(", \"logprobs\": ", f);
        if (job->logprobs < 0)
            fputs("null", f);
        else if (job->chat)
            write_chat_logprobs(f, job, tok, c, 0, nt);
        else
            write_completion_logprobs(f, job, tok, p, c, 0, nt, job->echo);
        const char *finish = job->chat && finished_calls(job, c, i) ? "tool_calls" : finish_name(c->s);
        fprintf(f, ", \"finish_reason\": \"%s\"", finish);
        if (job->return_token_ids) {
            fputs(", \"token_ids\": ", f);
            write_ids(f, c->s->tokens, nt);
            if (!job->chat) {
                fputs(", \"prompt_token_ids\": ", f);
                write_ids(f, job->prompts[p].ids, (int64_t)job->prompts[p].n);
            }
        }
        fputc('}', f);
    }
    fputs("], \"usage\": ", f);
    write_usage(f, job);
    if (job->return_token_ids && job->chat) {
        fputs(", \"prompt_token_ids\": ", f);
        write_ids(f, job->prompts[0].ids, (int64_t)job->prompts[0].n);
    }
    fputs("}", f);
    if (fclose(f) != 0) die("writing a response failed");
    return out;
}

// ---------------------------------------------------------------------------------------------
// streaming

// How much of a running choice's text may be sent: not the bytes that could start a stop string or a
// tool call, nor a character cut off at the end. With `final`, all of it.
static size_t sendable(const ApiJob *job, const ApiChoice *c, const Think *t, int final) {
    const char *text = c->s->text.data ? c->s->text.data : "";
    size_t end = out_text_len(job, c);
    if (final) return end;
    size_t hold = 0;
    for (int i = 0; i < job->cfg.n_stop_strings; i++) {
        size_t l = strlen(job->stop[i]);
        if (l - 1 > hold) hold = l - 1;
    }
    if (t->open && hold < strlen(THINK_CLOSE) - 1) hold = strlen(THINK_CLOSE) - 1;  // a </think> coming
    if (job->tools && !t->open) {  // calls are in the content
        const char *call = memmem(text + t->c0, end - t->c0, "<tool_call>", 11);
        size_t at = call ? (size_t)(call - text) : 0;
        while (at > t->c0 && (text[at - 1] == '\n' || text[at - 1] == ' ')) at--;  // as tool_calls trims
        if (call) return at > c->sent_bytes ? at : c->sent_bytes;
        if (hold < 10) hold = 10;
    }
    end = end > hold ? end - hold : 0;
    size_t at = c->sent_bytes;
    while (at < end) {  // whole characters only (an invalid byte counts as one)
        size_t len;
        if (utf8_scan((const unsigned char *)text + at, end - at, &len) == UTF8_INCOMPLETE) break;
        at += len;
    }
    return at > c->sent_bytes ? at : c->sent_bytes;
}

// A chunk of choice i up to its choice's fields; with return_token_ids the choice's first chunk carries its
// prompt's ids (where the whole response has them: chat at the top, completions in the choice).
static void chunk_open(FILE *f, ApiJob *job, const char *model, int i) {
    ApiChoice *c = &job->choices[i];
    const IdList *prompt = &job->prompts[i / job->n];
    int ids = job->return_token_ids && !c->prompt_sent;
    c->prompt_sent = 1;
    fputs("data: ", f);
    write_head(f, job, job->chat ? "chat.completion.chunk" : "text_completion", model);
    if (ids && job->chat) {
        fputs(", \"prompt_token_ids\": ", f);
        write_ids(f, prompt->ids, (int64_t)prompt->n);
    }
    fprintf(f, ", \"choices\": [{\"index\": %d, ", i);
    if (ids && !job->chat) {
        fputs("\"prompt_token_ids\": ", f);
        write_ids(f, prompt->ids, (int64_t)prompt->n);
        fputs(", ", f);
    }
}

// One chunk of choice i: its new text [from, to), its tokens' log-probs [t0, t1), and when ending its
// finish reason (chat: with tool calls, whose text is then not sent as content).
// A chunk of choice i: its text [from, to) (chat: split by t into reasoning_content and content, the tags
// left out), the log-probs of tokens [t0, t1), the tool calls of calls (its complete ones not yet sent: they
// take the place of the text from the first call on), the finish at the end.
static void write_chunk(FILE *f, ApiJob *job, const Tokenizer *tok, const char *model, int i, const Think *t,
                        size_t from, size_t to, int t0, int t1, const Buf *calls, int n_calls, int end) {
    const ApiChoice *c = &job->choices[i];
    const char *text = c->s->text.data ? c->s->text.data : "";
    chunk_open(f, job, model, i);
    int tool = n_calls > 0;
    if (job->chat) {
        size_t r0 = from > t->r0 ? from : t->r0, r1 = to < t->r1 ? to : t->r1, c0 = from > t->c0 ? from : t->c0;
        const char *sep = "";
        fputs("\"delta\": {", f);
        if (calls->len) {
            fprintf(f, "\"tool_calls\": [%.*s]", (int)calls->len, calls->data);
            sep = ", ";
        }
        if (r1 > r0) {
            fprintf(f, "%s\"reasoning_content\": ", sep);
            write_text(f, text + r0, r1 - r0);
            sep = ", ";
        }
        if (to > c0) {
            fprintf(f, "%s\"content\": ", sep);
            write_text(f, text + c0, to - c0);
        }
        fputc('}', f);
    } else {  // an echo's completion after its prompt, with the spaces that follow a prompt (echo_text)
        Buf lead = {0};
        if (job->echo && from == 0 && to > 0) echo_text(job, tok, &(IdList){0}, c, &lead);
        buf_append(&lead, text + from, to - from);
        fputs("\"text\": ", f);
        write_text(f, lead.data, lead.len);
        buf_free(&lead);
    }
    fputs(", \"logprobs\": ", f);
    if (job->logprobs < 0 || t1 <= t0)
        fputs("null", f);
    else if (job->chat)
        write_chat_logprobs(f, job, tok, c, t0, t1);
    else
        write_completion_logprobs(f, job, tok, i / job->n, c, t0, t1, 0);
    if (job->return_token_ids) {  // the chunk's tokens
        fputs(", \"token_ids\": ", f);
        write_ids(f, c->s->tokens + t0, t1 > t0 ? t1 - t0 : 0);
    }
    if (end)
        fprintf(f, ", \"finish_reason\": \"%s\"}]}\n\n", tool ? "tool_calls" : finish_name(c->s));
    else
        fputs(", \"finish_reason\": null}]}\n\n", f);
}

void api_stream(ApiJob *job, const Tokenizer *tok, const char *model, int final, Buf *out) {
    char *s = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&s, &len);
    if (!f) die("open_memstream failed");
    for (int i = 0; i < job->n_prompts * job->n; i++) {
        ApiChoice *c = &job->choices[i];
        if (c->ended) continue;
        if (!c->started) {
            c->started = 1;
            if (job->chat) {
                chunk_open(f, job, model, i);
                fputs(
                    "\"delta\": {\"role\": \"assistant\", \"content\": \"\"}, \"logprobs\": null, "
                    "\"finish_reason\": null}]}\n\n",
                    f);
            } else if (job->echo) {  // the prompt first, with its log-probs
                Buf text = {0};
                echo_text(job, tok, &job->prompts[i / job->n], NULL, &text);
                chunk_open(f, job, model, i);
                fputs("\"text\": ", f);
                write_text(f, text.data, text.len);
                fputs(", \"logprobs\": ", f);
                if (job->logprobs < 0)
                    fputs("null", f);
                else
                    write_completion_logprobs(f, job, tok, i / job->n, c, 0, 0, 1);
                fputs(", \"finish_reason\": null}]}\n\n", f);
                buf_free(&text);
            }
        }
        int end = c->s->done;
        Think t = think_split(job, c->s->text.data ? c->s->text.data : "", out_text_len(job, c), end);
        size_t to = sendable(job, c, &t, end), content = to;
        int t1 = out_tokens(job, c);
        Buf calls = {0};
        int n_calls =
            job->chat && !t.open ? choice_tool_calls(job, c, i, end, t.c0, 1, c->sent_calls, &calls, &content) : 0;
        if (n_calls && to > content) to = content > c->sent_bytes ? content : c->sent_bytes;
        int per_token = job->logprobs >= 0 || job->return_token_ids;
        size_t from = c->sent_bytes, c0 = from > t.c0 ? from : t.c0;
        int text_news = (to < t.r1 ? to : t.r1) > (from > t.r0 ? from : t.r0) || to > c0;  // not only the tags
        int news = text_news || n_calls > c->sent_calls || (per_token && t1 > c->sent_tokens);
        if (end || news)  // nothing new (text held back, no log-probs asked): no empty chunk
            write_chunk(f, job, tok, model, i, &t, c->sent_bytes, to, c->sent_tokens, t1, &calls, n_calls, end);
        buf_free(&calls);
        c->sent_bytes = to;
        c->sent_tokens = t1;
        c->sent_calls = n_calls > c->sent_calls ? n_calls : c->sent_calls;
        c->ended = end;
    }
    if (final) {
        if (job->include_usage) {
            fputs("data: ", f);
            write_head(f, job, job->chat ? "chat.completion.chunk" : "text_completion", model);
            fputs(", \"choices\": [], \"usage\": ", f);
            write_usage(f, job);
            fputs("}\n\n", f);
        }
        fputs("data: [DONE]\n\n", f);
    }
    if (fclose(f) != 0) die("writing a stream chunk failed");
    buf_append(out, s, len);
    free(s);
}

char *api_error_body(const ApiError *err) {
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    if (!f) die("open_memstream failed");
    const char *type = "invalid_request_error";
    if (err->status == 401) type = "authentication_error";
    if (err->status == 404) type = "not_found_error";
    if (err->status == 429) type = "rate_limit_error";
    if (err->status >= 500) type = "server_error";
    fputs("{\"error\": {\"message\": ", f);
    const char *m = err->message ? err->message : "error";
    write_text(f, m, strlen(m));  // a message quoting the request (a cut at %.100s, a URL) may hold invalid UTF-8
    fprintf(f, ", \"type\": \"%s\", \"param\": ", type);
    if (err->param)
        json_write_string(f, err->param, strlen(err->param));
    else
        fputs("null", f);
    fprintf(f, ", \"code\": %d}}", err->status);
    if (fclose(f) != 0) die("writing an error failed");
    return out;
}

// ---------------------------------------------------------------------------------------------
// vLLM's /tokenize and /detokenize

static cJSON *parse_object(const char *body, size_t n, uint32_t *nul, ApiError *err) {
    size_t bad = utf8_check(body, n);
    if (bad < n) {
        fail(err, 400, NULL, xprintf("the body is not valid UTF-8 (byte %zu)", bad));
        return NULL;
    }
    cJSON *root = json_parse_line(body, n, nul);
    if (!cJSON_IsObject(root)) {
        fail(err, 400, NULL, xprintf("the body is not a JSON object"));
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

static int check_model(const cJSON *root, const ApiLimits *lim, ApiError *err) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model && !cJSON_IsNull(model) && (!cJSON_IsString(model) || strcmp(model->valuestring, lim->model_name)))
        return fail(err, 404, "model",
                    xprintf("the model \"%.100s\" does not exist (this server has \"%s\")",
                            cJSON_IsString(model) ? model->valuestring : "?", lim->model_name));
    return 0;
}

char *api_tokenize(const char *body, size_t n, Tokenizer *tok, const ApiLimits *lim, int64_t vocab, ApiError *err) {
    static const char *const names[] = {"model", "prompt", "messages", "add_generation_prompt", "tools",
                                        "chat_template_kwargs", NULL};
    memset(err, 0, sizeof *err);
    uint32_t nul;
    cJSON *root = parse_object(body, n, &nul, err);
    if (!root) return NULL;
    ApiJob job = {0};
    char *out = NULL;
    int generation = 1;
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (only_fields(root, names, NULL, err) || check_model(root, lim, err) ||
        get_bool(root, "add_generation_prompt", &generation, err))
        goto done;
    if (!msgs == !prompt) {
        fail(err, 400, "prompt", xprintf("give \"prompt\" (text) or \"messages\" (a chat), one of them"));
        goto done;
    }
    if (msgs ? parse_messages(&job, root, nul, tok, lim, generation, err)
             : cJSON_IsString(prompt) ? parse_prompts(&job, prompt, nul, tok, vocab, err)
                                      : fail(err, 400, "prompt", xprintf("\"prompt\" must be a string")))
        goto done;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    if (!f) die("open_memstream failed");
    fprintf(f, "{\"count\": %zu, \"max_model_len\": %lld, \"tokens\": ", job.prompts[0].n,
            (long long)lim->max_len);
    write_ids(f, job.prompts[0].ids, (int64_t)job.prompts[0].n);
    fputs(", \"token_strs\": null}", f);
    if (fclose(f) != 0) die("writing a response failed");
done:
    api_job_free(&job);
    cJSON_Delete(root);
    return out;
}

char *api_detokenize(const char *body, size_t n, const Tokenizer *tok, const ApiLimits *lim, int64_t vocab,
                     ApiError *err) {
    static const char *const names[] = {"model", "tokens", NULL};
    memset(err, 0, sizeof *err);
    uint32_t nul;
    cJSON *root = parse_object(body, n, &nul, err);
    if (!root) return NULL;
    IdList ids = {0};
    char *out = NULL;
    const cJSON *tokens = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    if (only_fields(root, names, NULL, err) || check_model(root, lim, err)) goto done;
    if (!cJSON_IsArray(tokens)) {
        fail(err, 400, "tokens", xprintf("\"tokens\" must be a list of token ids"));
        goto done;
    }
    if (!tok) {
        fail(err, 400, "tokens", xprintf("text needs a tokenizer, and the model has none"));
        goto done;
    }
    if (parse_ids(tokens, vocab, &ids, "tokens", err)) goto done;
    Buf text = {0};
    size_t bad;
    if (tokenizer_decode(tok, ids.ids, ids.n, &text, &bad) != 0) {
        buf_free(&text);
        fail(err, 400, "tokens", xprintf("\"tokens\"[%zu] is not in the vocabulary", bad));
        goto done;
    }
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    if (!f) die("open_memstream failed");
    fputs("{\"prompt\": ", f);
    write_text(f, text.data ? text.data : "", text.len);
    fputs("}", f);
    if (fclose(f) != 0) die("writing a response failed");
    buf_free(&text);
done:
    free(ids.ids);
    cJSON_Delete(root);
    return out;
}
