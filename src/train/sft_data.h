// SFT datasets: JSONL or Parquet rows (io/records.h) of {"prompt_ids", "completion_ids"} (used exactly as
// given), {"prompt", "completion"} strings (the prompt as one user turn of the chat template plus the
// generation prompt; the completion followed by the tokenizer's eos token), or conversations: {"messages"}
// (verl's multi-turn SFT rows: the last message, the assistant's, is the completion) or TRL's conversational
// {"prompt": [messages], "completion": [messages]}: the completion is what the chat template's rendering of
// the whole conversation adds to the prompt's rendering with the generation prompt. For a vision-language
// model, text rows may have images in their prompts (train/vl_rows.h: an `images` list with "<image>"
// placeholders, or image content parts).
#pragma once
#include <stdint.h>

#include "model/decoder.h"
#include "model/vl.h"

typedef struct {
    int32_t *ids;        // prompt then completion, len tokens
    int64_t len;
    int64_t prompt_len;  // the first prompt_len tokens are the prompt
    int64_t line;        // 1-based line of the file
    VlImage *images;     // a vision-language sample's images (train/vl_rows.h's layout), in its prompt
    int n_images;
} SftSample;

typedef struct {
    SftSample *s;         // n samples, in file order
    int64_t n;
    int64_t n_truncated;  // samples cut to max_length
    int64_t n_filtered;   // samples skipped: the prompt alone reaches max_length (filter_overlong)
    char *path;
} SftData;

// Dies with "FILE:LINE: ..." ("FILE: row N: ..." for Parquet) on any malformed row. key: the option that
// named the file. filter_overlong: a row whose prompt alone reaches max_length is skipped and counted, else
// an error.
// vl: a vision-language model's image processor (NULL for a text model, whose rows with images are refused).
void sft_data_load(SftData *d, const char *path, const char *key, const char *model_dir, const DecoderConfig *c,
                   const VlProcessor *vl, int64_t max_length, int filter_overlong);
void sft_data_free(SftData *d);
