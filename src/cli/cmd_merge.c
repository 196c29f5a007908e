// grpo merge: a base model plus a LoRA adapter, written as one plain Hugging Face model.
#include <stdio.h>
#include <stdlib.h>

#include "base/util.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "model/lora.h"
#include "model/decoder.h"
#include "train/checkpoint.h"

int cmd_merge(int argc, char **argv) {
    CliOpt opts[] = {
        {"--model", "DIR", "the base model (Hugging Face directory)", NULL, 1},
        {"--adapter", "DIR", "a PEFT LoRA adapter of that base (adapter_config.json, adapter_model.safetensors)", NULL, 1},
        {"--out", "DIR", "where the merged model goes (config.json, model.safetensors, tokenizer files)", NULL, 1},
        {"--dtype", "f32|bf16", "dtype of the merged weights file", "f32", 0},
        {"--force", NULL, "overwrite a model already in --out", NULL, 0},
    };
    CliSpec spec = {"grpo merge --model BASE --adapter DIR --out MERGED [--dtype f32|bf16]",
                    "Adds scale * B A (scale = lora_alpha / r) to every adapted weight of the base, in fp32,\n"
                    "and writes the result as a plain model that loads without the adapter (here or in\n"
                    "transformers).",
                    opts, sizeof opts / sizeof opts[0]};
    cli_parse(&spec, argc, argv);
    const char *base = cli_str(&spec, "--model"), *adapter = cli_str(&spec, "--adapter"), *out = cli_str(&spec, "--out");
    dir_check("option --model", base);
    dir_check("option --adapter", adapter);
    DType dtype = cli_dtype(&spec, "--dtype", "f32", "bf16", NULL);
    char *cfg = path_join(out, "config.json");
    if (!cli_str(&spec, "--force") && file_exists(cfg)) die("%s already holds a model; choose another --out or pass --force", out);
    free(cfg);
    Decoder m;
    decoder_load(&m, base, DTYPE_F32);
    Lora lora;
    lora_load(&lora, &m.cfg, adapter);
    lora_merge(&m, &lora);
    dir_create(out);
    copy_model_extras(base, out);
    decoder_save(&m, out, dtype, NULL);
    fprintf(stderr, "grpo merge: wrote %s (%s + %s, r = %lld, scale %g)\n", out, base, adapter,
            (long long)lora.spec.rank, (double)lora.scale);
    lora_free(&lora);
    decoder_free(&m);
    return 0;
}
