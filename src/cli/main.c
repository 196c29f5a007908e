// grpo: GRPO post-training for Qwen2-family models. Dispatches to one subcommand.
#define _POSIX_C_SOURCE 200809L  // setenv
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"
#include "cli/commands.h"
#include "cli/demo_tools.h"

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
    {"serve", cmd_serve, "OpenAI-compatible HTTP server (completions, chat, tools, streaming), continuous batching"},
    {"sft", cmd_sft, "supervised fine-tuning: AdamW, accumulation, clipping, mixed precision, checkpoints"},
    {"merge", cmd_merge, "merge a PEFT LoRA adapter into its base: a plain Hugging Face model"},
    {"export", cmd_export, "a model (an adapter merged in) as one GGUF file for llama.cpp, Ollama, LM Studio"},
    {"tokenize", cmd_tokenize, "text <-> token ids (a Hugging Face tokenizer.json), chat-template rendering"},
    {"render", cmd_render, "a model's chat template (Jinja) over conversations: what the model is fed"},
    {"doctor", cmd_doctor, "system preflight: THP, NUMA, ulimits, CPU, threads, memory, disk, MPI, PCIe links, GPUs"},
    {"report", cmd_report, "one self-contained HTML file with the charts, config and samples of a run"},
};

// OpenMP threads that finish a parallel region spin before they sleep. libgomp's default spin (300,000
// rounds) keeps a waiting thread on its core far longer than a decode step's gaps between regions, so on
// a machine where another process wants a core, every region's join waits for a descheduled thread
// (decode at batch 1 fell to a quarter of its quiet speed). A short spin (1,000 rounds, tens of
// microseconds) costs nothing measurable on a quiet machine and keeps about half the speed beside a
// competing busy loop. libgomp reads the setting once, while it is loaded (before main and before any
// .preinit_array hook), so the process sets it and executes itself again. A user's own OMP_WAIT_POLICY
// or GOMP_SPINCOUNT wins; if the exec fails, libgomp's default stays.
static void omp_wait_default(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    if (setenv("GOMP_SPINCOUNT", "1000", 1) != 0) return;
    execv("/proc/self/exe", argv);
}

static void usage(FILE *f) {
    fprintf(f, "usage: grpo <command> [options]   (grpo <command> --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].about);
}

int main(int argc, char **argv) {
    omp_wait_default(argv);
    // Past a file-size limit (ulimit -f, a quota of sorts) a write then fails with EFBIG and is reported
    // like a full disk, naming the file; the default action of SIGXFSZ would kill us mid-write.
    signal(SIGXFSZ, SIG_IGN);
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "demo-tool") == 0) return demo_tool_main(argc - 1, argv + 1);  // --demo-tools' tool
    if (strcmp(argv[1], "--version") == 0) {
        printf("grpo %s\n", GRPO_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
    die("unknown command \"%s\" (see grpo --help)", argv[1]);
}
