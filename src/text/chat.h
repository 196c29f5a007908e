// Qwen's ChatML chat templates, rendered natively (no Jinja):
//   <|im_start|>{role}\n{content}<|im_end|>\n ... [<|im_start|>assistant\n]
// Qwen2.5: when the conversation does not open with a system message, the template's default system
// prompt ("You are Qwen, created by Alibaba Cloud. ...") comes first.
// Qwen3 (a template with enable_thinking): assistant turns after the last user turn keep their reasoning
// as <think>\nreasoning\n</think>\n\n before the answer (the last one always gets the block), earlier
// ones lose it; reasoning is the message's reasoning_content, else what content holds before </think>;
// with t->no_thinking the assistant prompt ends in an empty think block, as enable_thinking=false.
// Tools (both templates): the system turn lists them (`tool | tojson` each) and says how to call them;
// an assistant's tool_calls follow its content as hermes blocks
//   <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>
// and consecutive role "tool" messages share one user turn of <tool_response>\nCONTENT\n</tool_response>.
#pragma once
#include <cjson/cJSON.h>
#include <stdint.h>

#include "base/util.h"
#include "text/tokenizer.h"

typedef struct {
    const char *role;  // "system", "user", "assistant" or "tool"
    const char *content;
    size_t content_len;     // content may hold NUL bytes
    const char *reasoning;  // reasoning_content, NULL when the message has none
    size_t reasoning_len;
    const cJSON *tool_calls;  // an assistant's calls (chat_tool_call's forms), NULL or [] when none
    uint32_t nul_sentinel;    // of tool_calls' strings (json_parse_line), 0 when none
} ChatMessage;

// A tool call of a message's tool_calls, {"name", "arguments"} or OpenAI's {"function": {"name",
// "arguments"}, ...}: its name and arguments (an object, or a string rendered as the template does).
// Returns 0, or -1 when the call has no string name or no arguments.
int chat_tool_call(const cJSON *call, const char **name, const cJSON **arguments);
// The tools' part of the system turn, rendered once: "\n" and `tool | tojson` for each schema of the array
// (OpenAI's {"type": "function", "function": {"name", "description", "parameters"}}, as given).
// Appends nothing for an empty array.
void chat_tools_text(Buf *out, const cJSON *tools, uint32_t nul_sentinel);
// Appends the rendering to out. tools: chat_tools_text's, or NULL (or "") for a conversation without tools.
// Returns -1 (and *bad = the message's index) for an unknown role or a malformed tool call, or a tool
// message or call when t's template has none (t->tool_calls).
int chat_render(const Tokenizer *t, const ChatMessage *msgs, int n, const char *tools, int add_generation_prompt,
                Buf *out, int *bad);
// The same from a JSON array of {"role", "content"[, "reasoning_content"][, "tool_calls"]} (a JSONL line's
// "messages"; nul_sentinel from json_parse_line) and its "tools" (NULL when absent). Dies naming `where`
// when the tokenizer has no chat template (or none for tools) or a message is bad.
void chat_render_json(const Tokenizer *t, const cJSON *msgs, const cJSON *tools, uint32_t nul_sentinel,
                      int add_generation_prompt, Buf *out, const char *where);
// The same, returning an error message (malloc'd, no `where`) instead of dying; NULL when it rendered.
char *chat_render_json_try(const Tokenizer *t, const cJSON *msgs, const cJSON *tools, uint32_t nul_sentinel,
                           int add_generation_prompt, Buf *out);
// The same with the tools' part already rendered (chat_tools_text's, or NULL).
char *chat_render_messages_try(const Tokenizer *t, const cJSON *msgs, const char *tools, uint32_t nul_sentinel,
                               int add_generation_prompt, Buf *out);
// The tool call a model's turn ends with, as the hermes parsers of vLLM and verl read it: the JSON between
// the last "<tool_call>" and the "</tool_call>" text ends with (whitespace around it allowed), an object
// {"name": string, "arguments": object} (duplicate keys keep the last, U+0000 as json_parse_line). Returns
// that object (the caller cJSON_Deletes it), or NULL with *error saying why (a static string): no opening
// tag, not JSON, no name, arguments not an object.
cJSON *chat_parse_tool_call(const char *text, size_t n, uint32_t *nul_sentinel, const char **error);
// The text that follows an assistant turn ending in a tool call, in multi-turn rollout: the turn's end, the
// tool's response as the template renders one role "tool" message, and the next assistant prompt (as
// add_generation_prompt renders it). So the sequence stays what the template makes of the conversation.
void chat_tool_response_turn(const Tokenizer *t, const char *content, size_t n, Buf *out);
// Tokenizes a prompt, appending to ids: as a user turn of t's chat template followed by the
// assistant prompt when `chat` is set and t has a template (tools: chat_tools_text's, or NULL), else as
// it is. Returns 0, or -1 for invalid UTF-8 (*bad_offset: the byte, in the rendered text).
int chat_encode_prompt(Tokenizer *t, const char *text, size_t n, int chat, const char *tools, IdList *ids,
                       size_t *bad_offset);
