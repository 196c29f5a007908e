// The JSONL that `grpo score` and `grpo generate --jsonl` read on stdin, run through the commands
// themselves on a tiny model (fuzz_model). FUZZ_COMMAND (set per executable by CMake) picks the command.
#include <stdio.h>
#include <stdlib.h>

#include "cli/commands.h"
#include "fuzz.h"

static char *stdin_path;

static void body(const uint8_t *data, size_t size, void *ctx) {
    (void)data, (void)size, (void)ctx;
    char model[256];
    snprintf(model, sizeof model, "%s", fuzz_model());
#if FUZZ_COMMAND == 0
    char *argv[] = {"score", "--model", model, NULL};
    cmd_score(3, argv);
#else
    char *argv[] = {"generate", "--model", model, "--jsonl", "--max-new-tokens", "3", "--n", "2", NULL};
    cmd_generate(8, argv);
#endif
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_init();
    fuzz_model();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    free(stdin_path);
    stdin_path = fuzz_write("stdin.jsonl", data, size);
    fuzz_stdin(stdin_path);
    fuzz_run(body, data, size, NULL);
    return 0;
}
