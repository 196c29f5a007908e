// Minimal "--name value" option parsing shared by the subcommands.
#pragma once
#include <stdint.h>

#include "base/dtype.h"
#include "model/lora.h"
#include "model/decoder.h"
#include "text/tokenizer.h"
#include "train/trainer.h"

typedef struct {
    const char *name;     // "--model"
    const char *metavar;  // "DIR"; NULL for a flag
    const char *help;
    const char *value;    // default (NULL: none); after parsing, the given value ("1" for a given flag)
    int required;
    int repeat;           // may be given many times: every value lands in values[0..n_values)
    const char **values;
    int n_values;
} CliOpt;

typedef struct {
    const char *usage;  // first line of --help, e.g. "grpo score --model DIR < in.jsonl > out.jsonl"
    const char *about;  // one paragraph
    CliOpt *opts;
    int n;
    int max_args;       // positional arguments allowed (0: none)
    char **args;        // after parsing: the positional arguments
    int n_args;
} CliSpec;

// Parses argv[1..argc) (the `values` of repeatable options point into argv); prints help and exits 0 on --help/-h; dies on unknown options,
// missing values and missing required options.
void cli_parse(CliSpec *spec, int argc, char **argv);
const char *cli_str(const CliSpec *spec, const char *name);
// Value of an integer / real option; dies naming the option when malformed or outside [lo, hi].
int64_t cli_int(const CliSpec *spec, const char *name, int64_t lo, int64_t hi);
double cli_double(const CliSpec *spec, const char *name, double lo, double hi);
const CliOpt *cli_opt(const CliSpec *spec, const char *name);
// A dtype option's value among the spellings given for F32, BF16 and F16 (f16 may be NULL: not offered);
// dies naming the option on any other value. The option must have a value (a default or given).
DType cli_dtype(const CliSpec *spec, const char *name, const char *f32, const char *bf16, const char *f16);
// The weights' dtype from option --dtype (f32 or bf16); without it, the checkpoint's in model_dir
// (decoder_file_dtype).
DType cli_weights_dtype(const CliSpec *spec, const char *model_dir);
// --kv-cache-dtype auto|fp32|bf16: the KV cache's elements (auto: fp32, as the forward's activations).
DType cli_kv_dtype(const CliSpec *spec);
// Loads model_dir onto the backend option --device names (default cpu): bf16 on a GPU, else as
// cli_weights_dtype says. Returns the backend (backend_close it after decoder_free).
// Loads --model onto --device in --dtype; with --adapter (when the spec has it) the PEFT LoRA adapter
// into *lora, attached to m (free it with lora_free; lora->params is NULL without one). q8: for commands that
// decode (generate, serve), where --dtype int8 loads bf16 weights and their int8 copies into *q8, attached
// to m (decoder_q8_free it; zeroed without); NULL: int8 is refused. kinds: CLI_MODEL_VL, the command takes
// images, so a Qwen2.5-VL model's language model loads (on the CPU); CLI_MODEL_RM, a reward model loads (its
// score head for lm_head); other such models are refused.
enum { CLI_MODEL_VL = 1, CLI_MODEL_RM = 2 };
const Backend *cli_load_model(const CliSpec *spec, const char *model_dir, Decoder *m, Lora *lora, DecoderQ8 *q8,
                              int kinds);
// The LoRA options of a training command (--lora-rank, --lora-alpha, --lora-targets, --lora-base-dtype,
// --adapter); rank 0 and no adapter: full fine-tuning.
TrainerLora cli_lora(const CliSpec *spec, uint64_t seed);
