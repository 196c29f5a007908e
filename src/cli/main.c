// grpo: GRPO post-training for Qwen2-family models. Dispatches to one subcommand.
#include <stdio.h>
#include <string.h>

#include "base/util.h"
#include "cli/commands.h"

#define GRPO_VERSION "0.1.0"

static const struct {
    const char *name;
    int (*run)(int, char **);
    const char *about;
} commands[] = {
    {"train", cmd_train, "GRPO: rollout, rewards, group advantages, clipped update + KL (YAML config + overrides)"},
    {"init", cmd_init, "write a randomly initialised model in Hugging Face layout"},
    {"score", cmd_score, "per-token log-probabilities of token sequences (JSONL in, JSONL out)"},
    {"generate", cmd_generate, "sample continuations: batched KV-cache decoding, temperature/top-k/top-p"},
    {"sft", cmd_sft, "supervised fine-tuning: AdamW, accumulation, clipping, mixed precision, checkpoints"},
    {"tokenize", cmd_tokenize, "text <-> token ids with a Hugging Face tokenizer.json, ChatML rendering"},
    {"doctor", cmd_doctor, "system preflight: THP, NUMA, ulimits, CPU, threads, memory, disk, MPI, PCIe links, GPUs"},
    {"report", cmd_report, "one self-contained HTML file with the charts, config and samples of a run"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: grpo <command> [options]   (grpo <command> --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].about);
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("grpo %s\n", GRPO_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
    die("unknown command \"%s\" (see grpo --help)", argv[1]);
}
