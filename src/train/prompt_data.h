// Prompt datasets for GRPO: rows of JSONL or Parquet files (io/records.h) with a prompt and a ground-truth
// answer under configurable keys (dotted for nested fields: verl's `reward_model.ground_truth`). The prompt
// is a string, rendered as one user turn of the chat template with the generation prompt (or used raw),
// or a list of chat messages ({"role", "content"}: verl's and TRL's conversational rows), rendered whole by
// the chat template, system turns included.
// Vision-language rows (verl's and EasyR1's geometry3k layout): `images`, a list of image files (paths
// relative to the data file, or {"path": ...}, or a Parquet row's {"bytes": ...}), each standing where the
// prompt has an "<image>"; or messages whose content is a list of parts ({"type": "image", "image": path}).
#pragma once
#include <cjson/cJSON.h>
#include <stdint.h>

#include "model/vl.h"
#include "text/tokenizer.h"

typedef struct {
    char *prompt, *answer;  // NUL-terminated UTF-8; a numeric answer is kept as its JSON text. A message-list
                            // prompt's `prompt` is its last user message (what reward programs get as prompt)
    char *messages;         // a message-list prompt as JSON (multi-turn rollouts start from it), else NULL
    int32_t *ids;           // rendered prompt tokens
    int64_t len;            // tokens
    int64_t line;           // 1-based line (JSONL) or row (Parquet) of its file
    int file;               // which of the files
    int parquet;            // that file is Parquet (line is a row)
    cJSON *tools_kwargs;    // verl's extra_info.tools_kwargs (or a top-level "tools_kwargs"), NULL when none
    char *data_source;      // the row's "data_source" (verl), NULL when it has none
    char *extra_info;       // the row's "extra_info" as JSON (for reward programs), NULL when it has none
    VlImage *images;        // a vision-language prompt's images, in the order of their pads in ids
    int n_images;
} PromptSample;

typedef struct {
    PromptSample *s;     // n samples, in file order
    int64_t n;
    int64_t n_filtered;  // prompts over max_prompt_length skipped (filter_overlong)
} PromptData;

typedef struct {
    const char *prompt_key, *answer_key;  // dotted paths into a row
    Tokenizer *tok;
    int chat_template;       // render prompts with the tokenizer's chat template
    const cJSON *tools;      // the tools' schemas the chat template lists (multi-turn rollout), or NULL
    int64_t max_prompt_length;
    int filter_overlong;     // skip (and count) longer prompts, as verl's filter_overlong_prompts; else die
    const char *image_key;   // the row's list of images (data.image_key, "images")
    const VlProcessor *vl;   // a vision-language model's image processor (NULL: a text model; rows with
                             // images are refused)
    int32_t image_pad;       // with vl: the image pad token
} PromptDataOptions;

// Reads the files in order. Dies with "FILE:LINE: ..." (Parquet: "FILE: row N: ...") on any bad row.
// key: the option or config key that named the files (for "data.val_file: cannot open ...").
void prompt_data_load(PromptData *d, const char *const *paths, int n_paths, const char *key,
                      const PromptDataOptions *o);
void prompt_data_free(PromptData *d);
