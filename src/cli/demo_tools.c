// The tool-use demo behind `grpo train --demo-tools` (demo_tools.h).
#define _XOPEN_SOURCE 700  // readlink
#include "cli/demo_tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/json.h"
#include "base/rng.h"
#include "base/util.h"
#include "cli/demo.h"
#include "parallel/comm.h"
#include "rollout/rollout.h"
#include "rollout/tools.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "train/grpo/grpo.h"
#include "train/grpo/config.h"
#include "train/prompt_data.h"
#include "train/sft.h"

#define TOOLS_DEMO_MAX_PROMPT 96
#define TOOLS_DEMO_MAX_RESPONSE 64

// The tool's schema, as the tools file gives it (the command is added when the file is written).
static const char SCHEMA[] = "{\"type\": \"function\", \"function\": {\"name\": \"multiply\", \"description\": "
                             "\"Multiply two integers.\", \"parameters\": {\"type\": \"object\", \"properties\": "
                             "{\"a\": {\"type\": \"integer\"}, \"b\": {\"type\": \"integer\"}}, \"required\": "
                             "[\"a\", \"b\"]}}}";
static const char ANSWER[] = "The answer is ";

// A chat template (Jinja, for other tools reading this model) of the layout grpo renders natively when the
// template has tool calls but no default system prompt: the tools' system turn, user and assistant turns,
// tool responses in user turns.
static const char TEMPLATE[] =
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0].role == 'system' %}"
    "{{- messages[0].content + '\\n\\n' }}{%- endif %}{{- \"# Tools\\n\\nYou may call one or more functions to "
    "assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML "
    "tags:\\n<tools>\" }}{%- for tool in tools %}{{- \"\\n\" }}{{- tool | tojson }}{%- endfor %}{{- \"\\n</tools>"
    "\\n\\nFor each function call, return a json object with function name and arguments within <tool_call>"
    "</tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": <args-json-object>}"
    "\\n</tool_call><|im_end|>\\n\" }}{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + "
    "messages[0].content + '<|im_end|>\\n' }}{%- endif %}{%- for message in messages %}{%- if message.role == "
    "'tool' %}{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}"
    "{%- endif %}{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}{%- if loop.last or "
    "messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}{%- elif not (message.role == "
    "'system' and loop.first) %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

// Pieces the prompts and answers repeat, each one added token: the tools' system text around the schema,
// the call around its numbers, the response tags, the answer's opening.
static const char *const ADDED[] = {
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\n<tools>",
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}"
    "\n</tool_call>",
    SCHEMA,
    "<tool_call>\n{\"name\": \"multiply\", \"arguments\": {\"a\": ",
    ", \"b\": ",
    "}}\n</tool_call>",
    "<tool_response>\n",
    "\n</tool_response>",
    ANSWER,
    "What is ",
};
static const char *const WORDS[] = {"user", "assistant", "system"};

int demo_tool_main(int argc, char **argv) {
    (void)argc, (void)argv;
    char *line = NULL;
    size_t cap = 0;
    for (int64_t n = 1; line_read(stdin, &line, &cap, "stdin", n) >= 0; n++) {
        cJSON *req = json_parse_exact(line, strlen(line), NULL);
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(req, "arguments");
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(args, "a"), *b = cJSON_GetObjectItemCaseSensitive(args, "b");
        if (cJSON_IsNumber(a) && cJSON_IsNumber(b))
            printf("{\"content\": \"%.0f\"}\n", a->valuedouble * b->valuedouble);
        else
            printf("{\"content\": \"error: multiply needs integer arguments a and b\"}\n");
        fflush(stdout);
        cJSON_Delete(req);
    }
    free(line);
    return 0;
}

// ---------------------------------------------------------------------------------------------
// data

typedef struct {
    int a, b;
} Pair;

static Pair draw_pair(Rng *r) {
    return (Pair){100 + (int)(rng_next_u64(r) % 900), 100 + (int)(rng_next_u64(r) % 900)};
}

// A wrong answer from a teacher that does not use the tool: the product with one digit changed.
static long long guess(Rng *r, long long p) {
    char s[32];
    int n = snprintf(s, sizeof s, "%lld", p), i = (int)(rng_next_u64(r) % (uint64_t)n);
    char d = (char)('0' + (s[i] - '0' + 1 + (int)(rng_next_u64(r) % 9)) % 10);
    if (i == 0 && d == '0') d = '9';
    s[i] = d;
    return atoll(s);
}

static void prompt_text(char *buf, size_t n, Pair p) { snprintf(buf, n, "What is %d * %d?", p.a, p.b); }

// One SFT line: the prompt rendered with the tools, and the teacher's answer (with the tool, or a guess).
static void sft_line(FILE *f, Tokenizer *tok, const cJSON *tools, Pair p, int use_tool, Rng *r) {
    char q[64], text[512];
    prompt_text(q, sizeof q, p);
    IdList pid = {0}, cid = {0};
    char *err = chat_encode_prompt(tok, q, strlen(q), 1, tools, &pid);
    if (err) die("internal: demo prompt: %s", err);
    long long prod = (long long)p.a * p.b;
    if (use_tool)
        snprintf(text, sizeof text,
                 "<tool_call>\n{\"name\": \"multiply\", \"arguments\": {\"a\": %d, \"b\": %d}}\n</tool_call>"
                 "<|im_end|>\n<|im_start|>user\n<tool_response>\n%lld\n</tool_response><|im_end|>\n"
                 "<|im_start|>assistant\n%s%lld<|endoftext|>",
                 p.a, p.b, prod, ANSWER, prod);
    else
        snprintf(text, sizeof text, "%s%lld<|endoftext|>", ANSWER, guess(r, prod));
    size_t bad;
    if (tokenizer_encode(tok, text, strlen(text), &cid, &bad) != 0) die("internal: demo completion");
    fputs("{\"prompt_ids\": [", f);
    for (size_t i = 0; i < pid.n; i++) fprintf(f, i ? ", %d" : "%d", pid.ids[i]);
    fputs("], \"completion_ids\": [", f);
    for (size_t i = 0; i < cid.n; i++) fprintf(f, i ? ", %d" : "%d", cid.ids[i]);
    fputs("]}\n", f);
    free(pid.ids);
    free(cid.ids);
}

typedef struct {
    const DemoToolsTask *t;
    Tokenizer tok;
    const cJSON *tools;
    unsigned char *held;  // pairs (a * 1000 + b) reserved for validation
} ToolsData;

static int tools_line(void *ctx, int split, Rng *r, FILE *f) {
    ToolsData *td = ctx;
    Pair p = draw_pair(r);
    unsigned char *h = &td->held[p.a * 1000 + p.b];
    if (*h) return 0;  // val: each pair once; train, sft: never a held-out pair
    if (split == 0) *h = 1;
    if (split == 2) {
        sft_line(f, &td->tok, td->tools, p, rng_next_float(r) >= td->t->careless, r);
        return 1;
    }
    char q[64], ans[64];
    prompt_text(q, sizeof q, p);
    snprintf(ans, sizeof ans, "%s%lld", ANSWER, (long long)p.a * p.b);
    fprintf(f, "{\"prompt\": \"%s\", \"answer\": \"%s\"}\n", q, ans);
    return 1;
}

// val.jsonl, train.jsonl {"prompt", "answer"} and sft.jsonl (ids); no pair of val is in train or sft.
static void write_data(const char *dir, const char *model_dir, uint64_t seed, const DemoToolsTask *t,
                       const cJSON *tools) {
    ToolsData td = {t, {0}, tools, xcalloc(1000 * 1000, 1)};
    tokenizer_load(&td.tok, model_dir);
    demo_write_splits(dir, seed ^ 0x7001, (int64_t[3]){t->n_val, t->n_train, t->n_sft}, tools_line, &td);
    free(td.held);
    tokenizer_free(&td.tok);
}

// The tools file: the schema with the command that runs this binary as the tool.
static void write_tools(const char *path) {
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) die("cannot find this program's path (/proc/self/exe)");
    self[n] = '\0';
    cJSON *schema = cJSON_Parse(SCHEMA), *arr = cJSON_CreateArray();
    char *cmd = xprintf("'%s' demo-tool", self);
    if (!schema || !arr || !cJSON_AddStringToObject(schema, "command", cmd)) die("out of memory");
    cJSON_AddItemToArray(arr, schema);
    char *text = cJSON_PrintUnformatted(arr);
    if (!text) die("out of memory");
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) die("cannot write %s", path);
    free(text);
    free(cmd);
    cJSON_Delete(arr);
}

// ---------------------------------------------------------------------------------------------
// evaluation and the whole run

void demo_tools_run(const char *dir, uint64_t seed, int smoke, char **overrides, int n_overrides, DemoResult *res) {
    if (comm_launched()) die("the built-in demo runs in one process: start it without mpirun");
    DemoResult R = {0};
    DemoToolsTask task = {.n_train = 4000, .n_val = 200, .n_sft = 40000, .careless = 0.6};
    double t0 = time_now();
    char *init = path_join(dir, "init"), *data = path_join(dir, "data"), *sft = path_join(dir, "sft");
    char *grpo = path_join(dir, "grpo"), *sft_file = path_join(data, "sft.jsonl"), *tools = path_join(dir, "tools.json");
    char *train_file = path_join(data, "train.jsonl"), *val_file = path_join(data, "val.jsonl");
    fprintf(stderr, "grpo demo: products of two 3-digit numbers (\"What is 123 * 456?\" -> \"%s56088\"), which a tiny "
            "model cannot compute but can copy from a `multiply` tool; reward = exact match; in %s\n", ANSWER, dir);
    dir_create(dir);
    DemoVocab v = {WORDS, sizeof WORDS / sizeof *WORDS, ADDED, sizeof ADDED / sizeof *ADDED, TEMPLATE};
    demo_write_model(init, seed, ARCH_QWEN2, &v, TOOLS_DEMO_MAX_PROMPT + TOOLS_DEMO_MAX_RESPONSE);
    write_tools(tools);
    char *list = xprintf("[%s]", SCHEMA);
    cJSON *schemas = cJSON_Parse(list);  // the SFT prompts list the tool as the rollout's will
    if (!schemas) die("out of memory");
    free(list);
    write_data(data, init, seed, &task, schemas);
    cJSON_Delete(schemas);
    R.t_setup = time_now() - t0;

    DemoWarmup w = {.init = init, .sft_file = sft_file, .sft = sft, .val_file = val_file, .tools = tools,
                    .errs = "guess without the tool", .max_response = TOOLS_DEMO_MAX_RESPONSE, .steps = 800,
                    .n_sft = task.n_sft, .careless = task.careless, .seed = seed};
    demo_warmup(&w, &R);

    char *ov[24];
    DemoGrpo g = {.sft = sft, .train_file = train_file, .val_file = val_file, .out_dir = grpo, .chat_template = 1,
                  .max_prompt = TOOLS_DEMO_MAX_PROMPT, .max_response = TOOLS_DEMO_MAX_RESPONSE,
                  .steps = smoke ? 30 : 60, .val_every = smoke ? 30 : 20, .seed = seed};  // smoke: half the GRPO
    int n = demo_grpo_overrides(ov, &g);
    ov[n++] = xprintf("rollout.multi_turn.tools_file=%s", tools);
    ov[n++] = xprintf("rollout.multi_turn.max_turns=1");
    GrpoConfig gc;
    double t = time_now();
    demo_grpo(&gc, ov, n, overrides, n_overrides);
    R.t_grpo = time_now() - t;
    t = time_now();
    R.acc_after = demo_accuracy(gc.trainer.out_dir, NULL, val_file, TOOLS_DEMO_MAX_RESPONSE, tools, &R.calls_after);
    R.t_eval += time_now() - t;
    R.t_total = time_now() - t0;
    demo_finish(dir, smoke, task.n_val, "number pairs", &R);
    grpo_config_free(&gc);
    for (int i = 0; i < n; i++) free(ov[i]);
    free(init), free(data), free(sft), free(grpo), free(sft_file), free(train_file), free(val_file), free(tools);
    if (res) *res = R;
}
