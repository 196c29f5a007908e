// SFT datasets: JSONL lines of {"prompt_ids", "completion_ids"} (used exactly as given) or
// {"prompt", "completion"} (the prompt as one user turn of the chat template plus the generation
// prompt; the completion followed by the tokenizer's eos token).
#pragma once
#include <stdint.h>

#include "model/qwen2.h"

typedef struct {
    int32_t *ids;        // prompt then completion, len tokens
    int64_t len;
    int64_t prompt_len;  // the first prompt_len tokens are the prompt
    int64_t line;        // 1-based line of the file
} SftSample;

typedef struct {
    SftSample *s;         // n samples, in file order
    int64_t n;
    int64_t n_truncated;  // samples cut to max_length
    char *path;
} SftData;

// Dies with "FILE:LINE: ..." on any malformed line. key: the option that named the file.
void sft_data_load(SftData *d, const char *path, const char *key, const char *model_dir, const Qwen2Config *c,
                   int64_t max_length);
void sft_data_free(SftData *d);
