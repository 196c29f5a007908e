// grpo export --format onnx (cli/export_onnx.c).
#pragma once
#include <stddef.h>

#include "model/decoder.h"
#include "model/vision.h"
#include "model/vl_processor.h"

// A VL model's vision tower and the image size its static vision graphs take (grid: export_onnx_grid's).
typedef struct {
    const Vision *v;
    const VlProcessor *p;
    int width, height;
    int grid[3];
} OnnxVision;

// The grid of patches a width x height image resizes to (t, h, w); dies naming --image-size when smart_resize
// refuses that size.
void export_onnx_grid(const VlProcessor *p, int width, int height, int grid[3]);
// Writes m (read from dir, whose config and tokenizer files go beside) as an Optimum-layout ONNX folder `out`:
// onnx/model.onnx (f16: onnx/model_fp16.onnx, half-precision matrices); external: its weights in the file's
// "_data" companion (always past 2 GB). A VL model (vis: its tower) as transformers.js's image-text-to-text
// sessions: onnx/embed_tokens.onnx, decoder_model_merged.onnx and vision_encoder.onnx (the processor's patches
// of one image of vis's size -> its features), and vision_encoder_image.onnx (that image itself -> its
// features). Every graph is built and checked before any file is written. Returns the weights' bytes.
size_t export_onnx(const Decoder *m, const char *dir, const char *out, int f16, int external,
                   const OnnxVision *vis);
