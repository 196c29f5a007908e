// Qwen's ChatML chat templates, rendered natively (no Jinja):
//   <|im_start|>{role}\n{content}<|im_end|>\n ... [<|im_start|>assistant\n]
// Qwen2.5: when the conversation does not open with a system message, the template's default system
// prompt ("You are Qwen, created by Alibaba Cloud. ...") comes first.
// Qwen3 (a template with enable_thinking): assistant turns after the last user turn keep their reasoning
// as <think>\nreasoning\n</think>\n\n before the answer (the last one always gets the block), earlier
// ones lose it; reasoning is the message's reasoning_content, else what content holds before </think>;
// with t->no_thinking the assistant prompt ends in an empty think block, as enable_thinking=false.
#pragma once
#include <cjson/cJSON.h>
#include <stdint.h>

#include "base/util.h"
#include "text/tokenizer.h"

typedef struct {
    const char *role;  // "system", "user" or "assistant"
    const char *content;
    size_t content_len;     // content may hold NUL bytes
    const char *reasoning;  // reasoning_content, NULL when the message has none
    size_t reasoning_len;
} ChatMessage;

// Appends the rendering to out. Returns -1 (and *bad = the message's index) for an unknown role.
int chat_render(const Tokenizer *t, const ChatMessage *msgs, int n, int add_generation_prompt, Buf *out, int *bad);
// The same from a JSON array of {"role", "content"} (a JSONL line's "messages"; nul_sentinel from
// json_parse_line). Dies naming `where` when the tokenizer has no chat template or a message is bad.
void chat_render_json(const Tokenizer *t, const cJSON *msgs, uint32_t nul_sentinel, int add_generation_prompt,
                      Buf *out, const char *where);
// Tokenizes a prompt, appending to ids: as a user turn of t's chat template followed by the
// assistant prompt when `chat` is set and t has a template, else as it is. Returns 0, or -1 for
// invalid UTF-8 (*bad_offset: the byte, in the rendered text).
int chat_encode_prompt(Tokenizer *t, const char *text, size_t n, int chat, IdList *ids, size_t *bad_offset);
