// grpo report: one self-contained HTML file (inline SVG, no scripts, no network) with the charts of a
// run's metrics.jsonl, its config.yaml and a few responses of the last step from samples.jsonl.
// Runs in progress (a last line without newline) and resumed runs (steps repeated) are expected.
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/json.h"
#include "base/util.h"
#include "base/yaml.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/report.h"

#define REPORT_MAX_SAMPLES 8
#define REPORT_MAX_TEXT 2000  // bytes of a prompt or response shown

static int key_index(const char *name) {
    for (int k = 0; k < REPORT_N_KEYS; k++)
        if (strcmp(report_key_names[k], name) == 0) return k;
    return -1;
}

// One complete line of metrics.jsonl into a row; dies naming file:line on anything malformed. *per_source: the
// line has a validation's "val/SOURCE/..." keys.
static ReportRow parse_row(const char *line, size_t len, const char *path, int64_t lineno, int *per_source) {
    cJSON *o = json_parse_exact(line, len, NULL);
    if (!cJSON_IsObject(o)) die("%s:%lld: not a JSON object", path, (long long)lineno);
    ReportRow r = {.seq = lineno};
    int64_t step;
    if (!json_as_int(cJSON_GetObjectItemCaseSensitive(o, "step"), 0, INT64_MAX, &step))
        die("%s:%lld: \"step\" is missing or not a non-negative integer", path, (long long)lineno);
    r.step = step;
    *per_source = 0;
    for (const cJSON *it = o->child; it; it = it->next) {
        *per_source |= strncmp(it->string, "val/", 4) == 0;
        int k = key_index(it->string);
        if (k < 0) continue;  // a key this report does not chart yet
        if (cJSON_IsNumber(it)) r.v[k] = it->valuedouble;
        else if (cJSON_IsNull(it)) r.v[k] = NAN;
        else if (cJSON_IsBool(it)) r.v[k] = cJSON_IsTrue(it);
        else die("%s:%lld: \"%s\" is not a number or null", path, (long long)lineno, it->string);
        r.set |= UINT64_C(1) << k;
    }
    cJSON_Delete(o);
    return r;
}

static int row_cmp(const void *a, const void *b) {
    const ReportRow *x = a, *y = b;
    return x->step != y->step ? (x->step < y->step ? -1 : 1) : (x->seq < y->seq ? -1 : x->seq > y->seq);
}

// grpo sft logs each step's target tokens and seconds; its tokens/s is their ratio.
static void derive_sft_rate(ReportMetrics *m) {
    for (int64_t i = 0; i < m->n; i++) {
        double dt = report_value(m, i, REPORT_elapsed_s), tok = report_value(m, i, REPORT_tokens);
        if ((m->rows[i].set >> REPORT_tokens_per_s) & 1 || !(dt > 0) || !isfinite(tok)) continue;
        m->rows[i].v[REPORT_tokens_per_s] = tok / dt;
        m->rows[i].set |= UINT64_C(1) << REPORT_tokens_per_s;
    }
}

static void metrics_load(ReportMetrics *m, const char *path) {
    size_t len;
    char *text = file_read_all(path, FILE_MAX_METRICS, &len);
    int64_t lineno = 0, cap = 0, prev = -1;
    *m = (ReportMetrics){0};
    for (size_t at = 0; at < len;) {
        char *nl = memchr(text + at, '\n', len - at);
        lineno++;
        if (!nl) {  // still being written: the next flush completes it
            m->partial = 1;
            break;
        }
        size_t n = (size_t)(nl - (text + at));
        if (strspn(text + at, " \t\r") < n) {
            if (m->n == cap) m->rows = xrealloc(m->rows, (size_t)(cap = 2 * cap + 64) * sizeof *m->rows);
            int per_source;
            ReportRow r = parse_row(text + at, n, path, lineno, &per_source);
            if (per_source && (!m->val_line || r.step >= m->val_step)) {  // a later line of the same step wins
                free(m->val_line);
                m->val_line = xmalloc(n + 1), m->val_len = n, m->val_step = r.step;
                memcpy(m->val_line, text + at, n);
                m->val_line[n] = 0;
            }
            if (r.step < prev) m->resumes++;
            prev = r.step;
            m->rows[m->n++] = r;
        }
        at += n + 1;
    }
    free(text);
    // Sort by (step, line) and fold each step's lines into one row: later lines overwrite earlier ones
    // key by key, so a resumed step's values win and a validation line adds val_accuracy to its step.
    if (m->n) qsort(m->rows, (size_t)m->n, sizeof *m->rows, row_cmp);
    int64_t out = 0;
    for (int64_t i = 0; i < m->n; i++) {
        if (out && m->rows[out - 1].step == m->rows[i].step) {
            ReportRow *d = &m->rows[out - 1];
            for (int k = 0; k < REPORT_N_KEYS; k++)
                if ((m->rows[i].set >> k) & 1) d->v[k] = m->rows[i].v[k];
            d->set |= m->rows[i].set;
        } else {
            m->rows[out++] = m->rows[i];
        }
    }
    m->n = out;
    derive_sft_rate(m);
}

// A grpo sft run: every line has SFT's loss and elapsed_s, none a GRPO metric. SFT writes neither
// config.yaml nor samples.jsonl, so their absence is not worth a note.
static int is_sft_run(const ReportMetrics *m) {
    static const ReportKey sft_keys[] = {REPORT_loss, REPORT_elapsed_s};
    static const ReportKey grpo_keys[] = {REPORT_reward_mean, REPORT_pg_loss, REPORT_kl, REPORT_time_step_s,
                                          REPORT_val_accuracy};
    if (m->n == 0) return 0;
    for (int64_t i = 0; i < m->n; i++) {
        for (size_t j = 0; j < sizeof sft_keys / sizeof sft_keys[0]; j++)
            if (!((m->rows[i].set >> sft_keys[j]) & 1)) return 0;
        for (size_t j = 0; j < sizeof grpo_keys / sizeof grpo_keys[0]; j++)
            if ((m->rows[i].set >> grpo_keys[j]) & 1) return 0;
    }
    return 1;
}

typedef struct {
    int64_t prompt_index, sample;
    double reward, advantage;
    int correct;  // -1: not recorded
    char *prompt, *response;
    size_t prompt_len, response_len;
} Sample;

typedef struct {
    Sample s[REPORT_MAX_SAMPLES];
    int n;
    int64_t step;  // -1: none
} Samples;

static char *string_or_empty(const cJSON *o, const char *key, uint32_t sentinel, size_t *len, const char *where) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!it || cJSON_IsNull(it)) return *len = 0, xstrdup("");
    if (!cJSON_IsString(it)) die("%s: \"%s\" is not a string", where, key);
    return json_string_bytes(it, sentinel, len);
}

static void samples_clear(Samples *ss) {
    for (int i = 0; i < ss->n; i++) free(ss->s[i].prompt), free(ss->s[i].response);
    ss->n = 0;
}

// The first few samples of the last step in samples.jsonl (streamed: the file holds every step).
// A step written again after a resume replaces what was kept for it.
static void samples_load(Samples *ss, const char *path) {
    ss->n = 0, ss->step = -1;
    FILE *f = fopen(path, "rb");
    if (!f) return;
    char *line = NULL, where[512];
    size_t cap = 0;
    int64_t lineno = 0, prev = -1;
    long got;
    while ((got = line_read(f, &line, &cap, path, lineno + 1)) > 0) {
        lineno++;
        if (line[got - 1] != '\n') break;  // a partial last line of a run in progress
        if (strspn(line, " \t\r\n") == (size_t)got) continue;
        snprintf(where, sizeof where, "%s:%lld", path, (long long)lineno);
        uint32_t sentinel;
        cJSON *o = json_parse_line(line, (size_t)got, &sentinel);
        if (!cJSON_IsObject(o)) die("%s: not a JSON object", where);
        int64_t step = json_get_int(o, "step", where);
        if (step > ss->step || (step == ss->step && prev != step)) samples_clear(ss), ss->step = step;
        prev = step;
        if (step == ss->step && ss->n < REPORT_MAX_SAMPLES) {
            Sample *s = &ss->s[ss->n++];
            s->prompt_index = json_get_int_or(o, "prompt_index", -1, where);
            s->sample = json_get_int_or(o, "sample", -1, where);
            s->reward = json_get_number_or(o, "reward", NAN, where);
            s->advantage = json_get_number_or(o, "advantage", NAN, where);
            const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "correct");
            s->correct = cJSON_IsBool(c) ? cJSON_IsTrue(c) : cJSON_IsNumber(c) ? c->valuedouble != 0 : -1;
            s->prompt = string_or_empty(o, "prompt", sentinel, &s->prompt_len, where);
            s->response = string_or_empty(o, "response", sentinel, &s->response_len, where);
        }
        cJSON_Delete(o);
    }
    if (ferror(f)) die("cannot read %s", path);
    fclose(f);
    free(line);
}

// At most REPORT_MAX_TEXT bytes, cut at a UTF-8 character boundary.
static void text_cell(FILE *f, const char *s, size_t n) {
    size_t k = n;
    if (k > REPORT_MAX_TEXT) {
        k = REPORT_MAX_TEXT;
        while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
    }
    fputs("<td class=\"text\">", f);
    report_escape(f, s, k);
    if (k < n) fprintf(f, "<span class=\"cut\"> [… %zu more bytes]</span>", n - k);
    fputs("</td>", f);
}

static void number_cell(FILE *f, double x) {
    if (isfinite(x)) fprintf(f, "<td>%.4g</td>", x);
    else fputs("<td>–</td>", f);
}

static const char *const css =
    "body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;background:#fafafa}"
    "h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}"
    ".meta{color:#555}"
    // As many columns of charts as fit at 440px or more each: the charts fill the page's width.
    ".charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(440px,100%),1fr));gap:12px}"
    "svg.chart{width:100%;height:auto;box-sizing:border-box;background:#fff;border:1px solid #ddd;"
    "border-radius:4px}"
    "svg .title{font:bold 13px sans-serif}svg .tick,svg .legend{font:11px sans-serif;fill:#444}"
    "table{border-collapse:collapse;background:#fff}td,th{border:1px solid #ddd;padding:4px 8px;vertical-align:top;text-align:left}"
    "td.text{white-space:pre-wrap;font-family:monospace;max-width:520px;word-break:break-word}"
    "pre{background:#fff;border:1px solid #ddd;padding:10px;overflow:auto}.cut{color:#999}";

static void summary(FILE *f, const ReportMetrics *m) {
    static const ReportKey keys[] = {REPORT_reward_mean, REPORT_accuracy, REPORT_val_accuracy, REPORT_kl,
                                     REPORT_response_length_mean, REPORT_turns_mean, REPORT_loss, REPORT_tokens_per_s,
                                     REPORT_time_step_s};
    fputs("<table class=\"summary\"><tr><th>metric</th><th>last value</th><th>at step</th></tr>\n", f);
    for (size_t j = 0; j < sizeof keys / sizeof keys[0]; j++)
        for (int64_t i = m->n - 1; i >= 0; i--) {
            double x = report_value(m, i, keys[j]);
            if (!isfinite(x)) continue;
            fprintf(f, "<tr><td>%s</td><td>%.4g</td><td>%lld</td></tr>\n", report_key_names[keys[j]], x,
                    (long long)m->rows[i].step);
            break;
        }
    fputs("</table>\n", f);
}

// The latest validation's "val/SOURCE/VALUE/METRIC" keys (verl's names: SOURCE may hold '/'), one row per
// source and value (acc, reward), one column per metric (mean@n, pass@k, maj@n) in the line's order.
static void validation_table(FILE *f, const ReportMetrics *m) {
    enum { MAX_COLS = 32, MAX_ROWS = 256 };
    cJSON *o = json_parse_exact(m->val_line, m->val_len, NULL);
    const char *cols[MAX_COLS], *rows[MAX_ROWS];
    size_t row_len[MAX_ROWS];
    int n_cols = 0, n_rows = 0;
    for (const cJSON *it = o->child; it; it = it->next) {  // the line was read as an object before
        const char *k = it->string, *metric = strrchr(k, '/');
        if (strncmp(k, "val/", 4) != 0 || metric - k < 5) continue;
        size_t len = (size_t)(metric - k - 4);  // SOURCE/VALUE
        int c = 0, r = 0;
        while (c < n_cols && strcmp(cols[c], metric + 1) != 0) c++;
        while (r < n_rows && (row_len[r] != len || strncmp(rows[r], k + 4, len) != 0)) r++;
        if (c == n_cols && n_cols < MAX_COLS) cols[n_cols++] = metric + 1;
        if (r == n_rows && n_rows < MAX_ROWS) rows[n_rows] = k + 4, row_len[n_rows++] = len;
    }
    fprintf(f, "<h2>Validation (step %lld)</h2>\n<table class=\"val\"><tr><th>data_source / value</th>",
            (long long)m->val_step);
    for (int c = 0; c < n_cols; c++) {
        fputs("<th>", f);
        report_escape(f, cols[c], strlen(cols[c]));
        fputs("</th>", f);
    }
    fputs("</tr>\n", f);
    for (int r = 0; r < n_rows; r++) {
        fputs("<tr><td>", f);
        report_escape(f, rows[r], row_len[r]);
        fputs("</td>", f);
        for (int c = 0; c < n_cols; c++) {
            char *key = xprintf("val/%.*s/%s", (int)row_len[r], rows[r], cols[c]);
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
            number_cell(f, cJSON_IsNumber(v) ? v->valuedouble : NAN);
            free(key);
        }
        fputs("</tr>\n", f);
    }
    fputs("</table>\n", f);
    cJSON_Delete(o);
}

static void samples_table(FILE *f, const Samples *ss) {
    fprintf(f, "<h2>Samples (step %lld, first %d)</h2>\n<table class=\"samples\"><tr><th>prompt</th><th>sample</th>"
               "<th>reward</th><th>advantage</th><th>correct</th><th>prompt text</th><th>response</th></tr>\n",
            (long long)ss->step, ss->n);
    for (int i = 0; i < ss->n; i++) {
        const Sample *s = &ss->s[i];
        fprintf(f, "<tr><td>%lld</td><td>%lld</td>", (long long)s->prompt_index, (long long)s->sample);
        number_cell(f, s->reward);
        number_cell(f, s->advantage);
        fprintf(f, "<td>%s</td>", s->correct < 0 ? "–" : s->correct ? "yes" : "no");
        text_cell(f, s->prompt, s->prompt_len);
        text_cell(f, s->response, s->response_len);
        fputs("</tr>\n", f);
    }
    fputs("</table>\n", f);
}

// A JSON number as YAML 1.1 reads it back: integers as such, other values in the shortest form that
// round-trips, with a '.' before any exponent ("1.0e-06"; PyYAML reads "1e-06" as a string).
static void yaml_number(FILE *f, double x) {
    if (!isfinite(x)) {
        fputs(".nan", f);  // cJSON never gives one; kept valid YAML all the same
        return;
    }
    if (x == floor(x) && fabs(x) < 1e15) {
        fprintf(f, "%.0f", x);
        return;
    }
    char buf[48];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) break;
    }
    char *e = strchr(buf, 'e');
    if (e && !memchr(buf, '.', (size_t)(e - buf))) fprintf(f, "%.*s.0%s", (int)(e - buf), buf, e);
    else fputs(buf, f);
}

static void yaml_key(FILE *f, const char *k) {
    if (*k && strspn(k, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") == strlen(k))
        fputs(k, f);
    else
        yaml_write_string(f, k, strlen(k));
}

// A value on one line: scalars, [a, b] and {k: v}.
static void yaml_flow(FILE *f, const cJSON *v) {
    if (cJSON_IsString(v)) {
        yaml_write_string(f, v->valuestring, strlen(v->valuestring));
    } else if (cJSON_IsNumber(v)) {
        yaml_number(f, v->valuedouble);
    } else if (cJSON_IsBool(v)) {
        fputs(cJSON_IsTrue(v) ? "true" : "false", f);
    } else if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        int obj = cJSON_IsObject(v);
        fputc(obj ? '{' : '[', f);
        for (const cJSON *it = v->child; it; it = it->next) {
            if (it != v->child) fputs(", ", f);
            if (obj) {
                yaml_key(f, it->string);
                fputs(": ", f);
            }
            yaml_flow(f, it);
        }
        fputc(obj ? '}' : ']', f);
    } else {
        fputs("null", f);
    }
}

// A mapping in block style, two spaces a level: how grpo train writes config.yaml today.
static void yaml_block(FILE *f, const cJSON *obj, int depth) {
    for (const cJSON *it = obj->child; it; it = it->next) {
        fprintf(f, "%*s", 2 * depth, "");
        yaml_key(f, it->string);
        if (cJSON_IsObject(it) && it->child) {
            fputs(":\n", f);
            yaml_block(f, it, depth + 1);
        } else {
            fputs(": ", f);
            yaml_flow(f, it);
            fputc('\n', f);
        }
    }
}

// The run's config.yaml. Older runs wrote it as one line of JSON (which is YAML): shown as block YAML.
static void config_section(FILE *f, const char *path) {
    size_t len;
    char *text = file_read_all(path, FILE_MAX_CONFIG, &len);
    size_t lead = strspn(text, " \t\r\n");
    cJSON *json = lead < len && text[lead] == '{' ? json_parse_exact(text, len, NULL) : NULL;
    fputs("<pre class=\"config\">", f);
    if (cJSON_IsObject(json)) {
        char *yaml = NULL;
        size_t yaml_len = 0;
        FILE *mem = open_memstream(&yaml, &yaml_len);
        if (!mem) die("out of memory");
        yaml_block(mem, json, 0);
        if (fclose(mem) != 0) die("out of memory writing the report");
        report_escape(f, yaml, yaml_len);
        free(yaml);
        fputs("</pre>\n<p class=\"meta\">written as JSON by an older grpo; shown as YAML</p>\n", f);
    } else {
        report_escape(f, text, len);
        fputs("</pre>\n", f);
    }
    cJSON_Delete(json);
    free(text);
}

static int write_report(FILE *f, const char *run, const ReportMetrics *m, const char *config_path, const Samples *ss) {
    fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
          // Nothing may load from anywhere: the file must work offline and attached to an email.
          "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n<title>grpo report: ", f);
    report_escape(f, run, strlen(run));
    fprintf(f, "</title>\n<style>%s</style></head><body>\n<h1>grpo report</h1>\n<p class=\"meta\">run <code>", css);
    report_escape(f, run, strlen(run));
    fputs("</code>", f);
    if (m->n)
        fprintf(f, " · %lld step%s (%lld to %lld)", (long long)m->n, m->n == 1 ? "" : "s", (long long)m->rows[0].step,
                (long long)m->rows[m->n - 1].step);
    else fputs(" · no steps yet", f);
    if (m->resumes) fprintf(f, " · resumed %lld time%s (repeated steps: the later lines are shown)", (long long)m->resumes,
                            m->resumes > 1 ? "s" : "");
    if (m->partial) fputs(" · in progress (last line incomplete)", f);
    int sft = is_sft_run(m);
    if (sft) fputs(" · grpo sft", f);
    fputs("</p>\n", f);
    summary(f, m);
    if (m->val_line) validation_table(f, m);
    fputs("<h2>Charts</h2>\n<div class=\"charts\">\n", f);
    int n = report_charts(f, m);
    fputs("</div>\n", f);
    // grpo sft writes neither config.yaml nor samples.jsonl: no section, no note, unless they are there.
    if (config_path) {
        fputs("<h2>Config</h2>\n", f);
        config_section(f, config_path);
    } else if (!sft) {
        fputs("<h2>Config</h2>\n<p>no config.yaml in the run directory</p>\n", f);
    }
    if (ss->n) samples_table(f, ss);
    else if (!sft)
        fputs("<h2>Samples</h2>\n<p>no samples.jsonl (trainer.dump_samples=true writes it)</p>\n", f);
    fputs("</body></html>\n", f);
    return n;
}

int cmd_report(int argc, char **argv) {
    CliOpt opts[] = {
        {"--out", "FILE", "where to write the HTML (default: report.html beside metrics.jsonl)", NULL, 0},
        {"-o", "FILE", "the same as --out", NULL, 0},
    };
    CliSpec spec = {"grpo report RUN_DIR|metrics.jsonl [--out|-o report.html]",
                    "Writes one self-contained HTML file (inline SVG charts, no scripts, no network) with the\n"
                    "metrics of a grpo train or grpo sft run, its config.yaml and samples of the last step.",
                    opts, sizeof opts / sizeof opts[0], 1};
    cli_parse(&spec, argc, argv);
    if (spec.n_args != 1) die("give one run directory or metrics.jsonl (see grpo report --help)");
    const char *arg = spec.args[0];
    const char *out_opt = cli_str(&spec, "--out");
    if (cli_str(&spec, "-o")) {
        if (out_opt) die("-o and --out are the same option: give one");
        out_opt = cli_str(&spec, "-o");
    }
    struct stat sb;
    if (stat(arg, &sb) != 0) die("%s: no such file or directory", arg);
    char *dir, *metrics;
    if (S_ISDIR(sb.st_mode)) {
        dir = xstrdup(arg), metrics = path_join(arg, "metrics.jsonl");
        if (!file_exists(metrics)) die("%s: no metrics.jsonl in this directory", arg);
    } else {
        dir = xstrdup(arg), metrics = xstrdup(arg);
        char *slash = strrchr(dir, '/');
        if (slash) slash[slash == dir] = 0;
        else strcpy(dir, ".");
    }
    char *config = path_join(dir, "config.yaml"), *samples = path_join(dir, "samples.jsonl");
    char *out = out_opt ? xstrdup(out_opt) : path_join(dir, "report.html");
    ReportMetrics m;
    metrics_load(&m, metrics);
    Samples ss;
    samples_load(&ss, samples);
    // Built in memory, then written in one checked call: the report appears whole or not at all.
    char *html = NULL;
    size_t html_len = 0;
    FILE *mem = open_memstream(&html, &html_len);
    if (!mem) die("out of memory");
    int n = write_report(mem, arg, &m, file_exists(config) ? config : NULL, &ss);
    if (fclose(mem) != 0) die("out of memory writing the report");
    AtomicFile af;
    atomic_file_open(&af, out);
    atomic_file_write(&af, html, html_len);
    atomic_file_commit(&af);
    free(html);
    fprintf(stderr, "grpo report: wrote %s (%lld step%s, %d charts, %d samples)\n", out, (long long)m.n,
            m.n == 1 ? "" : "s", n, ss.n);
    samples_clear(&ss);
    free(m.rows), free(m.val_line), free(dir), free(metrics), free(config), free(samples), free(out);
    free(spec.args);
    return 0;
}
