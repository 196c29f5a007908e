// Chat templates: the model's own Jinja template (text/jinja.h), found as transformers finds it and rendered
// over a conversation as apply_chat_template renders it: the variables messages, tools (absent when none),
// add_generation_prompt, bos_token / eos_token from tokenizer_config.json, and any keyword the run or the
// request gives (data.chat_template_kwargs, serve's chat_template_kwargs, enable_thinking).
// Message content may be a string or a list of parts ({"type": "text", "text"}, {"type": "image", ...}):
// a template that loops over content gets the parts as given; one that does not gets them joined into a
// string (text parts with "\n" between them, each image as the model's image text), as vLLM does.
#pragma once
#include <cjson/cJSON.h>
#include <stdint.h>

#include "base/util.h"
#include "text/jinja.h"

typedef struct {
    JinjaTemplate *tpl;       // NULL: the model has no chat template
    char *source;             // tpl's text (what an exported model carries)
    JinjaTemplate *tool_tpl;  // the named list's "tool_use", rendered when tools are given (NULL: none)
    char *path;               // the file it came from (messages name it)
    cJSON *vars;              // bos_token, eos_token and the run's keywords, given to every render
    int parts;                // it loops over message content (takes content parts as they are)
    int tool_calls;           // it writes hermes <tool_call> blocks, what the multi-turn rollout parses
    const char *image_text;   // a vision-language model's text for an image in joined parts (NULL: none)
} ChatTemplate;

// The template of a model directory: chat_template.jinja, else chat_template.json's "chat_template", else
// config's "chat_template" (a string, or [{"name", "template"}] with "default" and maybe "tool_use"); config:
// tokenizer_config.json parsed (NULL when absent), read from config_path. Dies naming the file on a template
// that does not parse. Nothing found: c->tpl is NULL.
void chat_template_load(ChatTemplate *c, const char *dir, const cJSON *config, const char *config_path);
// The text of a tokenizer_config.json's "bos_token"-like entry: a string or {"content": string}; NULL if none.
const char *chat_config_token(const cJSON *config, const char *key);
// A template file of its own (a .jinja file).
void chat_template_load_file(ChatTemplate *c, const char *path);
void chat_template_free(ChatTemplate *c);
// Gives every render the variable key (value is taken; it replaces an earlier one).
void chat_template_set(ChatTemplate *c, const char *key, cJSON *value);
// Gives every render each key of kwargs (a JSON object; copied). where names it in errors.
void chat_template_set_all(ChatTemplate *c, const cJSON *kwargs, const char *where);

// Appends the rendering of msgs (a JSON array; strings' U+0000 as nul_sentinel) with tools (an array, or
// NULL/null/[] for none) and kwargs (an object of further variables, or NULL). Returns NULL, or what is wrong
// (malloc'd): a message that is not {"role": string, ...}, a part the template cannot take, or the template's
// own error (raise_exception's message).
char *chat_render(const ChatTemplate *c, const cJSON *msgs, const cJSON *tools, const cJSON *kwargs,
                  uint32_t nul_sentinel, int add_generation_prompt, Buf *out);
// The same, dying with "where: ..." on an error.
void chat_render_or_die(const ChatTemplate *c, const cJSON *msgs, const cJSON *tools, const cJSON *kwargs,
                        uint32_t nul_sentinel, int add_generation_prompt, Buf *out, const char *where);
// A request {"messages", "tools", "add_generation_prompt", and any other key as a template variable}, as
// `grpo render` and `grpo tokenize --jsonl` read one: appends its rendering, or dies with "where: ...".
void chat_render_request(const ChatTemplate *c, const cJSON *req, uint32_t nul_sentinel, Buf *out,
                         const char *where);
// The text that follows an assistant turn ending in a tool call, in multi-turn rollout: the turn's end, the
// tool's response as the template renders one role "tool" message after it, and the next assistant prompt.
// Rendered by the template itself (a user turn, an assistant turn, the tool message; what follows the
// assistant's content). Returns NULL, or the template's error.
char *chat_tool_response_turn(const ChatTemplate *c, const cJSON *tools, const char *content, size_t n,
                              Buf *out);
// The tool call a model's turn ends with, as the hermes parsers of vLLM and verl read it: the JSON between
// the last "<tool_call>" and the "</tool_call>" text ends with (whitespace around it allowed), an object
// {"name": string, "arguments": object} (duplicate keys keep the last, U+0000 as json_parse_line). Returns
// that object (the caller cJSON_Deletes it), or NULL with *error saying why (a static string): no opening
// tag, not JSON, no name, arguments not an object.
cJSON *chat_parse_tool_call(const char *text, size_t n, uint32_t *nul_sentinel, const char **error);
