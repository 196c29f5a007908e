// grpo init: a randomly initialised model directory of a preset's family (config.json + model.safetensors).
#define _POSIX_C_SOURCE 200809L  // strndup
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "model/decoder.h"
#include "model/vl.h"
#include "text/tokenizer.h"

// Checks the tokenizer fits the model, then copies tokenizer.json and tokenizer_config.json.
static void copy_tokenizer(const char *path, const char *out, const DecoderConfig *c) {
    Tokenizer t;
    tokenizer_load(&t, path);
    if (t.n_ids > c->vocab) die("%s: %d token ids do not fit the model's vocab_size %lld", t.path, t.n_ids, (long long)c->vocab);
    char *dst = path_join(out, "tokenizer.json");
    file_copy(t.path, dst);
    free(dst);
    const char *slash = strrchr(t.path, '/');
    char *dir = slash ? strndup(t.path, (size_t)(slash - t.path)) : xstrdup(".");
    char *cfg = path_join(dir, "tokenizer_config.json");
    if (!dir) die("out of memory");
    if (file_exists(cfg)) {
        dst = path_join(out, "tokenizer_config.json");
        file_copy(cfg, dst);
        free(dst);
    }
    free(cfg);
    free(dir);
    tokenizer_free(&t);
}

int cmd_init(int argc, char **argv) {
    char *shapes = xprintf("model shape: %s; Qwen2.5-VL: %s", decoder_preset_names(), vl_preset_names());
    CliOpt opts[] = {
        {"--out", "DIR", "model directory to create", NULL, 1},
        {"--preset", "NAME", shapes, "tiny", 0},
        {"--seed", "S", "random seed", "0", 0},
        {"--dtype", "f32|bf16", "dtype of the weights file", "f32", 0},
        {"--tokenizer", "PATH", "copy this tokenizer.json (and the tokenizer_config.json beside it) into DIR", NULL, 0},
        {"--reward-model", NULL, "a reward model instead (...ForSequenceClassification: a score head of one label "
                                 "in place of lm_head)", NULL, 0},
        {"--force", NULL, "overwrite a model already in DIR", NULL, 0},
    };
    CliSpec spec = {"grpo init --out DIR [--preset NAME] [--seed S] [--dtype f32|bf16] [--tokenizer PATH] "
                    "[--reward-model] [--force]",
                    "Writes a model of the preset's family (Qwen2ForCausalLM, Qwen3ForCausalLM, LlamaForCausalLM,\n"
                    "MistralForCausalLM) with Hugging Face's initialisation (normal(0, initializer_range) weights,\n"
                    "zero biases, unit norms) as config.json + model.safetensors; the qwen2.5-vl presets write a\n"
                    "Qwen2.5-VL (Qwen2_5_VLForConditionalGeneration: a vision tower beside,\n"
                    "preprocessor_config.json).\n"
                    "--reward-model writes a reward model of the preset's shape (reward.reward_model.model_path).",
                    opts, sizeof opts / sizeof opts[0]};
    cli_parse(&spec, argc, argv);
    const char *out = cli_str(&spec, "--out"), *preset = cli_str(&spec, "--preset");
    uint64_t seed = (uint64_t)cli_int(&spec, "--seed", 0, INT64_MAX);
    DType dtype = cli_dtype(&spec, "--dtype", "f32", "bf16", NULL);
    DecoderConfig c;
    VisionConfig vc;
    int vl = vl_preset(preset, &c, &vc);
    if (!vl && !decoder_config_preset(&c, preset))
        die("option --preset: unknown preset \"%s\" (known: %s, %s)", preset, decoder_preset_names(), vl_preset_names());
    int rm = cli_str(&spec, "--reward-model") != NULL;
    if (rm && vl) die("option --reward-model: a reward model is a text model, not %s", preset);
    if (rm) c.score_labels = 1;

    dir_create(out);
    char *cfg = path_join(out, "config.json"), *weights = path_join(out, "model.safetensors");
    if (!cli_str(&spec, "--force") && (file_exists(cfg) || file_exists(weights)))
        die("%s already holds a model; choose another --out or pass --force", out);
    free(cfg);
    free(weights);

    if (cli_str(&spec, "--tokenizer")) copy_tokenizer(cli_str(&spec, "--tokenizer"), out, &c);
    size_t n_params = decoder_layout(&c, &(DecoderLayout){0});
    if (vl) {  // Qwen's vision_start, image_pad, vision_end; the published processor's max_pixels
        vl_write_random(out, &c, &vc, (const int32_t[3]){151652, 151655, 151653}, 12845056, seed, dtype);
        n_params += vision_weight_bytes(&vc) / sizeof(float);
    } else {
        Decoder m;
        decoder_build(&m, &c, DTYPE_F32);
        decoder_init_random(&m, seed);
        decoder_save(&m, out, dtype, NULL);
        decoder_free(&m);
    }
    char params[16];
    fmt_count(params, sizeof params, (double)n_params);
    fprintf(stderr, "grpo init: wrote %s (%s, %s parameters, %s)\n", out, preset, params,
            cli_str(&spec, "--dtype"));
    free(shapes);
    return 0;
}
