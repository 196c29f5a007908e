// grpo export --format onnx (cli/export_onnx.c).
#pragma once
#include <stddef.h>

#include "model/decoder.h"
#include "model/vision.h"
#include "model/vl_processor.h"

// Writes m (read from dir, whose config and tokenizer files go beside) as an Optimum-layout ONNX folder `out`:
// onnx/model.onnx (f16: onnx/model_fp16.onnx, half-precision matrices); external: its weights in the file's
// "_data" companion (always past 2 GB). Returns the weights' bytes.
size_t export_onnx(const Decoder *m, const char *dir, const char *out, int f16, int external);
// A vision-language model's vision tower and patch merger as onnx/vision_encoder.onnx in out (f16:
// vision_encoder_fp16.onnx) (the processor's patches of a width x height image -> its features): a static graph
// of that image size's grid.
void export_onnx_vision(const Vision *v, const VlProcessor *p, int width, int height, const char *out, int f16);
