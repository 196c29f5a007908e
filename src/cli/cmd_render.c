// grpo render: a model's chat template over conversations (JSONL in, the rendered text out).
#define _POSIX_C_SOURCE 200809L  // getline
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/json.h"
#include "base/util.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "text/chat.h"

// SOURCE: a model directory, its tokenizer_config.json, or a template file.
static void load(ChatTemplate *c, const char *source) {
    struct stat sb;
    if (stat(source, &sb) != 0) die("%s does not exist", source);
    size_t n = strlen(source);
    int config = n >= 5 && !strcmp(source + n - 5, ".json");
    if (!S_ISDIR(sb.st_mode) && !config) return chat_template_load_file(c, source);
    char *dir = S_ISDIR(sb.st_mode) ? xstrdup(source) : NULL;
    if (!dir) {
        const char *slash = strrchr(source, '/');
        dir = slash ? xprintf("%.*s", (int)(slash - source), source) : xstrdup(".");
    }
    char *path = S_ISDIR(sb.st_mode) ? path_join(dir, "tokenizer_config.json") : xstrdup(source);
    cJSON *cfg = file_exists(path) ? json_load_file(path, FILE_MAX_JSON) : NULL;
    if (cfg && !cJSON_IsObject(cfg)) die("%s: not a JSON object", path);
    chat_template_load(c, dir, cfg, path);
    if (!c->tpl)
        die("%s: no chat template (chat_template.jinja, chat_template.json or tokenizer_config.json)",
            source);
    cJSON_Delete(cfg);
    free(path);
    free(dir);
}

int cmd_render(int argc, char **argv) {
    CliOpt opts[] = {
        {"--template", "NAME",
         "of a list of named templates: default, or tool_use (transformers picks it when tools "
         "are given)",
         "default", 0},
    };
    CliSpec spec = {
        "grpo render SOURCE < conversations.jsonl > rendered.jsonl",
        "Renders conversations with a chat template as training and serving feed them to the model.\n"
        "SOURCE is a model directory (chat_template.jinja, chat_template.json or tokenizer_config.json's\n"
        "\"chat_template\"), a tokenizer_config.json, or a template file. Each input line\n"
        "{\"messages\": [...], \"tools\": [...], \"add_generation_prompt\": true, ...} gives {\"text\": "
        "\"...\"};\n"
        "every other key is a template variable (enable_thinking, bos_token, date_string, ...).",
        opts,
        sizeof opts / sizeof opts[0],
        1,
        NULL,
        0};
    cli_parse(&spec, argc, argv);
    if (spec.n_args != 1) die("grpo render needs SOURCE (see --help)");
    ChatTemplate c = {0};
    load(&c, spec.args[0]);
    const char *name = cli_str(&spec, "--template");
    if (strcmp(name, "tool_use") == 0) {  // the named list's other template, for every line
        if (!c.tool_tpl) die("option --template: %s has no template named \"tool_use\"", spec.args[0]);
        jinja_free(c.tpl);
        c.tpl = c.tool_tpl;
        c.tool_tpl = NULL;
    } else if (strcmp(name, "default") != 0) {
        die("option --template: \"%s\" (grpo reads the named templates \"default\" and \"tool_use\")", name);
    }
    char *line = NULL;
    size_t cap = 0;
    long long lineno = 0;
    Buf text = {0};
    for (ssize_t len; (len = getline(&line, &cap, stdin)) > 0;) {
        lineno++;
        char where[48];
        snprintf(where, sizeof where, "stdin line %lld", lineno);
        uint32_t nul;
        cJSON *req = json_parse_line(line, (size_t)len, &nul);
        if (!cJSON_IsObject(req)) die("%s: not a JSON object", where);
        text.len = 0;
        chat_render_request(&c, req, nul, &text, where);
        fputs("{\"text\": ", stdout);
        json_write_string(stdout, text.data ? text.data : "", text.len);
        fputs("}\n", stdout);
        cJSON_Delete(req);
    }
    if (ferror(stdin)) die("cannot read standard input");
    file_flush(stdout, "standard output");
    free(line);
    buf_free(&text);
    chat_template_free(&c);
    free(spec.args);
    return 0;
}
