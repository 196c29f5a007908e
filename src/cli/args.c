#define _POSIX_C_SOURCE 200809L  // strtok_r
#include "cli/args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "model/decoder.h"

static CliOpt *find(const CliSpec *spec, const char *name) {
    for (int i = 0; i < spec->n; i++)
        if (strcmp(spec->opts[i].name, name) == 0) return &spec->opts[i];
    die("internal: option %s is not declared", name);
}

static void print_help(const CliSpec *spec) {
    printf("usage: %s\n\n%s\n\noptions:\n", spec->usage, spec->about);
    for (int i = 0; i < spec->n; i++) {
        const CliOpt *o = &spec->opts[i];
        char left[64];
        snprintf(left, sizeof left, "%s%s%s", o->name, o->metavar ? " " : "", o->metavar ? o->metavar : "");
        printf("  %-24s %s", left, o->help);
        if (o->required) printf(" (required)");
        else if (o->repeat) printf(" (repeatable)");
        else if (o->value && o->metavar) printf(" (default: %s)", o->value);
        printf("\n");
    }
    printf("  %-24s %s\n", "--help", "show this help");
}

void cli_parse(CliSpec *spec, int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            print_help(spec);
            exit(0);
        }
        CliOpt *o = NULL;
        for (int j = 0; j < spec->n; j++)
            if (strcmp(spec->opts[j].name, argv[i]) == 0) o = &spec->opts[j];
        if (!o && argv[i][0] != '-' && spec->n_args < spec->max_args) {
            if (!spec->args) spec->args = xcalloc((size_t)spec->max_args, sizeof *spec->args);
            spec->args[spec->n_args++] = argv[i];
            continue;
        }
        if (!o) die("unknown %s \"%s\" (see --help)", argv[i][0] == '-' ? "option" : "argument", argv[i]);
        if (!o->metavar) {
            o->value = "1";
        } else {
            if (i + 1 >= argc) die("option %s needs a value %s", o->name, o->metavar);
            o->value = argv[++i];
            if (o->repeat) {
                o->values = xrealloc(o->values, (size_t)(o->n_values + 1) * sizeof *o->values);
                o->values[o->n_values++] = o->value;
            }
        }
    }
    for (int j = 0; j < spec->n; j++)
        if (spec->opts[j].required && !spec->opts[j].value) die("missing required option %s (see --help)", spec->opts[j].name);
}

const char *cli_str(const CliSpec *spec, const char *name) { return find(spec, name)->value; }

int64_t cli_int(const CliSpec *spec, const char *name, int64_t lo, int64_t hi) {
    const char *s = find(spec, name)->value;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        die("option %s: \"%s\" is not an integer in [%lld, %lld]", name, s, (long long)lo, (long long)hi);
    return v;
}

double cli_double(const CliSpec *spec, const char *name, double lo, double hi) {
    const char *s = find(spec, name)->value;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) die("option %s: \"%s\" is not a number in [%g, %g]", name, s, lo, hi);
    return v;
}

const CliOpt *cli_opt(const CliSpec *spec, const char *name) { return find(spec, name); }

DType cli_dtype(const CliSpec *spec, const char *name, const char *f32, const char *bf16, const char *f16) {
    const char *s = cli_str(spec, name);
    if (strcmp(s, f32) == 0) return DTYPE_F32;
    if (strcmp(s, bf16) == 0) return DTYPE_BF16;
    if (f16 && strcmp(s, f16) == 0) return DTYPE_F16;
    if (f16) die("option %s: \"%s\" is not %s, %s or %s", name, s, f32, bf16, f16);
    die("option %s: \"%s\" is not %s or %s", name, s, f32, bf16);
}

DType cli_weights_dtype(const CliSpec *spec, const char *model_dir) {
    if (!cli_str(spec, "--dtype")) return decoder_file_dtype(model_dir);
    return cli_dtype(spec, "--dtype", "f32", "bf16", NULL);
}

DType cli_kv_dtype(const CliSpec *spec) {
    const char *s = cli_str(spec, "--kv-cache-dtype");
    if (!strcmp(s, "auto") || !strcmp(s, "fp32")) return DTYPE_F32;
    if (!strcmp(s, "bf16")) return DTYPE_BF16;
    die("option --kv-cache-dtype: \"%s\" is not auto, fp32 or bf16", s);
}

const Backend *cli_load_model(const CliSpec *spec, const char *model_dir, Decoder *m, Lora *lora, DecoderQ8 *q8,
                              int kinds) {
    const char *dev = cli_str(spec, "--device"), *adapter = cli_str(spec, "--adapter"), *dts = cli_str(spec, "--dtype");
    dir_check("option --model", model_dir);
    if (adapter) dir_check("option --adapter", adapter);
    int int8 = q8 && dts && strcmp(dts, "int8") == 0;
    if (adapter && dev && strcmp(dev, "cpu") != 0)
        die("--adapter: LoRA adapters run on the CPU only (--device %s)", dev);
    const Backend *be = backend_open(dev ? dev : "cpu", "--device");
    DType dt = be->on_device || int8 ? DTYPE_BF16 : cli_weights_dtype(spec, model_dir);
    if (be->on_device && dts && (int8 || cli_dtype(spec, "--dtype", "f32", "bf16", NULL) != DTYPE_BF16))
        die("--dtype %s: --device %s computes in bf16 (fp32 and int8 weights run on the CPU)", dts, dev);
    DecoderConfig c;
    decoder_config_read(&c, model_dir);
    if (c.score_labels && !(kinds & CLI_MODEL_RM)) decoder_config_load_vl(&c, model_dir);  // refuses them in one line
    if (c.vl && !(kinds & CLI_MODEL_VL)) decoder_config_load(&c, model_dir);
    decoder_load_config(m, model_dir, dt, &c);
    decoder_to_backend(m, be);
    memset(lora, 0, sizeof *lora);
    if (adapter) {
        lora_load(lora, &m->cfg, adapter);
        lora_attach(m, lora);
    }
    if (q8) memset(q8, 0, sizeof *q8);
    if (int8) {  // decode's copies; prefill reads the bf16 slab
        decoder_q8_init(q8, m, "--dtype int8");
        decoder_q8_quantize(q8, m);
        m->q8 = q8;
    }
    return be;
}

TrainerLora cli_lora(const CliSpec *spec, uint64_t seed) {
    LoraSpec ls = {.rank = cli_int(spec, "--lora-rank", 0, 65536), .alpha = cli_double(spec, "--lora-alpha", -1e6, 1e6)};
    TrainerLora lo = {.spec = ls,
                      .base_dtype = cli_dtype(spec, "--lora-base-dtype", "f32", "bf16", NULL),
                      .adapter = cli_str(spec, "--adapter"), .seed = seed};
    if (lo.spec.alpha == 0) die("option --lora-alpha: must not be 0");
    char *list = xstrdup(cli_str(spec, "--lora-targets")), *save = NULL;
    for (char *name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save))
        if (!lora_targets_add(&lo.spec.targets, name))
            die("option --lora-targets: unknown module \"%s\" (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                "down_proj or all-linear)", name);
    free(list);
    if (!lo.spec.targets) die("option --lora-targets: no module named");
    if (lo.adapter) lora_spec_from_adapter(&lo.spec, lo.adapter, "option --lora-rank", 0, "");
    return lo;
}
