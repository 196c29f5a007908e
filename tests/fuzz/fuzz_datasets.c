// The training data sets, JSONL files: FUZZ_DATASET (set per executable by CMake) 0 is an SFT set
// (sft_data_load: prompt/completion text or ids), 1 a GRPO prompt set (prompt_data_load: prompt and
// answer, chat template on), both over the tiny model's tokenizer (fuzz_model).
#include <stdlib.h>

#include "fuzz.h"
#include "model/qwen2.h"
#include "text/tokenizer.h"
#include "train/prompt_data.h"
#include "train/sft_data.h"

static char *path;

static void body(const uint8_t *data, size_t size, void *ctx) {
    (void)data, (void)size, (void)ctx;
#if FUZZ_DATASET == 0
    Qwen2Config c;
    qwen2_config_load(&c, fuzz_model());
    SftData d;
    sft_data_load(&d, path, fuzz_model(), &c, 48);
    sft_data_free(&d);
#else
    Tokenizer tok;
    tokenizer_load(&tok, fuzz_model());
    PromptData d;
    prompt_data_load(&d, path, "prompt", "answer", &tok, 1, 48);
    prompt_data_free(&d);
    tokenizer_free(&tok);
#endif
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_init();
    fuzz_model();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    free(path);
    path = fuzz_write("data.jsonl", data, size);
    fuzz_run(body, data, size, NULL);
    return 0;
}
