// The JSONL formats, over a tiny model (fuzz_model). FUZZ_JSONL (set per executable by CMake) picks one:
//   0 `grpo score`'s stdin and 1 `grpo generate --jsonl`'s (3 new tokens, 2 samples), run through the
//   commands themselves; 2 an SFT data set (sft_data_load: text and id lines); 3 a GRPO prompt set
//   (prompt_data_load, chat template on).
#include <stdio.h>
#include <stdlib.h>

#include "cli/commands.h"
#include "fuzz.h"
#include "model/decoder.h"
#include "text/tokenizer.h"
#include "train/prompt_data.h"
#include "train/sft_data.h"

static char *path;  // the input, as a file; also stdin

static void body(const uint8_t *data, size_t size, void *ctx) {
    (void)data, (void)size, (void)ctx;
    char model[256];
    snprintf(model, sizeof model, "%s", fuzz_model());
#if FUZZ_JSONL == 0
    char *argv[] = {"score", "--model", model, NULL};
    cmd_score(3, argv);
#elif FUZZ_JSONL == 1
    char *argv[] = {"generate", "--model", model, "--jsonl", "--max-new-tokens", "3", "--n", "2", NULL};
    cmd_generate(8, argv);
#elif FUZZ_JSONL == 2
    DecoderConfig c;
    decoder_config_load(&c, model);
    SftData d;
    sft_data_load(&d, path, "fuzz input", model, &c, NULL, 48, 0);
    sft_data_free(&d);
#else
    Tokenizer tok;
    tokenizer_load(&tok, model);
    PromptData d;
    PromptDataOptions po = {.prompt_key = "prompt", .answer_key = "answer", .tok = &tok, .chat_template = 1,
                            .max_prompt_length = 48};
    prompt_data_load(&d, (const char *const *)&path, 1, "fuzz input", &po);
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
    path = fuzz_write("input.jsonl", data, size);
    fuzz_stdin(path);
    fuzz_run(body, data, size, NULL);
    return 0;
}
