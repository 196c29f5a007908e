// grpo tokenize: text <-> token ids with a Hugging Face tokenizer.json (plain or JSONL).
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/util.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "text/chat.h"
#include "text/tokenizer.h"

typedef struct {
    Tokenizer tok;
    int64_t bytes, tokens;
    double seconds;
} Session;

static void print_ids(const int32_t *ids, size_t n, const char *sep) {
    for (size_t i = 0; i < n; i++) printf(i ? "%s%d" : "%.0s%d", sep, ids[i]);
}

static void encode_or_die(Session *s, const char *text, size_t n, IdList *ids, const char *where) {
    size_t bad;
    double t0 = time_now();
    if (tokenizer_encode(&s->tok, text, n, ids, &bad) != 0) die("%s: invalid UTF-8 at byte %zu", where, bad);
    s->seconds += time_now() - t0;
    s->bytes += (int64_t)n;
    s->tokens += (int64_t)ids->n;
}

static void jsonl_line(Session *s, const char *line, int64_t lineno, int decode) {
    char where[48];
    snprintf(where, sizeof where, "stdin line %lld", (long long)lineno);
    uint32_t nul;
    cJSON *root = json_parse_line(line, strlen(line), &nul);
    if (!root || !cJSON_IsObject(root)) die("%s: not a JSON object", where);
    IdList ids = {0};
    Buf text = {0};
    if (decode) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "ids");
        if (!cJSON_IsArray(arr)) die("%s: missing array \"ids\"", where);
        for (const cJSON *e = arr->child; e; e = e->next) {
            int64_t id;
            if (!json_as_int(e, 0, INT32_MAX, &id)) die("%s: ids must be non-negative integers", where);
            idlist_push(&ids, (int32_t)id);
        }
        size_t bad;
        if (tokenizer_decode(&s->tok, ids.ids, ids.n, &text, &bad) != 0)
            die("%s: id %d is not in the vocabulary", where, ids.ids[bad]);
        fputs("{\"text\": ", stdout);
        json_write_string(stdout, text.data ? text.data : "", text.len);
        fputs("}\n", stdout);
    } else {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "text");
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
        if (cJSON_IsString(t)) {
            size_t n;
            char *bytes = json_string_bytes(t, nul, &n);
            encode_or_die(s, bytes, n, &ids, where);
            free(bytes);
            fputs("{\"ids\": [", stdout);
        } else if (msgs) {
            if (!s->tok.chat.tpl)
                die("%s: \"messages\" given but %s has no chat template", where, s->tok.path);
            chat_render_request(&s->tok.chat, root, nul, &text, where);
            encode_or_die(s, text.data, text.len, &ids, where);
            fputs("{\"text\": ", stdout);
            json_write_string(stdout, text.data, text.len);
            fputs(", \"ids\": [", stdout);
        } else {
            die("%s: expected {\"text\": \"...\"} or {\"messages\": [...]}", where);
        }
        print_ids(ids.ids, ids.n, ", ");
        fputs("]}\n", stdout);
    }
    free(ids.ids);
    buf_free(&text);
    cJSON_Delete(root);
}

static void plain(Session *s, int decode) {
    Buf in = {0};
    char chunk[1 << 16];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, stdin)) > 0) buf_append(&in, chunk, got);
    if (ferror(stdin)) die("cannot read standard input");
    IdList ids = {0};
    if (decode) {  // whitespace-separated ids -> text
        char *p = in.data ? in.data : "";
        for (;;) {
            while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
            if (!*p) break;
            char *end;
            errno = 0;
            long v = strtol(p, &end, 10);
            int whole = end != p && (*end == 0 || strchr(" \n\t\r", *end));  // "12abc" is one bad word
            if (!whole || errno || v < 0 || v > INT32_MAX) {
                int word = (int)strcspn(p, " \n\t\r"), cut = word > 40;
                die("stdin: \"%.*s%s\" (word %zu) is not a token id", cut ? 40 : word, p, cut ? "..." : "",
                    ids.n + 1);
            }
            idlist_push(&ids, (int32_t)v);
            p = end;
        }
        Buf text = {0};
        size_t bad;
        if (tokenizer_decode(&s->tok, ids.ids, ids.n, &text, &bad) != 0) die("stdin: id %d is not in the vocabulary", ids.ids[bad]);
        fwrite(text.data ? text.data : "", 1, text.len, stdout);
        buf_free(&text);
    } else {
        encode_or_die(s, in.data ? in.data : "", in.len, &ids, "stdin");
        print_ids(ids.ids, ids.n, " ");
        putchar('\n');
    }
    free(ids.ids);
    buf_free(&in);
}

int cmd_tokenize(int argc, char **argv) {
    CliOpt opts[] = {
        {"--tokenizer", "PATH", "tokenizer.json, or a model directory holding one", NULL, 1},
        {"--jsonl", NULL, "JSONL: {\"text\"} or {\"messages\"} lines in, {\"ids\"} lines out", NULL, 0},
        {"--decode", NULL, "ids to text instead ({\"ids\"} lines with --jsonl)", NULL, 0},
        {"--stats", NULL, "print timing as one JSON line on stderr at the end", NULL, 0},
    };
    CliSpec spec = {"grpo tokenize --tokenizer PATH [--jsonl] [--decode] < in > out",
                    "Plain mode reads all of stdin as one text and prints its ids separated by spaces (with\n"
                    "--decode: ids in, text out). With --jsonl each line {\"text\": \"...\"} gives {\"ids\": [...]}, and\n"
                    "{\"messages\": [...], \"add_generation_prompt\": false} gives the chat template's rendering\n"
                    "{\"text\": \"...\", \"ids\": [...]} (other keys: template variables, as grpo render);\n"
                    "with --decode, {\"ids\": [...]} gives {\"text\": \"...\"}.\n"
                    "Special-token text inside the input (e.g. \"<|im_end|>\") becomes the special token, as in\n"
                    "Hugging Face's default.",
                    opts, sizeof opts / sizeof opts[0]};
    cli_parse(&spec, argc, argv);
    int decode = cli_str(&spec, "--decode") != NULL;
    double t0 = time_now();
    Session s = {0};
    if (!file_exists(cli_str(&spec, "--tokenizer")))  // a tokenizer.json or a directory holding one
        die("option --tokenizer: %s does not exist", cli_str(&spec, "--tokenizer"));
    tokenizer_load(&s.tok, cli_str(&spec, "--tokenizer"));
    double load_seconds = time_now() - t0;
    if (cli_str(&spec, "--jsonl")) {
        char *line = NULL;
        size_t cap = 0;
        int64_t lineno = 0;
        while (line_read(stdin, &line, &cap, "stdin", lineno + 1) >= 0)
            jsonl_line(&s, line, ++lineno, decode);
        if (ferror(stdin)) die("cannot read standard input");
        free(line);
    } else {
        plain(&s, decode);
    }
    if (fflush(stdout) != 0) die("cannot write to standard output");
    if (cli_str(&spec, "--stats"))
        fprintf(stderr, "{\"bytes\": %lld, \"tokens\": %lld, \"load_seconds\": %.3f, \"encode_seconds\": %.4f}\n",
                (long long)s.bytes, (long long)s.tokens, load_seconds, s.seconds);
    tokenizer_free(&s.tok);
    return 0;
}
