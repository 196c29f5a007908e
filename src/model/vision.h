// The vision tower of Qwen2.5-VL (Qwen2_5_VisionTransformerPretrainedModel), fp32 on the CPU: patch
// embedding (the Conv3d as a matmul over vl_processor's patches), `depth` blocks of
//   x += proj(attention(rope2d(qkv(rmsnorm1(x)))))     non-causal, within windows or the whole image
//   x += down(silu(gate(rmsnorm2(x))) * up(rmsnorm2(x)))   (SwiGLU, with biases)
// where the blocks of fullatt_block_indexes attend over the whole image and the others within windows of
// window_size pixels (merged units reordered window by window), the 2-D rotary embedding (a patch's row
// and column, each on a quarter of the head's dimensions), and the patch merger: rmsnorm, each 2 x 2 group
// of patches concatenated, Linear, GELU, Linear to the language model's width. Qwen2-VL's tower
// (Qwen2VisionTransformerPretrainedModel, VisionConfig.qwen2) differs in LayerNorms with biases for every
// norm, x += fc2(quick_gelu(fc1(norm2(x)))) as the MLP, and the whole image in every block's attention. The
// tower is frozen (no backward); the merger has one (vision_merge_backward), for actor.vision.train_merger.
#pragma once
#include <cjson/cJSON.h>
#include <stdint.h>

#include "backend/backend.h"
#include "io/safetensors.h"

#define VISION_MAX_FULLATT 64

typedef struct {
    int depth, hidden, intermediate, heads, out_hidden;
    int patch, merge, temporal, window, in_channels;
    int fullatt[VISION_MAX_FULLATT];  // fullatt_block_indexes
    int n_fullatt;
    float eps;  // the norms' (1e-6)
    int qwen2;  // Qwen2-VL's tower: its vision_config has embed_dim (hidden here; its hidden_size is
                // out_hidden), mlp_ratio (intermediate = hidden * mlp_ratio), no windows
} VisionConfig;

typedef struct {
    const float *norm1, *norm2, *qkv_w, *qkv_b, *proj_w, *proj_b;
    const float *gate_w, *gate_b, *up_w, *up_b, *down_w, *down_b;  // Qwen2-VL: up is fc1, down fc2, no gate
    const float *norm1_b, *norm2_b;                                // Qwen2-VL's LayerNorm biases, else NULL
} VisionBlock;

// The patch merger (h: the tower's width, U = merge^2): rmsnorm (h; Qwen2-VL: LayerNorm, with ln_q_b),
// Linear(U h, U h), GELU, Linear(U h, out_hidden). The same fields hold weights or (VisionMergerGrads) their
// gradients.
typedef struct {
    const float *ln_q, *ln_q_b, *w0, *b0, *w2, *b2;
} VisionMerger;

typedef struct {
    float *ln_q, *ln_q_b, *w0, *b0, *w2, *b2;
} VisionMergerGrads;

typedef struct {
    VisionConfig cfg;
    float *slab;  // every weight, fp32
    const float *patch_w;  // (hidden, 3 * temporal * patch * patch)
    VisionBlock *blocks;
    VisionMerger merger;
} Vision;

// config.json's "vision_config" (Qwen2.5-VL's keys, or Qwen2-VL's: embed_dim, mlp_ratio); dies naming `where`
// and the key on a bad value.
void vision_config_parse(VisionConfig *c, const cJSON *vc, const char *where);
// The tower's weights from a model directory: "visual.*" (transformers 4) or "model.visual.*" (5).
void vision_load(Vision *v, const VisionConfig *c, const char *model_dir);
void vision_free(Vision *v);
// A tower of random weights, as Hugging Face initialises one: matrices N(0, std), biases 0, norms 1.
void vision_init_random(Vision *v, const VisionConfig *c, uint64_t seed, double std);
// The tower's tensors for safetensors_write, under transformers 4's names ("visual.*"): ws and names hold
// vision_n_tensors(c) entries; returns their count. The data stays v's.
int vision_tensors(const Vision *v, StWriteTensor *ws, char (*names)[96]);
int vision_n_tensors(const VisionConfig *c);
// Memory: the tower's fp32 weights, and what vision_forward allocates at its peak for an image of `patches`
// patches on `threads` threads (its activations, SwiGLU's, the merger's and attention's scratch).
size_t vision_weight_bytes(const VisionConfig *c);
size_t vision_forward_bytes(const VisionConfig *c, int64_t patches, int threads);
// Dies naming `where` unless the image processor's patches are the tower's (patch_size, temporal_patch_size,
// merge_size) and, with lm_hidden > 0, its features are the language model's width.
void vision_check(const VisionConfig *c, int patch, int temporal, int merge, int64_t lm_hidden, const char *where);
// The grid's merged units in the order the windowed blocks see them (index: units entries, each a unit of the
// image's row-major order; seg: the windows' bounds in units, n_seg + 1 of them, units + 2 room); returns n_seg.
int vision_windows(const VisionConfig *c, const int grid[3], int64_t *index, int64_t *seg);
// Each patch's rotation, rows in that order (unit index[u]'s merge^2 patches at rows u * merge^2 ...): cs holds
// t*h*w rows of D = hidden / heads: the cos of its row's and its column's angles (a quarter of D each), then
// their sins.
void vision_rope(const VisionConfig *c, const int grid[3], const int64_t *index, float *cs);
// The tower without its merger: hidden (t*h*w / merge^2 rows of merge^2 * hidden) each merged unit's patches'
// last hidden states, in the order of the image's merged units (row-major), the merger's input.
void vision_hidden(const Vision *v, const float *patches, const int grid[3], float *hidden);
// out (units, out_hidden) = the merger w of hidden (units, merge^2 * hidden): each unit on its own. On be: w,
// hidden and out are be's memory (the tower's merger is the CPU's; a trained one is the trainer's).
void vision_merge(const Backend *be, const VisionConfig *c, const VisionMerger *w, const float *hidden, int64_t units,
                  float *out);
// dw += d(loss)/d(w) for dout = d(loss)/d(out) (units, out_hidden) of vision_merge(be, c, w, hidden, units), which
// it recomputes, on be (every pointer be's memory). The tower below gets nothing (frozen).
void vision_merge_backward(const Backend *be, const VisionConfig *c, const VisionMerger *w, const float *hidden,
                           int64_t units, const float *dout, const VisionMergerGrads *dw);
// Features of one image: patches (grid t*h*w rows of 3 * temporal * patch^2, vl_preprocess's order) ->
// out (t*h*w / merge^2 rows of out_hidden), in the order of the image's merged units (row-major), which is
// the order of its <|image_pad|> tokens.
void vision_forward(const Vision *v, const float *patches, const int grid[3], float *out);
