// grpo export --format onnx (cli/export_onnx.c).
#pragma once
#include <stddef.h>

#include "model/decoder.h"

// Writes m (read from dir, whose config and tokenizer files go beside) as an Optimum-layout ONNX folder `out`:
// onnx/model.onnx (f16: onnx/model_fp16.onnx, half-precision matrices); external: its weights in the file's
// "_data" companion (always past 2 GB). Returns the weights' bytes.
size_t export_onnx(const Decoder *m, const char *dir, const char *out, int f16, int external);
