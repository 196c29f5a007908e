// LoRA adapters, as PEFT's LoraConfig / lora.Linear (no DoRA, no rsLoRA, bias "none"): each adapted
// projection W (out, in) of every layer computes y = x W^T + b + scale * (x A^T) B^T with A (r, in),
// B (out, r), scale = alpha / r. The base stays frozen; the adapters are one fp32 slab with named
// offsets (gradients and Adam moments are slabs of the same layout). The adapter branch runs in fp32 on
// the projection's fp32 input, whatever the base's dtype.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "model/decoder.h"

typedef enum { LORA_Q, LORA_K, LORA_V, LORA_O, LORA_GATE, LORA_UP, LORA_DOWN, LORA_TARGETS } LoraTarget;

typedef struct {
    int64_t rank;      // r; 0: no adapters
    double alpha;      // lora_alpha
    unsigned targets;  // bit t set: LoraTarget t is adapted
} LoraSpec;

struct Lora {
    LoraSpec spec;
    float scale;  // alpha / rank
    int64_t layers;
    int64_t in[LORA_TARGETS], out[LORA_TARGETS];  // the adapted projection's sizes
    // Element offsets of A (L, r, in) and B (L, out, r), layer-stacked like DecoderLayout; 0-sized when
    // the target is not adapted.
    size_t a[LORA_TARGETS], b[LORA_TARGETS];
    float *params;  // n fp32 elements, in be's memory
    size_t n;
    const Backend *be;  // where params live (the CPU unless moved: lora_to_backend)
};

// PEFT's module name of a target ("q_proj", ..., "down_proj").
const char *lora_target_name(LoraTarget t);
// Adds the target(s) that `name` names to *mask: a PEFT name ("q_proj"), a short one ("q") or
// "all-linear" (all seven). Returns 0 when the name is unknown.
int lora_targets_add(unsigned *mask, const char *name);
// Adapters of `spec` for a model of config c: A as PEFT initialises it (Kaiming-uniform with
// a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in))), B zero.
void lora_init(Lora *lo, const DecoderConfig *c, const LoraSpec *spec, uint64_t seed);
void lora_free(Lora *lo);
// Elements of spec's adapters for a model of config c.
size_t lora_params(const DecoderConfig *c, const LoraSpec *spec);
// spec from DIR/adapter_config.json; dies naming the file and key on what grpo cannot run.
void lora_read_spec(LoraSpec *spec, const char *dir);
// Continuing from an adapter: its adapter_config.json replaces *spec. What the user set must agree with it:
// a rank (> 0) named by rank_key, and the targets named by targets_key when targets_given.
void lora_spec_from_adapter(LoraSpec *spec, const char *adapter, const char *rank_key, int targets_given,
                            const char *targets_key);
// The adapter tensors with PEFT's names (base_model.model.model.layers.L.self_attn.q_proj.lora_A.weight,
// ...), in slab order; returns their count. `out` may be NULL.
int lora_tensors(const Lora *lo, DecoderTensor *out);
// DIR/adapter_config.json and DIR/adapter_model.safetensors (F32), each written atomically (a device's params staged
// through the host).
void lora_save(const Lora *lo, const char *dir, const char *base_model);
// Reads a PEFT LoRA adapter directory for a model of config c; dies with one line naming the file and
// key or tensor on anything else (DoRA, rsLoRA, biases, other modules, wrong shapes).
void lora_load(Lora *lo, const DecoderConfig *c, const char *dir);
// Moves lo's params into be's memory (the host copy is freed).
void lora_to_backend(Lora *lo, const Backend *be);
// Adapters whose params host code may read: lo itself on the CPU, else *copy with lo's params downloaded
// (lora_free it when the result is copy).
const Lora *lora_host(const Lora *lo, Lora *copy);
// Attaches lo to m (both on the same backend): every forward of m (and the training passes) then adds the adapters.
void lora_attach(Decoder *m, const Lora *lo);
// W += scale * B A for every adapted weight of m (an F32 model): a plain model equal to base + adapters.
void lora_merge(Decoder *m, const Lora *lo);

// out (N, out_t) += scale * (x (N, in_t) A^T) B^T for layer l's target t; u (N, r) scratch keeps x A^T.
// No-op when t is not adapted.
void lora_forward(const Backend *be, const Lora *lo, LoraTarget t, int64_t l, const float *x, int64_t N, float *out,
                  float *u);
// The backward of lora_forward: dA, dB in grads (the adapters' layout) +=, dx (N, in_t) +=.
// u, du: (N, r) scratch. No-op when t is not adapted.
void lora_backward(const Backend *be, const Lora *lo, float *grads, LoraTarget t, int64_t l, const float *x,
                   const float *dout, int64_t N, float *dx, float *u, float *du);
