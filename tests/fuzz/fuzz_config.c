// The training config: a YAML file, then dotted key=value overrides (one per line after a separator
// line, fuzz.h), loaded and validated as `grpo train --config FILE KEY=VALUE...` does, then printed.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "train/grpo/config.h"

#define MAX_OVERRIDES 16

typedef struct {
    char *path;
    char *overrides[MAX_OVERRIDES];
    int n;
} Input;

static void body(const uint8_t *data, size_t size, void *ctx) {
    (void)data, (void)size;
    Input *in = ctx;
    GrpoConfig c;
    grpo_config_defaults(&c);
    grpo_config_load(&c, in->path, in->overrides, in->n);
    grpo_config_print_json(&c, stdout);
    grpo_config_free(&c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *parts[2];
    size_t lens[2];
    fuzz_split(data, size, parts, lens, 2);
    Input in = {fuzz_write("config.yaml", parts[0], lens[0]), {0}, 0};
    for (char *line = parts[1], *next; line && *line && in.n < MAX_OVERRIDES; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        in.overrides[in.n++] = line;
    }
    fuzz_run(body, data, size, &in);
    free(in.path);
    fuzz_parts_free(parts, 2);
    return 0;
}
