// grpo sft: supervised fine-tuning on prompt/completion pairs.
#include <stdint.h>
#include <string.h>

#include "base/util.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "train/sft.h"

int cmd_sft(int argc, char **argv) {
    CliOpt opts[] = {
        {"--model", "DIR", "Hugging Face model directory to start from", NULL, 1},
        {"--data", "FILE", "JSONL or Parquet rows: {\"prompt\", \"completion\"} (strings or message lists), "
         "{\"messages\"} or {\"prompt_ids\", \"completion_ids\"}", NULL, 1},
        {"--out", "DIR", "where the trained model, metrics.jsonl and checkpoints go", NULL, 1},
        {"--steps", "N", "optimiser steps (default: one epoch)", NULL, 0},
        {"--lr", "X", "peak learning rate", "2e-5", 0},
        {"--lr-schedule", "NAME", "constant, linear or cosine (after warmup; Hugging Face's schedules)", "constant", 0},
        {"--warmup", "S", "linear warmup steps", "0", 0},
        {"--batch-size", "B", "samples per optimiser step", "8", 0},
        {"--micro-batch-size", "b", "samples per forward/backward (gradient accumulation; default: B)", NULL, 0},
        {"--clip", "C", "clip the global gradient norm to C (0: off)", "1.0", 0},
        {"--weight-decay", "W", "AdamW decoupled weight decay (not on biases and norms)", "0", 0},
        {"--beta1", "X", "AdamW beta1", "0.9", 0},
        {"--beta2", "X", "AdamW beta2", "0.999", 0},
        {"--adam-eps", "X", "AdamW epsilon", "1e-8", 0},
        {"--seed", "S", "seed of the data order", "0", 0},
        {"--no-shuffle", NULL, "take the data in file order", NULL, 0},
        {"--max-length", "L", "cut samples to L tokens (default: max_position_embeddings)", NULL, 0},
        {"--filter-overlong-prompts", NULL, "skip (and count) rows whose prompt alone reaches --max-length, "
         "instead of stopping with an error", NULL, 0},
        {"--min-pixels", "N", "vision-language models: the image processor's min_pixels (default: the model's)",
         NULL, 0},
        {"--max-pixels", "N", "vision-language models: the image processor's max_pixels (default: the model's)",
         NULL, 0},
        {"--device", "cpu|cuda[:N]|emu", "where training runs: the CPU, a GPU, or the emulated device (a device "
                                         "computes in bf16: --precision bf16, or LoRA on a bf16 base)", "cpu", 0},
        {"--offload-params", NULL, "a device's full fine-tuning: the fp32 master weights, Adam moments and AdamW "
         "on the host (the device holds the bf16 compute copy and the gradients)", NULL, 0},
        {"--precision", "P", "compute weights: fp32, bf16 or fp16 (fp32 master weights either way)", "fp32", 0},
        {"--loss-scale", "X", "fp16: initial loss scale", "1024", 0},
        {"--loss-scale-window", "N", "fp16: double the scale after N clean steps (0: static scale)", "1000", 0},
        {"--max-skips", "K", "stop after K consecutive steps skipped for non-finite loss or gradients", "5", 0},
        {"--recompute", NULL, "recompute each layer's activations in backward (less memory, ~1/3 more compute)", NULL, 0},
        {"--save-dtype", "f32|bf16", "dtype of saved model weights", "f32", 0},
        {"--save-every", "N", "write a checkpoint every N steps (0: only the final model)", "0", 0},
        {"--keep", "K", "keep the newest K checkpoints", "2", 0},
        {"--resume", NULL, "continue from the newest checkpoint in --out", NULL, 0},
        {"--force", NULL, "replace a previous run in --out (its checkpoints, model and metrics.jsonl)", NULL, 0},
        {"--zero", "0|1|2", "under mpirun: ZeRO stage (1: shard the Adam moments, 2: also reduce-scatter gradients)", "0", 0},
        {"--topk-ratio", "R", "top-k gradient compression: fraction of entries each rank sends per step (0: off)", "0", 0},
        {"--dist-timeout", "S", "under mpirun: seconds a collective may wait before the job ends (0: forever)", "600", 0},
        {"--pin-cpu", "none|block", "under mpirun: bind each rank to its block of CPUs", "none", 0},
        {"--lora-rank", "R", "train LoRA adapters of rank R on a frozen base (0: full fine-tuning)", "0", 0},
        {"--lora-alpha", "A", "LoRA: the adapters' output is scaled by A / R", "16", 0},
        {"--lora-targets", "LIST", "LoRA: comma-separated projections (q_proj,...,down_proj or q,k,v,o,gate,up,down)",
         "all-linear", 0},
        {"--lora-base-dtype", "f32|bf16", "LoRA: storage of the frozen base", "bf16", 0},
        {"--adapter", "DIR", "continue training this PEFT LoRA adapter (its adapter_config.json sets R, A and targets)",
         NULL, 0},
    };
    CliSpec spec = {"grpo sft --model DIR --data FILE.jsonl|FILE.parquet --out DIR2 [options]",
                    "Fine-tunes on prompt/completion pairs. The loss of a step is the mean of -log p over all\n"
                    "completion tokens of its batch; micro-batches accumulate to exactly that. Text lines get the\n"
                    "chat template (one user turn + generation prompt) and the tokenizer's eos after the completion;\n"
                    "*_ids lines are used as given.",
                    opts, sizeof opts / sizeof opts[0]};
    cli_parse(&spec, argc, argv);
    dir_check("option --model", cli_str(&spec, "--model"));
    if (cli_str(&spec, "--adapter")) dir_check("option --adapter", cli_str(&spec, "--adapter"));
    SftConfig c = {
        .model_dir = cli_str(&spec, "--model"),
        .data_path = cli_str(&spec, "--data"),
        .out_dir = cli_str(&spec, "--out"),
        .device = cli_str(&spec, "--device"),
        .steps = cli_str(&spec, "--steps") ? cli_int(&spec, "--steps", 1, INT32_MAX) : 0,
        .batch_size = cli_int(&spec, "--batch-size", 1, 1 << 20),
        .warmup = cli_int(&spec, "--warmup", 0, INT32_MAX),
        .save_every = cli_int(&spec, "--save-every", 0, INT32_MAX),
        .keep = cli_int(&spec, "--keep", 1, 1 << 20),
        .max_length = cli_str(&spec, "--max-length") ? cli_int(&spec, "--max-length", 2, 1 << 24) : 0,
        .max_skips = cli_int(&spec, "--max-skips", 1, INT32_MAX),
        .adam = {.lr = cli_double(&spec, "--lr", 0, 1e3), .beta1 = cli_double(&spec, "--beta1", 0, 0.999999),
                 .beta2 = cli_double(&spec, "--beta2", 0, 0.999999999), .eps = cli_double(&spec, "--adam-eps", 0, 1),
                 .weight_decay = cli_double(&spec, "--weight-decay", 0, 1e3)},
        .clip = cli_double(&spec, "--clip", 0, 1e30),
        .seed = (uint64_t)cli_int(&spec, "--seed", 0, INT64_MAX),
        .loss_scale = cli_double(&spec, "--loss-scale", 1e-30, 1e38),
        .loss_scale_window = cli_int(&spec, "--loss-scale-window", 0, INT32_MAX),
        .resume = cli_str(&spec, "--resume") != NULL,
        .force = cli_str(&spec, "--force") != NULL,
        .recompute = cli_str(&spec, "--recompute") != NULL,
        .offload_params = cli_str(&spec, "--offload-params") != NULL,
        .shuffle = cli_str(&spec, "--no-shuffle") == NULL,
        .filter_overlong = cli_str(&spec, "--filter-overlong-prompts") != NULL,
        .min_pixels = cli_str(&spec, "--min-pixels") ? cli_int(&spec, "--min-pixels", 1, INT64_C(1) << 40) : 0,
        .max_pixels = cli_str(&spec, "--max-pixels") ? cli_int(&spec, "--max-pixels", 1, INT64_C(1) << 40) : 0,
        .zero = (int)cli_int(&spec, "--zero", 0, 2),
        .topk_ratio = cli_double(&spec, "--topk-ratio", 0, 1),
        .dist_timeout_s = cli_double(&spec, "--dist-timeout", 0, 1e9),
    };
    c.micro_batch_size = cli_str(&spec, "--micro-batch-size") ? cli_int(&spec, "--micro-batch-size", 1, c.batch_size)
                                                              : c.batch_size;
    if (c.batch_size % c.micro_batch_size)
        die("option --micro-batch-size: %lld does not divide --batch-size %lld", (long long)c.micro_batch_size,
            (long long)c.batch_size);
    if (!lr_schedule_parse(cli_str(&spec, "--lr-schedule"), &c.schedule))
        die("option --lr-schedule: \"%s\" is not constant, linear or cosine", cli_str(&spec, "--lr-schedule"));
    c.precision = cli_dtype(&spec, "--precision", "fp32", "bf16", "fp16");
    c.save_dtype = cli_dtype(&spec, "--save-dtype", "f32", "bf16", NULL);
    const char *pin = cli_str(&spec, "--pin-cpu");
    if (strcmp(pin, "none") && strcmp(pin, "block")) die("option --pin-cpu: \"%s\" is not none or block", pin);
    c.pin_cpu = strcmp(pin, "block") == 0;
    c.lora = cli_lora(&spec, c.seed);
    if ((c.lora.spec.rank || c.lora.adapter) && c.precision != DTYPE_F32)
        die("option --precision: LoRA trains fp32 adapters on a base stored as --lora-base-dtype says; leave it fp32");
    sft_run(&c);
    return 0;
}
