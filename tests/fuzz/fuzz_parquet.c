// parquet: a Parquet file read through the data loaders' reader (io/records.h): every row of every column,
// then the same file as a GRPO prompt set (prompt_data_load on the tiny model, verl's keys: a message-list
// prompt and a dotted answer key).
#include <stdlib.h>

#include "fuzz.h"
#include "io/records.h"
#include "text/tokenizer.h"
#include "train/prompt_data.h"

static char *path;

static void body(const uint8_t *data, size_t size, void *ctx) {
    (void)data, (void)size, (void)ctx;
    RecordReader r;
    records_open(&r, path, "fuzz input", NULL, 0);
    for (cJSON *row; (row = records_next(&r));) cJSON_Delete(row);
    records_close(&r);
    Tokenizer tok;
    tokenizer_load(&tok, fuzz_model());
    PromptData d;
    PromptDataOptions po = {.prompt_key = "prompt", .answer_key = "reward_model.ground_truth", .tok = &tok,
                            .chat_template = 1, .max_prompt_length = 48, .filter_overlong = 1};
    prompt_data_load(&d, (const char *const *)&path, 1, "fuzz input", &po);
    prompt_data_free(&d);
    tokenizer_free(&tok);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_init();
    fuzz_model();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    free(path);
    path = fuzz_write("input.parquet", data, size);
    fuzz_run(body, data, size, NULL);
    return 0;
}
