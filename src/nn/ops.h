// Compute ops over plain pointers and sizes. No op allocates: scratch comes from the caller,
// so a CUDA backend can supply the same set over device memory.
// Token-major layouts: a batch of sequences is packed into N rows (no padding);
// seq_off[b]..seq_off[b+1] are the rows of sequence b, seq_off[0] = 0.
// Each *_backward takes the forward's inputs and d(loss)/d(out) and, llm.c style, ADDS into the
// gradients of parameters (dweight, dbias, dtable, dW); input gradients are added too unless said otherwise.
// Parameters (`const void *` with a DType `wt`) are stored as the model stores them: DTYPE_F32 or
// DTYPE_BF16. Activations and gradients are fp32, except a projection's operands (matmul_*), which
// come in its weights' dtype: the caller rounds them (dtype_from_f32), once for all projections of
// one input. Products accumulate in fp32.
#pragma once
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"

#ifndef OPS_HOST_DEVICE  // the CUDA backend includes this file: what both sides compute is marked for both
#define OPS_HOST_DEVICE
#endif

// RoPE's frequencies as Hugging Face's rope_type computes them: theta's (default), divided by factor (linear),
// or Llama 3's long-context rescaling (llama3: wavelengths beyond original_max_pos / low_freq_factor divided
// by factor, below original_max_pos / high_freq_factor kept, smoothly between).
typedef enum { ROPE_DEFAULT, ROPE_LINEAR, ROPE_LLAMA3 } RopeType;
typedef struct {
    double theta;
    RopeType type;
    double factor;                            // linear, llama3
    double low_freq_factor, high_freq_factor;  // llama3
    double original_max_pos;                   // llama3: original_max_position_embeddings
} RopeFreqs;

// The angle per position of pair j of a D-wide head (transformers' inv_freq[j], in double).
static inline OPS_HOST_DEVICE double rope_inv_freq(RopeFreqs f, int j, int D) {
    double inv = pow(f.theta, -2.0 * j / D);
    if (f.type == ROPE_LINEAR) return inv / f.factor;
    if (f.type != ROPE_LLAMA3) return inv;
    double wavelen = 2 * 3.14159265358979323846 / inv;  // math.pi
    if (wavelen > f.original_max_pos / f.low_freq_factor) return inv / f.factor;
    if (wavelen < f.original_max_pos / f.high_freq_factor) return inv;
    double s = (f.original_max_pos / wavelen - f.low_freq_factor) / (f.high_freq_factor - f.low_freq_factor);
    return (1 - s) * inv / f.factor + s * inv;
}

// out (N,C) = table[tokens[i]] ; table (V,C)
void embedding_forward(float *out, const int32_t *tokens, const void *table, DType wt, int64_t N, int64_t C);
// dtable (V,C) += dout (N,C) scattered to the rows of tokens
void embedding_backward(float *dtable, const float *dout, const int32_t *tokens, int64_t N, int64_t C);

// out (N,C) = inp * rsqrt(mean(inp^2) + eps) * (offset + weight) ; weight (C); out may be inp.
// offset 0 (Qwen, Llama, Mistral), or 1: Gemma's norms scale by 1 + w (their weights start at 0).
void rmsnorm_forward(float *out, const float *inp, const void *weight, DType wt, int64_t N, int64_t C, float eps,
                     float offset);
// dinp (N,C) +=, dweight (C) += (may be NULL: a frozen weight); the norm is recomputed from inp
void rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const void *weight, DType wt,
                      int64_t N, int64_t C, float eps, float offset);

// out (N,C) = (inp - mean) * rsqrt(var + eps) * weight + bias per row (LayerNorm; the row's statistics in double);
// weight, bias (C) fp32; out may be inp
void layernorm_forward(float *out, const float *inp, const float *weight, const float *bias, int64_t N, int64_t C,
                       float eps);
// dinp (N,C) += (may be NULL: no input gradient), dweight, dbias (C) += (each may be NULL); the statistics are
// recomputed from inp
void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, int64_t N, int64_t C, float eps);

// out (N,OC) = inp (N,C) @ weight(OC,C)^T + bias(OC) ; bias may be NULL; inp, weight and bias are all `dt`
void matmul_forward(float *out, const void *inp, const void *weight, const void *bias, DType dt, int64_t N, int64_t C,
                    int64_t OC);
// dinp (N,C) += dout (N,OC) @ weight ; dweight (OC,C) += dout^T @ inp ; dbias (OC) += column sums of dout.
// dout, inp and weight are all `dt`; dinp, dweight and dbias may be NULL (dweight: a frozen weight).
void matmul_backward(float *dinp, float *dweight, float *dbias, const void *dout, const void *inp, const void *weight,
                     DType dt, int64_t N, int64_t C, int64_t OC);

// cs (N, D) overwritten with RoPE's rotation for each row: the cosines of its D/2 angles, then their sines;
// pos (N) is each row's position within its sequence. One table serves every layer's q and k.
void rope_table(float *cs, const int32_t *pos, int64_t N, int D, RopeFreqs f);
// x (N, n_heads*D) rotated in place by RoPE, rotate-half layout (pairs i and i+D/2); cs from rope_table.
void rope_forward(float *x, const float *cs, int64_t N, int n_heads, int D);
// dx (N, n_heads*D) in place: d(loss)/d(rope input) from d(loss)/d(rope output) (the inverse rotation)
void rope_backward(float *dx, const float *cs, int64_t N, int n_heads, int D);

// One attention call's heads, score scale and mask: query head h reads kv head h / (H/KVH); a score is
// scale * q.k (1/sqrt(D): attn_shape's; Gemma's is query_pre_attn_scalar^-1/2); query i sees the keys j <= i
// with i - j < window (sliding-window layers: itself and window - 1 before it; window 0: every earlier key).
typedef struct {
    int H, KVH, D;
    int64_t window;
    float scale;
} AttnShape;
// The first key that query i sees through a window, queries and keys counted alike from 0: i - window + 1, or 0
// (no window, or not that far in). The CPU ops and the CUDA kernels both mask with it.
static inline OPS_HOST_DEVICE int64_t attn_first_key(int64_t i, int64_t window) {
    return window && i - window + 1 > 0 ? i - window + 1 : 0;
}
static inline AttnShape attn_shape(int H, int KVH, int D, int64_t window) {
    AttnShape a = {H, KVH, D, window, 1.0f / sqrtf((float)D)};
    return a;
}

// out (N, H*D): causal attention within each sequence; q (N, H*D), k and v (N, KVH*D).
// scratch: attention_scratch_floats(max_T) floats.
// lse (N,H), may be NULL: each row's log-sum-exp of its scaled scores, so backward can rebuild the
// probabilities block by block instead of keeping (T,T) of them.
size_t attention_scratch_floats(int64_t max_T);
void attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, const int64_t *seq_off,
                       int B, AttnShape a, float *scratch);
// dq (N,H*D), dk, dv (N,KVH*D) are OVERWRITTEN. out and lse are the forward's.
// scratch: attention_backward_scratch_floats(max_T) floats.
size_t attention_backward_scratch_floats(int64_t max_T);
void attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                        const float *q, const float *k, const float *v, const int64_t *seq_off, int B, AttnShape a,
                        float *scratch);

// out (n) = GELU(inp) = inp * Phi(inp), the erf form (PyTorch's nn.GELU()); out may be inp
void gelu_forward(float *out, const float *inp, int64_t n);
// dinp (n) OVERWRITTEN = dout * GELU'(inp) (in double); dinp may be dout
void gelu_backward(float *dinp, const float *dout, const float *inp, int64_t n);

// Decode attention: query row b at position n_keys[b] - 1 of its sequence against the sequence's cached keys.
// out, q (B, H*D); sequence b has n_keys[b] rows of k_cache/v_cache (of kv_dt: DTYPE_F32, or DTYPE_BF16 with D
// up to 1024, widened as read) starting at element offset kv_off[b], rows KVH*D elements apart, and reads the last
// min(n_keys[b], window) of them. Rows of one sequence at consecutive positions (a prompt's rows after those its
// cache held) are attended to in blocks, the keys read once a block.
// scratch: attention_scratch_floats(max n_keys) floats.
void attention_decode_forward(float *out, const float *q, const void *k_cache, const void *v_cache, DType kv_dt,
                              const int64_t *kv_off, const int32_t *n_keys, int B, AttnShape a, float *scratch);

// The gated MLP's activation: SwiGLU's silu (Qwen, Llama, Mistral) or GeGLU's GELU in its tanh form (Gemma's
// gelu_pytorch_tanh: PyTorch's gelu(approximate="tanh")).
typedef enum { GLU_SILU, GLU_GELU_TANH } GluAct;
static inline OPS_HOST_DEVICE float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}
// its derivative, in double
static inline OPS_HOST_DEVICE double gelu_tanh_grad(double x) {
    double t = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}

// out (n) = act(gate) * up
void glu_forward(float *out, const float *gate, const float *up, int64_t n, GluAct act);
// dgate, dup (n) OVERWRITTEN; dout may alias dgate
void glu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t n,
                  GluAct act);

// x (n) += y (n)
void residual_forward(float *x, const float *y, int64_t n);

// out (N): log softmax(h @ W^T)[targets[i]] for rows with targets[i] >= 0, 0 elsewhere.
// ent (N), may be NULL: the entropy -sum_j p_j log p_j of those rows' distributions, 0 elsewhere.
// h (N,C) fp32, W (V,C) `wt`; with bf16 weights h's rows are rounded to bf16 for the product.
// Logits exist only LOGPROB_CHUNK rows at a time: scratch holds logprob_scratch_floats(V, C, wt) floats,
// never (N,V).
#define LOGPROB_CHUNK 256  // rows; the product with the 152k-row LM head is ~40% faster at 256 than at 64
size_t logprob_scratch_floats(int64_t V, int64_t C, DType wt);
void logprob_forward(float *out, float *ent, const float *h, const void *W, DType wt, const int32_t *targets,
                     int64_t N, int64_t C, int64_t V, float *scratch);
// Backward of sum_i dlogp[i] * out[i] + dent[i] * ent[i] (dent may be NULL): dh (N,C) +=, dW (V,C) += (dW
// may be NULL: a frozen head);
// logits are recomputed chunk by chunk; with bf16 weights d(loss)/d(logits) is rounded to bf16 for both products.
// out (N), may be NULL: also writes logprob_forward's output, for callers that know dlogp before
// the forward (SFT) and so need only one pass over the vocabulary.
void logprob_backward(float *dh, float *dW, float *out, const float *dlogp, const float *dent, const float *h,
                      const void *W, DType wt, const int32_t *targets, int64_t N, int64_t C, int64_t V,
                      float *scratch);
