// The tool-use demo behind `grpo train --demo-tools`: multi-turn GRPO where the policy learns to call a tool.
//
//   task       "What is 123 * 456?" -> "The answer is 56088": products of two 3-digit numbers, which a tiny
//              model cannot compute but can copy from a `multiply` tool (this binary: `grpo demo-tool`).
//   tokenizer  the demo's byte-level BPE with the tools' system text, the call's and the response's fixed
//              pieces as added tokens, and a chat template with tool calls (so prompts list the tool).
//   warm-up    SFT on demonstrations from a careless teacher: in `careless` of them it guesses (the product
//              with one digit wrong) instead of calling the tool. Greedy decoding then guesses too.
//   GRPO       multi-turn rollout with the tool (rollout.multi_turn): the reward only says whether the last
//              turn is the right answer; the answers after a tool call are the rewarded ones, so the policy
//              learns to call it, and the tool-call rate rises in metrics.jsonl (turns_mean, tool_calls).
// Accuracy is greedy pass@1 with the tool on held-out number pairs (none in the SFT or GRPO data).
#pragma once
#include <stdint.h>

#include "cli/demo.h"

typedef struct {
    int64_t n_train, n_val, n_sft;  // GRPO prompts, held-out prompts, SFT demonstrations
    double careless;                // share of SFT demonstrations that guess instead of calling the tool
} DemoToolsTask;

// The whole demo in DIR (init/, data/, sft/, grpo/, tools.json), as demo_run: smoke shortens it to a test.
void demo_tools_run(const char *dir, uint64_t seed, int smoke, char **overrides, int n_overrides, DemoResult *res);
// The demo's tool (`grpo demo-tool`): reads {"name", "arguments": {"a", "b"}, ...} lines, answers {"content": a*b}.
int demo_tool_main(int argc, char **argv);
