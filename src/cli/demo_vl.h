// The vision-language demo behind `grpo train --demo-vl`: GRPO on a tiny Qwen2.5-VL that reads images.
//
//   task       56 x 56 images of four quadrants, each empty, a red square or a blue square (random sizes,
//              places and shades): "<image>How many red squares?" -> "2"; the reward is an exact match.
//              Each quadrant is one of the image's four merged units (2 x 2 patches of 14 pixels).
//   model      a tiny Qwen2.5-VL: the text demo's language model with M-RoPE and a 2-block vision tower of
//              width 64 (Hugging Face's random initialisation, frozen throughout, as grpo trains VL models),
//              and the demo's byte-level BPE tokenizer with <|vision_start|>, <|image_pad|>, <|vision_end|>.
//   warm-up    SFT on demonstrations from a careless teacher: in `careless` of them it counts every square,
//              blue ones too. Imitating it, the model answers the squares' count where blue ones are present.
//   GRPO       only the right count is rewarded: the policy learns that the blue squares do not count.
// Accuracy is greedy pass@1 on held-out images (drawn apart from the training ones).
#pragma once
#include <stdint.h>

#include "cli/demo.h"

// The whole demo in DIR (init/, data/ with images/, sft/, grpo/), as demo_run: smoke shortens it to a test.
void demo_vl_run(const char *dir, uint64_t seed, int smoke, char **overrides, int n_overrides, DemoResult *res);
