// `grpo report` on a run directory: the input is metrics.jsonl, then samples.jsonl and config.yaml after
// separator lines (fuzz.h; each absent when its part is empty).
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "cli/commands.h"
#include "fuzz.h"

static void body(const uint8_t *data, size_t size, void *ctx) {
    (void)data, (void)size, (void)ctx;
    char dir[256];
    snprintf(dir, sizeof dir, "%s/run", fuzz_dir());
    char *argv[] = {"report", dir, NULL};
    cmd_report(2, argv);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_init();
    char dir[256];
    snprintf(dir, sizeof dir, "%s/run", fuzz_dir());
    if (mkdir(dir, 0700) != 0) fuzz_fail("cannot make %s", dir);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *names[] = {"run/metrics.jsonl", "run/samples.jsonl", "run/config.yaml"};
    char *parts[3];
    size_t lens[3];
    fuzz_split(data, size, parts, lens, 3);
    for (int i = 0; i < 3; i++) {
        char *p = fuzz_write(names[i], parts[i], lens[i]);
        if (i > 0 && lens[i] == 0) remove(p);
        free(p);
    }
    fuzz_run(body, data, size, NULL);
    fuzz_parts_free(parts, 3);
    return 0;
}
