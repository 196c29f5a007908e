// Prompt datasets for GRPO: JSONL lines with a prompt and a ground-truth answer under configurable
// keys (prompt_key / answer_key; GSM8K's layout is question / answer). The prompt is rendered as one
// user turn of the chat template with the generation prompt, or used raw.
#pragma once
#include <cjson/cJSON.h>
#include <stdint.h>

#include "text/tokenizer.h"

typedef struct {
    char *prompt, *answer;  // NUL-terminated UTF-8; a numeric answer is kept as its JSON text
    int32_t *ids;           // rendered prompt tokens
    int64_t len;            // tokens
    int64_t line;           // 1-based line of the file
    cJSON *tools_kwargs;    // verl's extra_info.tools_kwargs (or a top-level "tools_kwargs"), NULL when none
} PromptSample;

typedef struct {
    PromptSample *s;  // n samples, in file order
    int64_t n;
} PromptData;

// Dies with "FILE:LINE: ..." on any bad line; prompts longer than max_prompt_length are an error.
// key: the option or config key that named the file (for "data.val_file: cannot open ...").
// tools: chat_tools_text's list for the system turn (multi-turn rollout), or NULL.
void prompt_data_load(PromptData *d, const char *path, const char *key, const char *prompt_key,
                      const char *answer_key, Tokenizer *tok, int chat_template, const char *tools,
                      int64_t max_prompt_length);
void prompt_data_free(PromptData *d);
