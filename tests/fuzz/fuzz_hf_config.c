// config.json and generation_config.json of a model directory: the input is config.json, then
// generation_config.json after a separator line (fuzz.h), absent when the input has no separator.
#define _GNU_SOURCE  // memmem
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "model/decoder.h"

static void body(const uint8_t *data, size_t size, void *ctx) {
    (void)data, (void)size, (void)ctx;
    DecoderConfig c;
    decoder_config_load(&c, fuzz_dir());
    int32_t stop[16];
    decoder_stop_ids(fuzz_dir(), stop, 16);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *parts[2];
    size_t lens[2];
    fuzz_split(data, size, parts, lens, 2);
    free(fuzz_write("config.json", parts[0], lens[0]));
    char *gen = fuzz_write("generation_config.json", parts[1], lens[1]);
    if (!memmem(data, size, FUZZ_SEP, strlen(FUZZ_SEP))) remove(gen);
    free(gen);
    fuzz_run(body, data, size, NULL);
    fuzz_parts_free(parts, 2);
    return 0;
}
