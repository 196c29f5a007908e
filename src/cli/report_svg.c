// grpo report's charts: one inline SVG per chart (no scripts, no network), lines per metric over
// steps, gaps where a value is missing or null, and the step time stacked by phase.
#include <math.h>
#include <string.h>

#include "base/util.h"
#include "cli/report.h"

#define REPORT_NAME(k) #k,
const char *const report_key_names[REPORT_N_KEYS] = {REPORT_KEYS(REPORT_NAME)};

typedef struct {
    const char *title;
    ReportKey keys[6];
    int n_keys;
    int stacked;  // areas stacked in key order (the phases of a step)
} ChartSpec;

static const ChartSpec charts[] = {
    {"Reward (mean)", {REPORT_reward_mean}, 1, 0},
    {"Accuracy", {REPORT_accuracy, REPORT_val_accuracy}, 2, 0},
    {"KL", {REPORT_kl}, 1, 0},
    {"Entropy", {REPORT_entropy}, 1, 0},
    {"Clip fraction", {REPORT_clip_frac}, 1, 0},
    {"Response length (tokens)", {REPORT_response_length_mean, REPORT_response_length_max}, 2, 0},
    {"Gradient norm", {REPORT_grad_norm}, 1, 0},
    {"Tool calls per response (multi-turn)", {REPORT_turns_mean}, 1, 0},
    {"Tool calls and errors per step", {REPORT_tool_calls, REPORT_tool_errors}, 2, 0},
    {"Step time by phase (s)",
     {REPORT_time_rollout_s, REPORT_time_reward_s, REPORT_time_reference_s, REPORT_time_old_logprob_s, REPORT_time_update_s},
     5, 1},
    {"Tokens per second", {REPORT_tokens_per_s}, 1, 0},
    {"Policy loss", {REPORT_pg_loss}, 1, 0},
    {"Loss (SFT)", {REPORT_loss}, 1, 0},
    {"Learning rate", {REPORT_lr}, 1, 0},
    {"Peak RSS (GiB)", {REPORT_peak_rss_gib}, 1, 0},
    {"Loss scale", {REPORT_loss_scale}, 1, 0},
};
static const char *const colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};

// Plot geometry: a W x H picture, the plot area inside the margins. The left margin grows with the
// widest tick label, the top one with the lines of the legend.
enum { W = 460, H = 250, ML = 64, MR = 14, MT = 44, MB = 30, LEGEND_LINE = 14, MAX_TICKS = 64 };
// Width of a character of the 11px tick and legend font, a little above DejaVu Sans's widest digits
// and letters, so that an estimate from the length never cuts a label.
#define CHAR_W 7.0

double report_value(const ReportMetrics *m, int64_t i, int k) {
    return (m->rows[i].set >> k) & 1 ? m->rows[i].v[k] : NAN;
}

static int has_data(const ReportMetrics *m, ReportKey k) {
    for (int64_t i = 0; i < m->n; i++)
        if (isfinite(report_value(m, i, k))) return 1;
    return 0;
}

// A row takes part in a stacked chart when it has any of its keys (validation-only rows do not).
static int stack_row(const ReportMetrics *m, int64_t i, const ChartSpec *c) {
    for (int j = 0; j < c->n_keys; j++)
        if (isfinite(report_value(m, i, c->keys[j]))) return 1;
    return 0;
}

// Height of layer j of a stack at row i: the sum of keys 0..j (missing phases count as 0).
static double stack_top(const ReportMetrics *m, int64_t i, const ChartSpec *c, int j) {
    double s = 0;
    for (int q = 0; q <= j; q++) {
        double x = report_value(m, i, c->keys[q]);
        s += isfinite(x) ? x : 0;
    }
    return s;
}

// 1, 2 or 5 times a power of ten, about range/n.
static double nice_step(double range, int n) {
    double raw = range / n, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

typedef struct {
    double x0, x1, y0, y1;
    int ml, mt;  // left and top margins
} Range;

static double px(const Range *r, double x) {
    return r->ml + (x - r->x0) / (r->x1 - r->x0) * (W - r->ml - MR);
}
static double py(const Range *r, double y) {
    return H - MB - (y - r->y0) / (r->y1 - r->y0) * (H - r->mt - MB);
}

typedef struct {
    double v[MAX_TICKS];
    char label[MAX_TICKS][32];
    int n;
} Ticks;

// Labels of the y ticks with as many decimals as the step needs, so that neighbours differ (a step
// of 0.0002 gives 11.9202, 11.9204); very large or small values in exponent notation, with as many
// mantissa digits as the step needs.
static void tick_labels(Ticks *t, double step) {
    double maxabs = 0;
    for (int i = 0; i < t->n; i++) maxabs = fmax(maxabs, fabs(t->v[i]));
    int step_exp = (int)floor(log10(step) + 1e-9);
    int sci = maxabs >= 1e6 || maxabs < 1e-3;
    int digits = sci ? (int)floor(log10(maxabs) + 1e-9) - step_exp : -step_exp;
    if (digits < 0) digits = 0;
    if (digits > 15) digits = 15;
    for (int i = 0; i < t->n; i++) {
        if (t->v[i] == 0) snprintf(t->label[i], sizeof t->label[i], "0");
        else if (sci) snprintf(t->label[i], sizeof t->label[i], "%.*e", digits, t->v[i]);
        else snprintf(t->label[i], sizeof t->label[i], "%.*f", digits, t->v[i]);
    }
}

static void axes(FILE *f, const Range *r, const Ticks *yt, double xstep) {
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#fff\" stroke=\"#999\"/>\n",
            r->ml, r->mt, W - r->ml - MR, H - r->mt - MB);
    for (int i = 0; i < yt->n; i++) {
        double y = py(r, yt->v[i]);
        fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%.2f\" y2=\"%.2f\" stroke=\"#eee\"/>"
                   "<text x=\"%d\" y=\"%.2f\" text-anchor=\"end\" class=\"tick ytick\">%s</text>\n",
                r->ml, W - MR, y, y, r->ml - 4, y + 4, yt->label[i]);
    }
    // Whole multiples of the step (a running sum stops moving once the step is below the steps' ulp).
    double k0 = ceil(r->x0 / xstep), k1 = floor(r->x1 / xstep);
    for (int i = 0; i < (int)fmin(k1 - k0 + 1, MAX_TICKS); i++)
        fprintf(f, "<text x=\"%.2f\" y=\"%d\" text-anchor=\"middle\" class=\"tick xtick\">%.0f</text>\n",
                px(r, (k0 + i) * xstep), H - MB + 14, (k0 + i) * xstep);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" class=\"tick\">step</text>\n",
            (W + r->ml) / 2, H - 3);
}

// Ranges over every value the chart draws; 0 when it has none.
static int chart_range(const ReportMetrics *m, const ChartSpec *c, Range *r) {
    int any = 0;
    double lo = INFINITY, hi = -INFINITY;
    for (int64_t i = 0; i < m->n; i++)
        for (int j = 0; j < c->n_keys; j++) {
            if (c->stacked && !stack_row(m, i, c)) continue;
            double y = c->stacked ? stack_top(m, i, c, j) : report_value(m, i, c->keys[j]);
            if (!isfinite(y)) continue;
            if (!any) r->x0 = r->x1 = (double)m->rows[i].step;
            any = 1;
            r->x0 = fmin(r->x0, (double)m->rows[i].step), r->x1 = fmax(r->x1, (double)m->rows[i].step);
            lo = fmin(lo, y), hi = fmax(hi, y);
        }
    if (!any) return 0;
    if (c->stacked) lo = 0;
    if (r->x1 == r->x0) {  // one step: half a step either side, or a few ulps where 0.5 is below its ulp
        double pad = fmax(0.5, 4 * (nextafter(fabs(r->x0), INFINITY) - fabs(r->x0)));
        r->x0 -= pad, r->x1 += pad;
    }
    if (hi == lo) {  // a flat line sits in the middle of the plot
        double pad = lo != 0 ? fabs(lo) * 0.1 : 1;
        lo -= pad, hi += pad;
    }
    r->y0 = lo, r->y1 = hi;
    return 1;
}

// One metric as a line: "M" starts each run of consecutive values, so a missing value leaves a gap;
// a lone point is a zero-length round-capped segment ("l0 0"), which still draws a dot.
static void series_line(FILE *f, const ReportMetrics *m, const Range *r, ReportKey k, const char *color) {
    fprintf(f, "<path class=\"series\" data-key=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\" "
               "stroke-linecap=\"round\" stroke-linejoin=\"round\" d=\"", report_key_names[k], color);
    int64_t run = 0, points = 0;
    for (int64_t i = 0; i <= m->n; i++) {
        double y = i < m->n ? report_value(m, i, k) : NAN;
        if (!isfinite(y)) {
            if (run == 1) fprintf(f, " l0 0");
            run = 0;
            continue;
        }
        fprintf(f, "%s%c%.2f %.2f", points++ ? " " : "", run ? 'L' : 'M', px(r, (double)m->rows[i].step), py(r, y));
        run++;
    }
    fprintf(f, "\"/>\n");
    for (int64_t i = 0; i < m->n; i++) {  // a lone point also gets a visible marker
        double y = report_value(m, i, k);
        if (isfinite(y) && !(i > 0 && isfinite(report_value(m, i - 1, k))) && !(i + 1 < m->n && isfinite(report_value(m, i + 1, k))))
            fprintf(f, "<circle class=\"point\" data-key=\"%s\" cx=\"%.2f\" cy=\"%.2f\" r=\"3\" fill=\"%s\"/>\n",
                    report_key_names[k], px(r, (double)m->rows[i].step), py(r, y), color);
    }
}

// Layer j of a stack: along its top edge, back along the layer below.
static void series_area(FILE *f, const ReportMetrics *m, const Range *r, const ChartSpec *c, int j) {
    fprintf(f, "<path class=\"area\" data-key=\"%s\" fill=\"%s\" fill-opacity=\"0.75\" stroke=\"%s\" d=\"",
            report_key_names[c->keys[j]], colors[j], colors[j]);
    int first = 1;
    for (int64_t i = 0; i < m->n; i++)
        if (stack_row(m, i, c))
            fprintf(f, "%c%.2f %.2f ", first ? 'M' : 'L', px(r, (double)m->rows[i].step), py(r, stack_top(m, i, c, j))), first = 0;
    for (int64_t i = m->n - 1; i >= 0; i--)
        if (stack_row(m, i, c))
            fprintf(f, "L%.2f %.2f ", px(r, (double)m->rows[i].step), py(r, j ? stack_top(m, i, c, j - 1) : 0));
    fprintf(f, "Z\"/>\n");
}

// Estimated width of a legend entry: the swatch, its gap, the name and the space before the next.
static double legend_width(const char *name) { return 13 + CHAR_W * (double)strlen(name) + 10; }

static void chart(FILE *f, const ReportMetrics *m, const ChartSpec *c, const Range *r) {
    fprintf(f, "<svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "role=\"img\" aria-label=\"", W, H, W, H);
    report_escape(f, c->title, strlen(c->title));
    fprintf(f, "\">\n<text x=\"%d\" y=\"16\" class=\"title\">", ML);
    report_escape(f, c->title, strlen(c->title));
    fprintf(f, "</text>\n");
    double ystep = nice_step(r->y1 - r->y0, 4), xstep = nice_step(r->x1 - r->x0, 5);
    Range g = *r;
    // Ticks at whole multiples of the step (not a running sum, which drifts: 0.30000000000000004).
    double k0 = floor(r->y0 / ystep), k1 = ceil(r->y1 / ystep);
    Ticks yt = {.n = (int)fmin(k1 - k0, MAX_TICKS - 1) + 1};
    for (int i = 0; i < yt.n; i++) yt.v[i] = (k0 + i) * ystep;
    g.y0 = k0 * ystep;
    g.y1 = k1 * ystep;
    tick_labels(&yt, ystep);
    size_t widest = 0;
    for (int i = 0; i < yt.n; i++) widest = strlen(yt.label[i]) > widest ? strlen(yt.label[i]) : widest;
    g.ml = (int)fmax(ML, ceil(8 + CHAR_W * (double)widest));
    if (xstep < 1) xstep = 1;  // steps are integers
    // Legend: only the keys with data, wrapped onto more lines where one line would pass the right edge.
    double lx = ML;
    int line = 0;
    for (int j = 0; j < c->n_keys; j++) {
        if (!has_data(m, c->keys[j])) continue;
        const char *name = report_key_names[c->keys[j]];
        if (lx > ML && lx + legend_width(name) - 10 > W - MR) {
            lx = ML;
            line++;
        }
        fprintf(f, "<rect x=\"%.0f\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/>"
                   "<text x=\"%.0f\" y=\"%d\" class=\"legend\">%s</text>\n",
                lx, 25 + LEGEND_LINE * line, colors[j], lx + 13, 34 + LEGEND_LINE * line, name);
        lx += legend_width(name);
    }
    g.mt = MT + LEGEND_LINE * line;
    axes(f, &g, &yt, xstep);
    for (int j = 0; j < c->n_keys; j++)
        if (!has_data(m, c->keys[j])) continue;
        else if (c->stacked) series_area(f, m, &g, c, j);
        else series_line(f, m, &g, c->keys[j], colors[j]);
    fprintf(f, "</svg>\n");
}

int report_charts(FILE *f, const ReportMetrics *m) {
    int n = 0;
    for (size_t i = 0; i < sizeof charts / sizeof charts[0]; i++) {
        Range r = {0};
        if (!chart_range(m, &charts[i], &r)) continue;
        chart(f, m, &charts[i], &r);
        n++;
    }
    return n;
}

void report_escape(FILE *f, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '&') fputs("&amp;", f);
        else if (c == '<') fputs("&lt;", f);
        else if (c == '>') fputs("&gt;", f);
        else if (c == '"') fputs("&quot;", f);
        else if (c == '\'') fputs("&#39;", f);
        else if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) fputs("&#xFFFD;", f);  // not allowed in HTML text
        else fputc(c, f);
    }
}
