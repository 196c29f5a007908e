// grpo generate: sample continuations with the rollout engine (plain text or JSONL).
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/json.h"
#include "base/util.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "model/decoder.h"
#include "model/vl.h"
#include "nn/skinny.h"
#include "rollout/rollout.h"
#include "rollout/tools.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

typedef struct {
    Tokenizer tok;
    int has_tok;
    const Decoder *m;
    const int32_t *stop_ids;
    int n_stop_ids;
    Utf8Stream stream;  // plain mode: text printed as it is generated
    int streamed;       // a token has been (the first one's leading space as the tokenizer's decode strips it)
    ToolSet tools;      // --tools
    int has_tools;
    VlModel vl;         // a vision-language model's tower and image processor (has_vl)
    int has_vl;
    VlImage **ims;      // --jsonl: each prompt's images (image parts of its messages)
    int *n_ims;
} Gen;

static Tokenizer *need_tok(Gen *g, const char *where, const char *what) {
    if (!g->has_tok) die("%s: %s needs a tokenizer, and the model directory has no tokenizer.json", where, what);
    return &g->tok;
}

static void encode_text(Gen *g, const char *text, size_t n, IdList *ids, const char *where) {
    size_t bad;
    if (tokenizer_encode(need_tok(g, where, "text input"), text, n, ids, &bad) != 0) die("%s: invalid UTF-8 at byte %zu", where, bad);
}

// A --jsonl line's keys are checked, so a misspelt or per-line sampling option is refused, not ignored.
// "text" beside "ids" is grpo tokenize's echo of the rendered prompt; "max_tokens" is OpenAI's name.
static void check_keys(const cJSON *root, const char *where) {
    static const char *const known[] = {"tokens", "ids", "prompt", "messages", "tools", "text",
                                        "max_new_tokens", "max_tokens", "seed"};
    static const char *const options[][2] = {{"temperature", "--temperature"}, {"top_p", "--top-p"},
                                             {"top_k", "--top-k"}, {"n", "--n"}, {"stop", "--stop"}};
    for (const cJSON *e = root->child; e; e = e->next) {
        int ok = 0;
        for (size_t i = 0; i < sizeof known / sizeof known[0] && !ok; i++) ok = strcmp(e->string, known[i]) == 0;
        if (ok) continue;
        for (size_t i = 0; i < sizeof options / sizeof options[0]; i++)
            if (strcmp(e->string, options[i][0]) == 0)
                die("%s: \"%s\" cannot be set per line; it is the option %s of the whole run", where, e->string,
                    options[i][1]);
        die("%s: unknown key \"%.60s\" (a line holds \"tokens\" (or \"ids\"), \"prompt\" or \"messages\", and may "
            "hold \"tools\" (with \"messages\"), \"max_new_tokens\" (or \"max_tokens\") and \"seed\")", where,
            e->string);
    }
}

// The one prompt a line gives, or NULL; dies when it gives two.
static const cJSON *prompt_of(const cJSON *root, const char *where, const char **key) {
    static const char *const forms[] = {"tokens", "ids", "prompt", "messages"};
    const cJSON *found = NULL;
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, forms[i]);
        if (!e) continue;
        if (found) die("%s: both \"%s\" and \"%s\"; a line gives one prompt", where, *key, forms[i]);
        found = e;
        *key = forms[i];
    }
    return found;
}

// One JSONL input line -> prompt ids (+ per-line max_new_tokens and seed).
static void parse_prompt(Gen *g, const char *line, const char *where, IdList *ids, RolloutPrompt *p, VlImage **ims,
                         int *n_ims) {
    uint32_t nul;
    cJSON *root = json_parse_line(line, strlen(line), &nul);
    if (!root || !cJSON_IsObject(root)) die("%s: not a JSON object", where);
    check_keys(root, where);
    const char *key = NULL;
    const cJSON *in = prompt_of(root, where, &key);
    if (!in && cJSON_GetObjectItemCaseSensitive(root, "text"))
        die("%s: \"text\" is not a prompt here: give {\"prompt\": \"...\"} (raw text) or {\"messages\": [...]}",
            where);
    if (!in) die("%s: expected {\"tokens\": [...]}, {\"prompt\": \"...\"} or {\"messages\": [...]}", where);
    if (strcmp(key, "messages") != 0 && cJSON_GetObjectItemCaseSensitive(root, "tools"))
        die("%s: \"tools\" go with \"messages\" (the chat template lists them), not with \"%s\"", where, key);
    if (strcmp(key, "tokens") == 0 || strcmp(key, "ids") == 0) {
        if (!cJSON_IsArray(in)) die("%s: \"%s\" must be an array of token ids", where, key);
        int64_t i = 0;
        for (const cJSON *e = in->child; e; e = e->next, i++) {
            int64_t v;
            if (!json_as_int(e, 0, g->m->cfg.vocab - 1, &v))
                die("%s: \"%s\"[%lld] is not an id in [0, %lld)", where, key, (long long)i,
                    (long long)g->m->cfg.vocab);
            idlist_push(ids, (int32_t)v);
        }
    } else if (strcmp(key, "prompt") == 0) {  // raw text: no chat template
        if (!cJSON_IsString(in)) die("%s: \"prompt\" must be a string", where);
        size_t n;
        char *text = json_string_bytes(in, nul, &n);
        encode_text(g, text, n, ids, where);
        free(text);
    } else {
        const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
        if (tools && g->has_tools) die("%s: \"tools\" given with --tools; the tools come from the file", where);
        if (g->has_tools) tools = g->tools.schemas;
        IdList got;
        vl_render_messages(g->has_vl ? &g->vl.proc : NULL, (int32_t)g->m->cfg.image_pad_id,
                           need_tok(g, where, "\"messages\""), in, tools, nul, 1, &got, ims, n_ims, where);
        for (size_t i = 0; i < got.n; i++) idlist_push(ids, got.ids[i]);
        free(got.ids);
    }
    int openai = cJSON_GetObjectItemCaseSensitive(root, "max_tokens") != NULL;
    if (openai && cJSON_GetObjectItemCaseSensitive(root, "max_new_tokens"))
        die("%s: both \"max_new_tokens\" and \"max_tokens\"; give one", where);
    const char *mkey = openai ? "max_tokens" : "max_new_tokens";
    int64_t v = json_get_int_or(root, mkey, p->max_new_tokens, where);
    if (v < 1 || v > INT32_MAX) die("%s: \"%s\" must be at least 1", where, mkey);
    p->max_new_tokens = (int)v;
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(root, "seed");
    if (seed && !cJSON_IsNull(seed)) {
        int64_t sv;
        if (!json_as_int(seed, 0, INT64_MAX / 2, &sv)) die("%s: \"seed\" must be a non-negative integer", where);
        p->has_seed = 1;
        p->seed = (uint64_t)sv;
    }
    cJSON_Delete(root);
}

static void stream_token(void *user, int prompt, int sample, int32_t token) {
    Gen *g = user;
    (void)prompt, (void)sample;
    for (int i = 0; i < g->n_stop_ids; i++)
        if (token == g->stop_ids[i]) return;
    size_t len;
    const char *b = tokenizer_id_bytes(&g->tok, token, &len);
    size_t lead = b && !g->streamed ? tokenizer_lead_strip(&g->tok, b, len) : 0;
    g->streamed = 1;
    Buf out = {0};
    utf8_stream_push(&g->stream, b ? b + lead : "", b ? len - lead : 0, &out);
    fwrite(out.data ? out.data : "", 1, out.len, stdout);
    fflush(stdout);
    buf_free(&out);
}

static void print_sample_jsonl(const Gen *g, const RolloutSample *s, int index, int sample) {
    printf("{\"index\": %d, \"sample\": %d, \"tokens\": [", index, sample);
    for (int i = 0; i < s->n; i++) printf(i ? ", %d" : "%d", s->tokens[i]);
    fputs("]", stdout);
    if (g->has_tok) {
        Buf text = {0};
        utf8_append_lossy(&text, s->text.data ? s->text.data : "", (size_t)s->text_end);
        fputs(", \"text\": ", stdout);
        json_write_string(stdout, text.data ? text.data : "", text.len);
        buf_free(&text);
    }
    fputs(", \"logprobs\": [", stdout);
    for (int i = 0; i < s->n; i++) {
        if (i) fputs(", ", stdout);
        json_write_number(stdout, s->logprobs[i]);  // null when not finite: still JSON
    }
    fputs("]", stdout);
    if (s->mask) {  // --tools: which tokens are the model's (1) and the tool turns' (0)
        fputs(", \"mask\": [", stdout);
        for (int i = 0; i < s->n; i++) printf(i ? ", %d" : "%d", s->mask[i]);
        printf("], \"turns\": %d", s->turns);
    }
    printf(", \"finish_reason\": \"%s\"}\n", s->finish == FINISH_STOP ? "stop" : "length");
}

static size_t default_kv_budget(const DecoderConfig *c, const RolloutPrompt *p, int n, int G) {
    int64_t slot = 1;
    for (int i = 0; i < n; i++) slot = p[i].n + p[i].max_new_tokens > slot ? p[i].n + p[i].max_new_tokens : slot;
    size_t need = decoder_kv_bytes_per_token(c) * (size_t)slot * (size_t)n * (size_t)G;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    size_t cap = pages > 0 && page > 0 ? (size_t)pages * (size_t)page / 4 : (size_t)4 << 30;  // a quarter of RAM
    return need < cap ? need : cap;
}

// The prompts of --jsonl input, one a line; returns their count (ids[i] holds line i's tokens).
static int read_jsonl_prompts(Gen *g, int max_new, RolloutPrompt **prompts, IdList **ids) {
    int n = 0, cap = 0;
    char *line = NULL, where[48];
    size_t line_cap = 0;
    while (line_read(stdin, &line, &line_cap, "stdin", n + 1) >= 0) {
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            *prompts = xrealloc(*prompts, (size_t)cap * sizeof **prompts);
            *ids = xrealloc(*ids, (size_t)cap * sizeof **ids);
            g->ims = xrealloc(g->ims, (size_t)cap * sizeof *g->ims);
            g->n_ims = xrealloc(g->n_ims, (size_t)cap * sizeof *g->n_ims);
        }
        g->ims[n] = NULL;
        g->n_ims[n] = 0;
        snprintf(where, sizeof where, "stdin line %d", n + 1);
        (*ids)[n] = (IdList){0};
        (*prompts)[n] = (RolloutPrompt){.max_new_tokens = max_new};
        parse_prompt(g, line, where, &(*ids)[n], &(*prompts)[n], &g->ims[n], &g->n_ims[n]);
        n++;
    }
    free(line);
    return n;
}

// Plain mode's one prompt: the arguments joined by spaces, else all of stdin; the chat template unless raw.
static void read_text_prompt(Gen *g, const CliSpec *spec, int max_new, int raw, RolloutPrompt **prompts,
                             IdList **ids) {
    Buf text = {0};
    for (int i = 0; i < spec->n_args; i++) {
        if (i) buf_append(&text, " ", 1);
        buf_append(&text, spec->args[i], strlen(spec->args[i]));
    }
    char chunk[1 << 16];
    size_t got;
    while (!spec->n_args && (got = fread(chunk, 1, sizeof chunk, stdin)) > 0) buf_append(&text, chunk, got);
    *prompts = xcalloc(1, sizeof **prompts);
    *ids = xcalloc(1, sizeof **ids);
    (*prompts)[0].max_new_tokens = max_new;
    const cJSON *tools = g->has_tools ? g->tools.schemas : NULL;
    char *err = chat_encode_prompt(need_tok(g, "prompt", "a text prompt"), text.data ? text.data : "",
                                   text.len, !raw, tools, &(*ids)[0]);
    if (err) die("prompt: %s", err);
    buf_free(&text);
}

// Every sample: JSONL lines, or (plain mode, when not already streamed) the text.
static void print_samples(const Gen *g, const RolloutSample *out, int n_prompts, int G, int jsonl, int streamed) {
    for (int i = 0; i < n_prompts; i++)
        for (int j = 0; j < G; j++) {
            const RolloutSample *s = &out[i * G + j];
            if (jsonl) {
                print_sample_jsonl(g, s, i, j);
                continue;
            }
            if (streamed) continue;
            Buf text = {0};
            utf8_append_lossy(&text, s->text.data ? s->text.data : "", (size_t)s->text_end);
            if (G > 1) printf("%s[sample %d]\n", j ? "\n" : "", j);
            fwrite(text.data ? text.data : "", 1, text.len, stdout);
            fputc('\n', stdout);
            buf_free(&text);
        }
    if (fflush(stdout) != 0) die("cannot write to standard output");
}

static void print_stats(const Gen *g, const RolloutStats *st, int n_prompts, int G) {
    double rate = 0.0;
    if (st->decode_seconds > 0)
        rate = (double)(st->generated_tokens - (int64_t)n_prompts * G) / st->decode_seconds;
    fprintf(stderr,
            "{\"prompts\": %d, \"samples\": %d, \"prompt_tokens\": %lld, \"generated_tokens\": %lld, "
            "\"prefill_seconds\": %.3f, \"decode_seconds\": %.3f, \"decode_tokens_per_second\": %.2f, "
            "\"kv_cache_bytes\": %zu, \"kv_bytes_per_token\": %zu, \"waves\": %d",
            n_prompts, n_prompts * G, (long long)st->prompt_tokens, (long long)st->generated_tokens,
            st->prefill_seconds, st->decode_seconds, rate, st->kv_bytes, st->kv_bytes_per_token, st->waves);
    if (g->has_tools)
        fprintf(stderr, ", \"tool_calls\": %lld, \"tool_errors\": %lld, \"tool_seconds\": %.3f",
                (long long)g->tools.calls, (long long)g->tools.errors, g->tools.seconds);
    // the decode's kernel (a device's own kernels: none)
    const SkinnyTuning *t = g->m->be->on_device ? NULL : skinny_tuning(g->m->q8 ? DTYPE_Q8 : g->m->dtype);
    cJSON *tj = t ? skinny_tuning_json(t) : NULL;
    if (tj) cJSON_AddBoolToObject(tj, "cached", t->cached);
    char *tuning = tj ? cJSON_PrintUnformatted(tj) : NULL;
    fprintf(stderr, ", \"decode_kernels\": %s}\n", tuning ? tuning : "null");
    free(tuning);
    cJSON_Delete(tj);
}

int cmd_generate(int argc, char **argv) {
    CliOpt opts[] = {
        {"--model", "DIR", "Hugging Face model directory (tokenizer.json there for text)", NULL, 1},
        {"--jsonl", NULL,
         "JSONL in ({\"tokens\"|\"ids\"|\"prompt\"|\"messages\"} lines), one JSON line per sample out", NULL, 0},
        {"--max-new-tokens", "N", "tokens to generate at most (per line: \"max_new_tokens\")", "256", 0},
        {"--temperature", "T", "sampling temperature; 0 is greedy", "1.0", 0},
        {"--top-p", "P", "nucleus sampling mass in (0, 1]", "1.0", 0},
        {"--top-k", "K", "sample among the K most likely tokens; 0 is off", "0", 0},
        {"--n", "G", "samples per prompt", "1", 0},
        {"--seed", "S", "random seed (per line: \"seed\")", "0", 0},
        {"--stop", "STR", "stop once the generated text contains STR", NULL, 0, 1},
        {"--raw", NULL, "plain mode: do not apply the chat template", NULL, 0},
        {"--no-thinking", NULL,
         "Qwen3 chat templates: enable_thinking=false (an empty think block opens the answer)", NULL, 0},
        {"--kv-cache-mb", "MB", "KV cache budget (default: what the batch needs, at most 1/4 of RAM)", NULL, 0},
        {"--kv-cache-dtype", "auto|fp32|bf16",
         "the KV cache's elements: bf16 halves it (keys and values rounded as written; auto: fp32)", "auto", 0},
        {"--prefill-tokens", "N", "tokens per prefill forward pass", "2048", 0},
        {"--no-shared-prefill", NULL, "prefill every sample separately (for benchmarks)", NULL, 0},
        {"--dtype", "f32|bf16|int8",
         "weights and products in fp32, or bf16 (2 bytes a weight), or bf16 with int8 (Q8_0) copies that decode "
         "reads (1.06 bytes a weight; default: the checkpoint's)", NULL, 0},
        {"--adapter", "DIR", "apply this PEFT LoRA adapter to the model (CPU)", NULL, 0},
        {"--device", "cpu|cuda[:N]|emu", "where the model runs (a GPU, or the emulated one, computes in bf16)",
         "cpu", 0},
        {"--tools", "FILE", "multi-turn with tools: a JSON array of function schemas, each with its \"command\"",
         NULL, 0},
        {"--max-turns", "N", "with --tools: tool calls per sample at most", "5", 0},
        {"--tool-timeout", "S", "with --tools: seconds a tool call may take (a tool's own \"timeout_s\" wins)", "10",
         0},
        {"--stats", NULL, "print timing as one JSON line on stderr at the end", NULL, 0},
    };
    CliSpec spec = {"grpo generate --model DIR [options] [PROMPT...]",
                    "Plain mode: the prompt (arguments, else all of stdin) is rendered with the chat template\n"
                    "when the model has one (--raw: as is) and the text is printed as it is generated.\n"
                    "--jsonl: lines {\"tokens\" (or \"ids\"): [...]} | {\"prompt\": \"raw text\"} |\n"
                    "{\"messages\": [...]}, optional \"max_new_tokens\" (or \"max_tokens\") and \"seed\"; other\n"
                    "keys are refused; out, one line per sample: {\"index\", \"sample\", \"tokens\", \"text\",\n"
                    "\"logprobs\", \"finish_reason\"}. logprobs are log p under softmax(logits / T) before top-k/top-p\n"
                    "(T = 1 when greedy). Generation stops at the model's eos_token_id (config.json,\n"
                    "generation_config.json), a --stop string, or the token limit (tool turns included).\n"
                    "--tools: the chat template lists the tools; a sample that writes\n"
                    "<tool_call>{\"name\", \"arguments\"}</tool_call> gets the tool's answer as a\n"
                    "<tool_response> turn and goes on (JSONL out adds \"mask\": 1 for the model's tokens,\n"
                    "0 for the tool turns', and \"turns\"). A Qwen2.5-VL model takes images as content parts of\n"
                    "\"messages\": {\"type\": \"image\", \"image\": PATH} (or \"image_url\" with a file path).",
                    opts, sizeof opts / sizeof opts[0], 64};
    cli_parse(&spec, argc, argv);
    RolloutConfig cfg = {0};
    cfg.sampler.temperature = (float)cli_double(&spec, "--temperature", 0.0, 100.0);
    cfg.sampler.top_p = (float)cli_double(&spec, "--top-p", 0.0, 1.0);
    if (cfg.sampler.top_p <= 0) die("option --top-p: must be in (0, 1]");
    cfg.sampler.top_k = (int)cli_int(&spec, "--top-k", 0, INT32_MAX);
    int G = (int)cli_int(&spec, "--n", 1, 1 << 16);
    cfg.seed = (uint64_t)cli_int(&spec, "--seed", 0, INT64_MAX / 2);
    int max_new = (int)cli_int(&spec, "--max-new-tokens", 1, INT32_MAX);
    cfg.prefill_tokens = cli_int(&spec, "--prefill-tokens", 1, INT64_C(1) << 24);
    cfg.share_prefill = cli_str(&spec, "--no-shared-prefill") == NULL;
    const CliOpt *stop = cli_opt(&spec, "--stop");
    cfg.stop_strings = stop->values;
    cfg.n_stop_strings = stop->n_values;
    for (int i = 0; i < stop->n_values; i++)
        if (!stop->values[i][0]) die("option --stop: the stop string is empty");
    int jsonl = cli_str(&spec, "--jsonl") != NULL;
    if (jsonl && spec.n_args) die("a prompt argument was given with --jsonl; prompts come from stdin");
    int raw = cli_str(&spec, "--raw") != NULL;
    if (raw && jsonl)
        die("option --raw: for plain mode; with --jsonl, a line's \"prompt\" is used as it is and its "
            "\"messages\" go through the chat template");
    if (raw && cli_str(&spec, "--tools"))
        die("option --tools: the chat template lists the tools, which --raw skips");
    if (raw && cli_str(&spec, "--no-thinking"))
        die("option --no-thinking: a chat template variable, and --raw skips the template");

    const char *dir = cli_str(&spec, "--model");
    Decoder m;
    Lora lora;
    DecoderQ8 q8;
    const Backend *be = cli_load_model(&spec, dir, &m, &lora, &q8, CLI_MODEL_VL);
    m.cfg.kv_dtype = cli_kv_dtype(&spec);
    Gen g = {.m = &m, .has_vl = m.cfg.vl};
    if (g.has_vl) vl_model_load(&g.vl, dir, &m.cfg);
    char *tok_path = path_join(dir, "tokenizer.json");
    if ((g.has_tok = file_exists(tok_path))) tokenizer_load(&g.tok, dir);
    if (cli_str(&spec, "--no-thinking")) chat_template_set(&g.tok.chat, "enable_thinking", cJSON_CreateFalse());
    free(tok_path);
    if (cfg.n_stop_strings) need_tok(&g, "option --stop", "a stop string");
    ToolHook hook = {.tools = &g.tools, .tok = &g.tok};
    if (cli_str(&spec, "--tools")) {
        Tokenizer *t = need_tok(&g, "option --tools", "multi-turn rollout");
        if (!t->chat.tool_calls) die("option --tools: the chat template of %s has no tool calls", dir);
        toolset_load(&g.tools, cli_str(&spec, "--tools"), "option --tools", 4,
                     cli_double(&spec, "--tool-timeout", 1e-3, 86400.0), 16384);
        g.has_tools = 1;
        cfg.max_turns = (int)cli_int(&spec, "--max-turns", 1, 1 << 20);
        cfg.tool_fn = tools_rollout_turns;
        cfg.tool_user = &hook;
    }
    int32_t stop_ids[16];
    int n_stop = rollout_stop_ids(dir, g.has_tok ? &g.tok : NULL, stop_ids);
    cfg.stop_ids = g.stop_ids = stop_ids;
    cfg.n_stop_ids = g.n_stop_ids = n_stop;

    // All input is read and checked before anything is generated: an error leaves stdout empty.
    RolloutPrompt *prompts = NULL;
    IdList *ids = NULL;
    int n_prompts = 1;
    if (jsonl) n_prompts = read_jsonl_prompts(&g, max_new, &prompts, &ids);
    else read_text_prompt(&g, &spec, max_new, raw, &prompts, &ids);
    char where[48];
    if (ferror(stdin)) die("cannot read standard input");
    for (int i = 0; i < n_prompts; i++) {
        snprintf(where, sizeof where, jsonl ? "stdin line %d" : "prompt", i + 1);
        prompts[i].ids = ids[i].ids;
        prompts[i].n = (int64_t)ids[i].n;
        if (prompts[i].n == 0) die("%s: the prompt is empty", where);
        if (prompts[i].n + prompts[i].max_new_tokens > m.cfg.max_pos)
            die("%s: %lld prompt tokens + %d new tokens exceed max_position_embeddings %lld", where,
                (long long)prompts[i].n, prompts[i].max_new_tokens, (long long)m.cfg.max_pos);
    }
    // Image prompts: each image through the frozen tower once, its features in its prompt's pads.
    float **feats = xcalloc((size_t)n_prompts + 1, sizeof *feats);
    DecoderVlInputs *vin = xcalloc((size_t)n_prompts + 1, sizeof *vin);
    for (int i = 0; jsonl && g.has_vl && i < n_prompts; i++) {
        snprintf(where, sizeof where, "stdin line %d", i + 1);
        feats[i] = vl_prompt_features(&g.vl, g.ims[i], g.n_ims[i], where);
        prompts[i].vl = vl_prompt_inputs(&m, prompts[i].ids, prompts[i].n, g.ims[i], g.n_ims[i], feats[i],
                                         g.vl.proc.merge, &vin[i]);
    }
    cfg.kv_budget_bytes = cli_str(&spec, "--kv-cache-mb")
                              ? (size_t)cli_int(&spec, "--kv-cache-mb", 1, INT64_C(1) << 30) << 20
                              : default_kv_budget(&m.cfg, prompts, n_prompts, G);

    RolloutSample *out = xcalloc((size_t)n_prompts * (size_t)G, sizeof *out);
    RolloutStats st = {0};
    int stream = !jsonl && G == 1 && cfg.n_stop_strings == 0;
    if (n_prompts > 0)  // empty JSONL input: empty output
        rollout_generate(&m, g.has_tok ? &g.tok : NULL, &cfg, prompts, n_prompts, G, out, &st, stream ? stream_token : NULL, &g);
    if (stream) {
        Buf tail = {0};
        utf8_stream_finish(&g.stream, &tail);
        fwrite(tail.data ? tail.data : "", 1, tail.len, stdout);
        fputc('\n', stdout);
        buf_free(&tail);
    }
    print_samples(&g, out, n_prompts, G, jsonl, stream);
    if (cli_str(&spec, "--stats")) print_stats(&g, &st, n_prompts, G);
    for (int i = 0; i < n_prompts * G; i++) rollout_sample_free(&out[i]);
    for (int i = 0; i < n_prompts; i++) {
        free(ids[i].ids);
        decoder_vl_inputs_free(&vin[i]);
        free(feats[i]);
        for (int k = 0; g.ims && k < g.n_ims[i]; k++) vl_image_free(&g.ims[i][k]);
        if (g.ims) free(g.ims[i]);
    }
    free(vin), free(feats), free(g.ims), free(g.n_ims);
    if (g.has_vl) vl_model_free(&g.vl);
    free(out);
    free(ids);
    free(prompts);
    free(spec.args);
    free((void *)stop->values);
    if (g.has_tools) toolset_free(&g.tools);
    if (g.has_tok) tokenizer_free(&g.tok);
    decoder_free(&m);
    decoder_q8_free(&q8);
    lora_free(&lora);
    backend_close(be);
    return 0;
}
