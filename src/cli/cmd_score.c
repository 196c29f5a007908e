// grpo score: JSONL {"tokens": [...]} in, {"logprobs": [...]} out; entry i-1 is
// log p(tokens[i] | tokens[0..i-1]); a reward model's {"score": x} instead. Lines are packed into batches of
// about --batch-tokens tokens.
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "base/json.h"
#include "base/util.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "model/decoder.h"
#include "model/vl.h"
#include "text/tokenizer.h"

typedef struct {
    int32_t *tokens;
    int64_t *seq_off;  // B+1 entries
    int B, cap_seqs;
    int64_t cap_tokens;
    // Per sequence: a "messages" line's images, their features (NULL: none), and whether its tokens are echoed.
    VlImage **ims;
    int *n_ims, *echo;
    float **feats;
} Batch;

static void batch_add(Batch *b, const int32_t *ids, int64_t n, VlImage *ims, int n_ims, float *feats, int echo) {
    if (b->B + 2 > b->cap_seqs) {
        b->cap_seqs = 2 * b->cap_seqs + 8;
        b->seq_off = xrealloc(b->seq_off, (size_t)b->cap_seqs * sizeof(int64_t));
        b->ims = xrealloc(b->ims, (size_t)b->cap_seqs * sizeof *b->ims);
        b->n_ims = xrealloc(b->n_ims, (size_t)b->cap_seqs * sizeof *b->n_ims);
        b->echo = xrealloc(b->echo, (size_t)b->cap_seqs * sizeof *b->echo);
        b->feats = xrealloc(b->feats, (size_t)b->cap_seqs * sizeof *b->feats);
    }
    b->ims[b->B] = ims, b->n_ims[b->B] = n_ims, b->feats[b->B] = feats, b->echo[b->B] = echo;
    int64_t N = b->B ? b->seq_off[b->B] : 0;
    if (N + n > b->cap_tokens) b->tokens = xrealloc(b->tokens, (size_t)(b->cap_tokens = 2 * (N + n)) * sizeof(int32_t));
    memcpy(b->tokens + N, ids, (size_t)n * sizeof(int32_t));
    b->seq_off[0] = 0;
    b->seq_off[++b->B] = N + n;
}

typedef struct {
    const Decoder *m;
    int merge;  // a vision-language model's spatial_merge_size
    Arena arena;
    DecoderActs acts;
    float *out;
    int64_t tokens_done, seqs_done;
    double seconds;
    double *batch_seconds;  // one entry per forward pass, for --stats
    int n_batches;
} Scorer;

static void score_flush(Scorer *s, Batch *b) {
    if (b->B == 0) return;
    int64_t N = b->seq_off[b->B];
    if (N > s->acts.max_tokens) {  // grow the workspace for an unusually long sequence
        decoder_acts_free(&s->acts);
        backend_arena_free(s->m->be, &s->arena);
        free(s->out);
        backend_arena_init(s->m->be, &s->arena, decoder_acts_bytes(s->m->be, &s->m->cfg, s->m->dtype, N, N));
        decoder_acts_init(&s->acts, s->m->be, &s->m->cfg, s->m->dtype, N, N, &s->arena);
        s->out = xmalloc((size_t)N * sizeof(float));
    }
    double t0 = time_now();
    DecoderVlInputs in;
    const DecoderVlInputs *vl = NULL;
    int any = 0;
    for (int i = 0; i < b->B; i++) any |= b->n_ims[i] > 0;
    if (any && vl_batch_inputs(s->m, b->tokens, b->seq_off, b->B, NULL, (const VlImage *const *)b->ims, b->n_ims,
                               (const float *const *)b->feats, s->merge, &in) != 0)
        die("internal: a line's image pads do not match its images");
    if (any) vl = &in;
    int rm = s->m->cfg.score_labels > 0;  // a reward model: one score a line
    if (rm) decoder_seq_scores(s->m, b->tokens, b->seq_off, b->B, &s->acts, s->out);
    else decoder_logprobs_vl(s->m, b->tokens, b->seq_off, b->B, &s->acts, vl, s->out);
    if (vl) decoder_vl_inputs_free(&in);
    double dt = time_now() - t0;
    s->seconds += dt;
    s->batch_seconds = xrealloc(s->batch_seconds, (size_t)(s->n_batches + 1) * sizeof(double));
    s->batch_seconds[s->n_batches++] = dt;
    for (int i = 0; i < b->B; i++) {
        fputs("{", stdout);
        for (int64_t j = b->seq_off[i]; b->echo[i] && j < b->seq_off[i + 1]; j++)  // a "messages" line's tokens
            printf("%s%d", j > b->seq_off[i] ? ", " : "\"tokens\": [", b->tokens[j]);
        if (rm) {
            fputs(b->echo[i] ? "], \"score\": " : "\"score\": ", stdout);
            json_write_number(stdout, s->out[i]);
            fputs("}\n", stdout);
            continue;
        }
        fputs(b->echo[i] ? "], \"logprobs\": [" : "\"logprobs\": [", stdout);
        for (int64_t j = b->seq_off[i]; j + 1 < b->seq_off[i + 1]; j++) {
            if (j > b->seq_off[i]) fputs(", ", stdout);
            json_write_number(stdout, s->out[j]);  // a non-finite log-prob (a broken model) is null: still JSON
        }
        fputs("]}\n", stdout);
    }
    if (fflush(stdout) != 0) die("cannot write to standard output");
    s->tokens_done += N;
    s->seqs_done += b->B;
    for (int i = 0; i < b->B; i++) {
        for (int k = 0; k < b->n_ims[i]; k++) vl_image_free(&b->ims[i][k]);
        free(b->ims[i]);
        free(b->feats[i]);
    }
    b->B = 0;
}

// Parses one input line into `ids` (grown as needed): its token count, or -1 with *err (malloc'd) saying
// what is wrong, naming the line.
static int64_t parse_line(const char *line, int64_t lineno, const DecoderConfig *c, int32_t **ids, int64_t *cap,
                          char **err) {
    long long ln = (long long)lineno;
    cJSON *root = json_parse_exact(line, strlen(line), NULL);
    int64_t n = -1;
    *err = NULL;
    if (!root || !cJSON_IsObject(root)) {
        *err = xprintf("stdin line %lld: not a JSON object", ln);
        cJSON_Delete(root);
        return -1;
    }
    // "ids" is what grpo tokenize --jsonl writes.
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    const cJSON *alt = cJSON_GetObjectItemCaseSensitive(root, "ids");
    const char *key = toks ? "tokens" : "ids";
    if (!toks) toks = alt;
    if (toks && alt && toks != alt) *err = xprintf("stdin line %lld: both \"tokens\" and \"ids\"; give one", ln);
    else if (!cJSON_IsArray(toks)) *err = xprintf("stdin line %lld: missing array \"tokens\" (or \"ids\")", ln);
    else if ((n = cJSON_GetArraySize(toks)) == 0) *err = xprintf("stdin line %lld: \"%s\" is empty", ln, key);
    else if (n > c->max_pos)
        *err = xprintf("stdin line %lld: %lld tokens exceed max_position_embeddings %lld", ln, (long long)n,
                       (long long)c->max_pos);
    if (*err) {
        cJSON_Delete(root);
        return -1;
    }
    if (n > *cap) *ids = xrealloc(*ids, (size_t)(*cap = n) * sizeof(int32_t));
    int64_t i = 0;
    for (const cJSON *t = toks->child; t; t = t->next, i++) {
        int64_t v;
        if (!json_as_int(t, 0, c->vocab - 1, &v)) {
            char *text = cJSON_PrintUnformatted(t);
            *err = xprintf("stdin line %lld: \"%s\"[%lld] is %.40s, not an id in [0, %lld)", ln, key, (long long)i,
                           text ? text : "?", (long long)c->vocab);
            free(text);
            break;
        }
        (*ids)[i] = (int32_t)v;
    }
    cJSON_Delete(root);
    return *err ? -1 : n;
}

// What a {"messages": [...]} line needs: the tokenizer (loaded at the first such line) and, for a
// vision-language model, its tower and image processor.
typedef struct {
    const Decoder *m;
    const char *dir;
    Tokenizer tok;
    int has_tok, has_vl;
    VlModel vl;
    char where[48];
} ScoreCtx;

// A line {"messages": [...]}: the conversation rendered by the chat template (no generation prompt), its
// images' pads expanded, into *ids; 0 (nothing taken) when the line is not such an object.
static int messages_line(ScoreCtx *sc, const char *line, int64_t lineno, IdList *ids, VlImage **ims, int *n_ims) {
    uint32_t nul;
    cJSON *root = json_parse_line(line, strlen(line), &nul);
    const cJSON *msgs = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "messages") : NULL;
    if (!msgs) {
        cJSON_Delete(root);
        return 0;
    }
    snprintf(sc->where, sizeof sc->where, "stdin line %lld", (long long)lineno);
    for (const cJSON *e = root->child; e; e = e->next)
        if (strcmp(e->string, "messages") != 0 && strcmp(e->string, "tools") != 0)
            die("%s: unknown key \"%.60s\" beside \"messages\" (and \"tools\")", sc->where, e->string);
    if (!sc->has_tok) {
        char *tj = path_join(sc->dir, "tokenizer.json");
        if (!file_exists(tj))
            die("%s: \"messages\" need a tokenizer, and %s has no tokenizer.json", sc->where, sc->dir);
        tokenizer_load(&sc->tok, tj);
        free(tj);
        sc->has_tok = 1;
    }
    vl_render_messages(sc->has_vl ? &sc->vl.proc : NULL, (int32_t)sc->m->cfg.image_pad_id, &sc->tok, msgs,
                       cJSON_GetObjectItemCaseSensitive(root, "tools"), nul, 0, ids, ims, n_ims, sc->where);
    cJSON_Delete(root);
    if (ids->n < 2) die("%s: the conversation renders to %zu tokens (2 at least)", sc->where, ids->n);
    if ((int64_t)ids->n > sc->m->cfg.max_pos)
        die("%s: %zu tokens exceed max_position_embeddings %lld", sc->where, ids->n, (long long)sc->m->cfg.max_pos);
    return 1;
}

int cmd_score(int argc, char **argv) {
    CliOpt opts[] = {
        {"--model", "DIR", "Hugging Face model directory (config.json + safetensors)", NULL, 1},
        {"--batch-tokens", "N", "pack input lines into forward passes of about N tokens", "2048", 0},
        {"--dtype", "f32|bf16",
         "weights and products in fp32, or bf16 (2 bytes a weight; default: the checkpoint's)", NULL, 0},
        {"--adapter", "DIR", "apply this PEFT LoRA adapter to the model (CPU)", NULL, 0},
        {"--device", "cpu|cuda[:N]|emu", "where the forward runs (a GPU, or the emulated one, computes in bf16)",
         "cpu", 0},
        {"--stats", NULL, "print timing as one JSON line on stderr at the end", NULL, 0},
    };
    CliSpec spec = {"grpo score --model DIR [--batch-tokens N] [--dtype f32|bf16] [--device cpu|cuda[:N]|emu]"
                    " < in.jsonl > out.jsonl",
                    "Reads lines {\"tokens\": [int, ...]} (or {\"ids\": ...}, as grpo tokenize --jsonl\n"
                    "writes) and writes one line {\"logprobs\": [float, ...]} per input with n-1 entries:\n"
                    "entry i-1 is log p(tokens[i] | tokens[0..i-1]). A line {\"messages\": [...]}\n"
                    "(and \"tools\") is the chat template's rendering of the conversation, and its output\n"
                    "line adds \"tokens\"; a Qwen2.5-VL model takes images there as content parts\n"
                    "{\"type\": \"image\", \"image\": PATH}.\n"
                    "A reward model (a ...ForSequenceClassification) writes {\"score\": float}\n"
                    "instead: its score head at the line's last token.\n"
                    "At a bad line, the lines before it are written, then it stops.",
                    opts, sizeof opts / sizeof opts[0]};
    cli_parse(&spec, argc, argv);
    int64_t batch_tokens = cli_int(&spec, "--batch-tokens", 1, INT64_C(1) << 24);

    double t0 = time_now();
    Decoder m;
    Lora lora;
    const char *dir = cli_str(&spec, "--model");
    const Backend *be = cli_load_model(&spec, dir, &m, &lora, NULL, CLI_MODEL_VL | CLI_MODEL_RM);
    Scorer s = {.m = &m};
    ScoreCtx sc = {.m = &m, .dir = dir, .has_vl = m.cfg.vl};
    if (sc.has_vl) vl_model_load(&sc.vl, dir, &m.cfg);
    if (sc.has_vl) s.merge = sc.vl.proc.merge;
    backend_arena_init(be, &s.arena, decoder_acts_bytes(be, &m.cfg, m.dtype, batch_tokens, batch_tokens));
    decoder_acts_init(&s.acts, be, &m.cfg, m.dtype, batch_tokens, batch_tokens, &s.arena);
    s.out = xmalloc((size_t)batch_tokens * sizeof(float));
    double load_seconds = time_now() - t0;

    Batch b = {0};
    char *line = NULL;
    size_t line_cap = 0;
    int32_t *ids = NULL;
    int64_t ids_cap = 0, lineno = 0;
    while (line_read(stdin, &line, &line_cap, "stdin", lineno + 1) >= 0) {
        lineno++;
        char *err;
        if (strstr(line, "\"messages\"")) {  // perhaps a conversation: the lines before it are scored first
            VlImage *ims;
            int n_ims;
            IdList got;
            score_flush(&s, &b);
            if (messages_line(&sc, line, lineno, &got, &ims, &n_ims)) {
                float *feats = sc.has_vl ? vl_prompt_features(&sc.vl, ims, n_ims, sc.where) : NULL;
                batch_add(&b, got.ids, (int64_t)got.n, ims, n_ims, feats, 1);
                free(got.ids);
                continue;
            }
        }
        int64_t n = parse_line(line, lineno, &m.cfg, &ids, &ids_cap, &err);
        if (n < 0) {
            score_flush(&s, &b);  // the lines before a bad one are scored and written first
            die("%s", err);
        }
        if (b.B && b.seq_off[b.B] + n > batch_tokens) score_flush(&s, &b);
        batch_add(&b, ids, n, NULL, 0, NULL, 0);
    }
    if (ferror(stdin)) die("cannot read standard input");
    score_flush(&s, &b);

    if (cli_str(&spec, "--stats")) {
        fprintf(stderr,
                "{\"sequences\": %lld, \"tokens\": %lld, \"load_seconds\": %.3f, \"forward_seconds\": %.3f, "
                "\"tokens_per_second\": %.1f, \"workspace_bytes\": %zu, \"parameters\": %zu, \"dtype\": \"%s\", "
                "\"batch_seconds\": [",
                (long long)s.seqs_done, (long long)s.tokens_done, load_seconds, s.seconds,
                s.seconds > 0 ? (double)s.tokens_done / s.seconds : 0.0, s.arena.size, m.n_params,
                dtype_name(m.dtype));
        for (int i = 0; i < s.n_batches; i++) fprintf(stderr, i ? ", %.4f" : "%.4f", s.batch_seconds[i]);
        fprintf(stderr, "]}\n");
    }
    free(s.batch_seconds);
    free(line);
    free(ids);
    free(b.tokens);
    free(b.seq_off);
    free(b.ims), free(b.n_ims), free(b.echo), free(b.feats);
    if (sc.has_vl) vl_model_free(&sc.vl);
    if (sc.has_tok) tokenizer_free(&sc.tok);
    free(s.out);
    decoder_acts_free(&s.acts);
    backend_arena_free(be, &s.arena);
    decoder_free(&m);
    lora_free(&lora);
    backend_close(be);
    return 0;
}
