// The tools of multi-turn rollout (`rollout.multi_turn.tools_file`, `grpo generate --tools FILE`).
//
// A tools file is a JSON array of OpenAI function schemas, each with the command that runs it:
//   [{"name": "multiply", "description": "Multiply two integers.",
//     "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, ...}, "required": [...]},
//     "command": "python3 multiply.py", "timeout_s": 5}]
// ({"type": "function", "function": {"name", "description", "parameters"}, "command": ...} too; timeout_s is
// optional). The chat template lists the schemas, as {"type": "function", "function": {...}}.
//
// Each tool is an external JSONL program (base/program.h: own process group, memory limit, per-call
// timeout, leftovers killed, failures counted), started `concurrency` times so that the calls of different
// samples run side by side. One request line {"name": ..., "arguments": {...}, "tools_kwargs": {...}} (the
// sample's extra_info.tools_kwargs entry for this tool, {} when none), one reply line {"content": "..."}.
// A malformed call, an unknown tool, a crash, a timeout or a reply without a string "content" gives an
// error text as the tool's response ("error: ..."), counted; nothing stops the run.
#pragma once
#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "base/program.h"
#include "rollout/rollout.h"
#include "text/tokenizer.h"

typedef struct {
    char *name;
    Program *procs;  // ToolSet.concurrency of them
} Tool;

typedef struct {
    Tool *tools;
    int n, concurrency;
    cJSON *schemas;  // [{"type": "function", "function": {...}}, ...], for the chat template
    int64_t calls, errors;
    double seconds;  // wall time inside toolset_run
} ToolSet;

typedef struct {
    const char *text;     // the model's turn, ending in </tool_call>
    size_t n;
    const cJSON *kwargs;  // the sample's tools_kwargs ({tool name: {...}}), or NULL
    char *content;        // out (malloc'd): the tool's response, or "error: ..." when the call failed
    int error;            // out: 1 when the call failed
} ToolCall;

// Loads the tools file and starts each tool `concurrency` times. key names the option or config key that gave
// the path (errors say "KEY: PATH: ..."). Dies on a malformed file.
void toolset_load(ToolSet *ts, const char *path, const char *key, int concurrency, double timeout_s,
                  double memory_mb);
// Runs the n calls, up to `concurrency` at a time, and fills their content and error.
void toolset_run(ToolSet *ts, ToolCall *calls, int n);
void toolset_free(ToolSet *ts);

// RolloutConfig.tool_fn over a ToolSet (tool_user: a ToolHook): runs the paused samples' calls side by side
// and answers each with the tokens of chat_tool_response_turn(its tool's content).
typedef struct {
    ToolSet *tools;
    Tokenizer *tok;
    const cJSON *const *kwargs;  // per prompt: its tools_kwargs, or NULL for none at all
} ToolHook;
void tools_rollout_turns(void *tool_hook, RolloutToolTurn *turns, int n);
// Dies naming key when the tokenizer's chat template cannot render a tool's response after a call.
void tools_check_template(const ToolHook *h, const char *key);
