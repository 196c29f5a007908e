#include "model/vision.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/json.h"
#include "base/rng.h"
#include "base/util.h"
#include "io/hf_weights.h"
#include "nn/ops.h"

static int get_int(const cJSON *vc, const char *key, int fallback, int lo, int hi, const char *where) {
    int64_t v = json_get_int_or(vc, key, fallback, where);
    if (v < lo || v > hi)
        die("%s: vision_config.%s = %lld is out of range [%d, %d]", where, key, (long long)v, lo, hi);
    return (int)v;
}

// Qwen2-VL's keys: the tower's width is embed_dim, hidden_size is the merger's output, the MLP is mlp_ratio wide.
static void qwen2_vision_keys(VisionConfig *c, const cJSON *vc, const char *where) {
    c->qwen2 = 1;
    c->hidden = get_int(vc, "embed_dim", 1280, 8, 1 << 16, where);
    c->out_hidden = get_int(vc, "hidden_size", 3584, 1, 1 << 17, where);
    double ratio = json_get_number_or(vc, "mlp_ratio", 4.0, where);
    double inter = ratio * c->hidden;
    if (!(inter >= 1 && inter <= (1 << 18)) || inter != (double)(int)inter)
        die("%s: vision_config.mlp_ratio %g x embed_dim %d is not a whole MLP width", where, ratio, c->hidden);
    c->intermediate = (int)inter;
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(vc, "hidden_act");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "quick_gelu")))
        die("%s: vision_config.hidden_act must be \"quick_gelu\" (Qwen2-VL)", where);
}

void vision_config_parse(VisionConfig *c, const cJSON *vc, const char *where) {
    if (!cJSON_IsObject(vc)) die("%s: \"vision_config\" must be an object", where);
    memset(c, 0, sizeof *c);
    c->depth = get_int(vc, "depth", 32, 1, 256, where);
    c->heads = get_int(vc, "num_heads", 16, 1, 1024, where);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(vc, "model_type");
    if (cJSON_GetObjectItemCaseSensitive(vc, "embed_dim") ||
        (cJSON_IsString(type) && !strcmp(type->valuestring, "qwen2_vl"))) {
        qwen2_vision_keys(c, vc, where);
    } else {
        c->hidden = get_int(vc, "hidden_size", 3584, 8, 1 << 16, where);  // transformers' defaults throughout
        c->intermediate = get_int(vc, "intermediate_size", 3420, 1, 1 << 18, where);
        c->out_hidden = get_int(vc, "out_hidden_size", 3584, 1, 1 << 17, where);
    }
    c->patch = get_int(vc, "patch_size", 14, 1, 64, where);
    c->merge = get_int(vc, "spatial_merge_size", 2, 1, 8, where);
    c->temporal = get_int(vc, "temporal_patch_size", 2, 1, 4, where);
    c->window = get_int(vc, "window_size", 112, 1, 1 << 16, where);
    const char *in_key = cJSON_GetObjectItemCaseSensitive(vc, "in_chans") ? "in_chans" : "in_channels";
    c->in_channels = get_int(vc, in_key, 3, 3, 3, where);
    c->eps = 1e-6f;
    if (c->hidden % c->heads || (c->hidden / c->heads) % 4)
        die("%s: vision_config: hidden_size / num_heads must be a multiple of 4", where);
    if (c->window % (c->merge * c->patch))
        die("%s: vision_config.window_size must be a multiple of spatial_merge_size x patch_size", where);
    const cJSON *fa = cJSON_GetObjectItemCaseSensitive(vc, "fullatt_block_indexes");
    if (fa && !cJSON_IsArray(fa)) die("%s: vision_config.fullatt_block_indexes must be a list", where);
    // Qwen2.5-VL's default (what an omitted key means: transformers leaves out values equal to the defaults)
    static const int fullatt_default[4] = {7, 15, 23, 31};
    for (int i = 0; !fa && !c->qwen2 && i < 4; i++)
        if (fullatt_default[i] < c->depth) c->fullatt[c->n_fullatt++] = fullatt_default[i];
    for (const cJSON *e = fa ? fa->child : NULL; e; e = e->next) {
        int64_t i;
        if (!json_as_int(e, 0, c->depth - 1, &i) || c->n_fullatt == VISION_MAX_FULLATT)
            die("%s: vision_config.fullatt_block_indexes holds a bad block index", where);
        c->fullatt[c->n_fullatt++] = (int)i;
    }
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(vc, "hidden_act");
    if (!c->qwen2 && act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu")))
        die("%s: vision_config.hidden_act must be \"silu\" (Qwen2.5-VL)", where);
}

// Each tensor of the tower in slab order, as the visitor `take` fills it: its name after the "visual." prefix,
// its shape (d1 0: a vector), and where its pointer goes.
typedef const float *(*TakeFn)(void *ctx, const char *name, int64_t d0, int64_t d1);

// Block i's tensor `name` through take.
static const float *block_take(TakeFn take, void *ctx, int i, const char *name, int64_t d0, int64_t d1) {
    char n[96];
    snprintf(n, sizeof n, "blocks.%d.%s", i, name);
    return take(ctx, n, d0, d1);
}

static void vision_walk(Vision *v, TakeFn take, void *ctx) {
    const VisionConfig *c = &v->cfg;
    int64_t H = c->hidden, I = c->intermediate, P = 3LL * c->temporal * c->patch * c->patch;
    int64_t M4 = H * c->merge * c->merge;
    v->patch_w = take(ctx, "patch_embed.proj.weight", H, P);
    for (int i = 0; i < c->depth; i++) {
        VisionBlock *b = &v->blocks[i];
#define W(field, name, d0, d1) b->field = block_take(take, ctx, i, name, d0, d1)
        W(norm1, "norm1.weight", H, 0);
        if (c->qwen2) W(norm1_b, "norm1.bias", H, 0);
        W(norm2, "norm2.weight", H, 0);
        if (c->qwen2) W(norm2_b, "norm2.bias", H, 0);
        W(qkv_w, "attn.qkv.weight", 3 * H, H);
        W(qkv_b, "attn.qkv.bias", 3 * H, 0);
        W(proj_w, "attn.proj.weight", H, H);
        W(proj_b, "attn.proj.bias", H, 0);
        if (c->qwen2) {
            W(up_w, "mlp.fc1.weight", I, H);
            W(up_b, "mlp.fc1.bias", I, 0);
            W(down_w, "mlp.fc2.weight", H, I);
            W(down_b, "mlp.fc2.bias", H, 0);
            continue;
        }
        W(gate_w, "mlp.gate_proj.weight", I, H);
        W(gate_b, "mlp.gate_proj.bias", I, 0);
        W(up_w, "mlp.up_proj.weight", I, H);
        W(up_b, "mlp.up_proj.bias", I, 0);
        W(down_w, "mlp.down_proj.weight", H, I);
        W(down_b, "mlp.down_proj.bias", H, 0);
#undef W
    }
    v->merger.ln_q = take(ctx, "merger.ln_q.weight", H, 0);
    if (c->qwen2) v->merger.ln_q_b = take(ctx, "merger.ln_q.bias", H, 0);
    v->merger.w0 = take(ctx, "merger.mlp.0.weight", M4, M4);
    v->merger.b0 = take(ctx, "merger.mlp.0.bias", M4, 0);
    v->merger.w2 = take(ctx, "merger.mlp.2.weight", c->out_hidden, M4);
    v->merger.b2 = take(ctx, "merger.mlp.2.bias", c->out_hidden, 0);
}

// The slab's length: every tensor's values.
static const float *count_take(void *ctx, const char *name, int64_t d0, int64_t d1) {
    (void)name;
    *(int64_t *)ctx += d0 * (d1 ? d1 : 1);
    return NULL;
}

static void vision_alloc(Vision *v, const VisionConfig *c) {
    memset(v, 0, sizeof *v);
    v->cfg = *c;
    v->blocks = xcalloc((size_t)c->depth, sizeof *v->blocks);
    int64_t total = 0;
    vision_walk(v, count_take, &total);
    v->slab = xmalloc((size_t)total * sizeof *v->slab);
}

typedef struct {
    HfWeights w;
    const char *prefix;
    const char *dir;
    float *at;  // next free float of the slab
} Loader;

static const float *load_take(void *ctx, const char *name, int64_t d0, int64_t d1) {
    Loader *L = ctx;
    char full[256];
    snprintf(full, sizeof full, "%s%s", L->prefix, name);
    const StTensor *t = hf_weights_find(&L->w, full, NULL);
    if (!t) die("%s: the vision tower lacks %s", L->dir, full);
    if (t->numel != d0 * (d1 ? d1 : 1) || (d1 && (t->ndim < 2 || t->shape[0] != d0)))
        die("%s: %s has %lld values, the config wants %lld x %lld", L->dir, full, (long long)t->numel,
            (long long)d0, (long long)(d1 ? d1 : 1));
    float *dst = L->at;
    dtype_to_f32(t->dtype, t->data, dst, (size_t)t->numel);
    L->at += t->numel;
    return dst;
}

void vision_load(Vision *v, const VisionConfig *c, const char *model_dir) {
    vision_alloc(v, c);
    Loader L = {.dir = model_dir, .at = v->slab};
    hf_weights_open(&L.w, model_dir);
    L.prefix = hf_weights_find(&L.w, "visual.patch_embed.proj.weight", NULL) ? "visual." : "model.visual.";
    vision_walk(v, load_take, &L);
    hf_weights_close(&L.w);
}

typedef struct {
    Rng rng;
    double std;
    float *at;
} Init;

// Hugging Face's initialisation: norm weights 1, biases 0, matrices N(0, std).
static const float *init_take(void *ctx, const char *name, int64_t d0, int64_t d1) {
    Init *it = ctx;
    float *dst = it->at;
    int norm = (strstr(name, "norm") || strstr(name, "ln_q")) && strstr(name, ".weight");
    for (int64_t i = 0; i < d0 * (d1 ? d1 : 1); i++) {
        double x = d1 ? rng_normal(&it->rng) * it->std : 0.0;
        dst[i] = norm ? 1.0f : (float)x;
    }
    it->at += d0 * (d1 ? d1 : 1);
    return dst;
}

void vision_init_random(Vision *v, const VisionConfig *c, uint64_t seed, double std) {
    vision_alloc(v, c);
    Init it = {.std = std, .at = v->slab};
    rng_init(&it.rng, seed);
    vision_walk(v, init_take, &it);
}

typedef struct {
    StWriteTensor *ws;
    char (*names)[96];
    int n;
    const float *at;
} Lister;

static const float *list_take(void *ctx, const char *name, int64_t d0, int64_t d1) {
    Lister *L = ctx;
    snprintf(L->names[L->n], sizeof L->names[L->n], "visual.%s", name);
    L->ws[L->n] = (StWriteTensor){.name = L->names[L->n], .ndim = d1 ? 2 : 1, .shape = {d0, d1}, .data = L->at};
    L->at += d0 * (d1 ? d1 : 1);
    L->n++;
    return L->at - d0 * (d1 ? d1 : 1);
}

int vision_tensors(const Vision *v, StWriteTensor *ws, char (*names)[96]) {
    Vision shadow = *v;  // the walk sets the pointers again: on a copy, to the same places
    shadow.blocks = xcalloc((size_t)v->cfg.depth, sizeof *shadow.blocks);
    Lister L = {.ws = ws, .names = names, .at = v->slab};
    vision_walk(&shadow, list_take, &L);
    free(shadow.blocks);
    return L.n;
}

int vision_n_tensors(const VisionConfig *c) { return 1 + 12 * c->depth + 5 + c->qwen2; }

size_t vision_weight_bytes(const VisionConfig *c) {
    Vision v = {.cfg = *c};
    v.blocks = xcalloc((size_t)c->depth, sizeof *v.blocks);
    int64_t total = 0;
    vision_walk(&v, count_take, &total);
    free(v.blocks);
    return (size_t)total * sizeof(float);
}

size_t vision_forward_bytes(const VisionConfig *c, int64_t patches, int threads) {
    int64_t N = patches, C = c->hidden, D = C / c->heads, U = (int64_t)c->merge * c->merge;
    // the merger's input, x, h, att, o, the merger's norm and GELU (C each), qkv (3 C), the rotations (D), gate
    // and up (I each); attention's keys, values and scores per thread; the merged features
    int64_t floats = N * (10 * C + D + 2 * c->intermediate) + (int64_t)threads * N * (2 * D + 1) +
                     N / U * c->out_hidden;
    return (size_t)floats * sizeof(float);
}

void vision_check(const VisionConfig *c, int patch, int temporal, int merge, int64_t lm_hidden, const char *where) {
    if (patch != c->patch || temporal != c->temporal || merge != c->merge)
        die("%s: preprocessor_config.json's patches (%d, %d, merge %d) are not the vision tower's (%d, %d, merge %d)",
            where, patch, temporal, merge, c->patch, c->temporal, c->merge);
    if (lm_hidden > 0 && lm_hidden != c->out_hidden)
        die("%s: vision_config.out_hidden_size %d is not the language model's hidden_size %lld",
            where, c->out_hidden,
            (long long)lm_hidden);
}

void vision_free(Vision *v) {
    free(v->slab);
    free(v->blocks);
    memset(v, 0, sizeof *v);
}

// Qwen2.5-VL's window order: the merged units (t, row, column) visited window by window (windows of ws x ws
// units, row-major, the last ones cut by the grid's edge), each row-major inside. index[i]: the unit at window
// position i; seg: unit offsets of each window (n_seg + 1 of them).
int vision_windows(const VisionConfig *c, const int grid[3], int64_t *index, int64_t *seg) {
    int merge = c->merge, ws = c->window / c->merge / c->patch;
    int LH = grid[1] / merge, LW = grid[2] / merge, n_seg = 0;
    int64_t at = 0;
    seg[0] = 0;
    for (int t = 0; t < grid[0]; t++)
        for (int wh = 0; wh * ws < LH; wh++)
            for (int ww = 0; ww * ws < LW; ww++) {
                for (int r = wh * ws; r < (wh + 1) * ws && r < LH; r++)
                    for (int col = ww * ws; col < (ww + 1) * ws && col < LW; col++)
                        index[at++] = ((int64_t)t * LH + r) * LW + col;
                seg[++n_seg] = at;
            }
    return n_seg;
}

void vision_rope(const VisionConfig *c, const int grid[3], const int64_t *index, float *cs) {
    int M = c->merge, U = M * M, D = c->hidden / c->heads, Q = D / 4;  // Q: inv_freq entries (D/2 over pairs)
    int64_t units = (int64_t)grid[0] * grid[1] * grid[2] / U, per_t = (int64_t)grid[1] * grid[2];
    float *inv = xmalloc((size_t)Q * sizeof *inv);
    for (int j = 0; j < Q; j++) inv[j] = (float)(1.0 / pow(10000.0, (double)(2 * j) / (D / 2)));
    for (int64_t u = 0; u < units; u++) {
        int64_t r = index[u] % (per_t / U);  // the unit's place in its frame
        int64_t bh = r / (grid[2] / M), bw = r % (grid[2] / M);
        for (int k = 0; k < U; k++) {
            double hpos = (double)(bh * M + k / M), wpos = (double)(bw * M + k % M);
            float *cr = cs + (u * U + k) * D;
            for (int j = 0; j < Q; j++) {
                double ah = hpos * inv[j], aw = wpos * inv[j];
                cr[j] = (float)cos(ah);
                cr[Q + j] = (float)cos(aw);
                cr[D / 2 + j] = (float)sin(ah);
                cr[D / 2 + Q + j] = (float)sin(aw);
            }
        }
    }
    free(inv);
}

// Sum of a[i] * b[i] in 8 partial sums (vectorises; the order is fixed, so results do not depend on threads).
static float dot(const float *a, const float *b, int n) {
    float s[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * b[i + j];
    float t = 0;
    for (; i < n; i++) t += a[i] * b[i];
    return t + ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// out (N, H*D) = softmax(q k^T / sqrt(D)) v within each segment [seg[s], seg[s+1]) of rows, every head. Each
// thread takes whole heads: it gathers the segment's keys and values of its head into contiguous rows first
// (qkv rows are 3 * H * D floats apart). max_seg: the longest segment.
static void attend(float *out, const float *qkv, int H, int D, const int64_t *seg, int n_seg, int64_t max_seg) {
    int64_t stride = 3LL * H * D, per = max_seg * (2LL * D + 1);
    float scale = 1.0f / sqrtf((float)D);
    float *buf = xmalloc((size_t)omp_get_max_threads() * (size_t)per * sizeof *buf);
    for (int s = 0; s < n_seg; s++) {
        int64_t a = seg[s], n = seg[s + 1] - seg[s];
#pragma omp parallel for schedule(static)
        for (int h = 0; h < H; h++) {
            float *K = buf + (size_t)omp_get_thread_num() * (size_t)per, *V = K + n * D, *p = V + n * D;
            for (int64_t j = 0; j < n; j++) {
                memcpy(K + j * D, qkv + (a + j) * stride + (int64_t)(H + h) * D, (size_t)D * sizeof *K);
                memcpy(V + j * D, qkv + (a + j) * stride + (int64_t)(2 * H + h) * D, (size_t)D * sizeof *V);
            }
            for (int64_t i = 0; i < n; i++) {
                const float *q = qkv + (a + i) * stride + (int64_t)h * D;
                float mx = -INFINITY;
                for (int64_t j = 0; j < n; j++) {
                    p[j] = dot(q, K + j * D, D) * scale;
                    mx = p[j] > mx ? p[j] : mx;
                }
                double sum = 0;
                for (int64_t j = 0; j < n; j++) {
                    p[j] = expf(p[j] - mx);
                    sum += p[j];
                }
                float *o = out + (a + i) * H * D + (int64_t)h * D;
                memset(o, 0, (size_t)D * sizeof *o);
                for (int64_t j = 0; j < n; j++) {
                    float w = (float)(p[j] / sum);
                    const float *vv = V + j * D;
                    for (int e = 0; e < D; e++) o[e] += w * vv[e];
                }
            }
        }
    }
    free(buf);
}

// out (N, C) = the block's norm of x: RMSNorm (Qwen2.5-VL), or LayerNorm with bias b (Qwen2-VL: b not NULL).
static void norm_forward(float *out, const float *x, const float *w, const float *b, int64_t N, int64_t C,
                         float eps) {
    if (b) layernorm_forward(out, x, w, b, N, C, eps);
    else rmsnorm_forward(out, x, w, DTYPE_F32, N, C, eps, 0.0f);
}

void vision_hidden(const Vision *v, const float *patches, const int grid[3], float *hidden) {
    const VisionConfig *c = &v->cfg;
    if (grid[0] < 1 || grid[1] < c->merge || grid[2] < c->merge || grid[1] % c->merge || grid[2] % c->merge)
        die("internal: an image grid of %d x %d x %d patches for merge size %d",
            grid[0], grid[1], grid[2], c->merge);
    int M = c->merge, U = M * M, H = c->heads, D = c->hidden / c->heads;
    int64_t N = (int64_t)grid[0] * grid[1] * grid[2], C = c->hidden;
    int64_t PD = 3LL * c->temporal * c->patch * c->patch;
    int64_t units = N / U, per_t = (int64_t)grid[1] * grid[2];
    // window order of the merged units, and each frame as one segment for the full-attention blocks
    int64_t *index = xmalloc((size_t)units * sizeof *index);
    int64_t *wseg = xmalloc((size_t)(units + 2) * sizeof *wseg);
    int n_wseg = vision_windows(c, grid, index, wseg);
    for (int s = 0; s <= n_wseg; s++) wseg[s] *= U;  // in patches
    int64_t *fseg = xmalloc((size_t)(grid[0] + 1) * sizeof *fseg);
    for (int t = 0; t <= grid[0]; t++) fseg[t] = t * per_t;
    // patch embedding, and each patch's rotation (its row, column: a quarter of D each), in window order
    float *x = xmalloc((size_t)(N * C) * sizeof *x), *cs = xmalloc((size_t)(N * D) * sizeof *cs);
    float *emb = xmalloc((size_t)(N * C) * sizeof *emb);
    matmul_forward(emb, patches, v->patch_w, NULL, DTYPE_F32, N, PD, C);
    for (int64_t u = 0; u < units; u++)
        memcpy(x + u * U * C, emb + index[u] * U * C, (size_t)(U * C) * sizeof *x);
    vision_rope(c, grid, index, cs);
    free(emb);
    int64_t I = c->intermediate;
    float *h = xmalloc((size_t)(N * C) * sizeof *h), *qkv = xmalloc((size_t)(N * 3 * C) * sizeof *qkv);
    float *att = xmalloc((size_t)(N * C) * sizeof *att), *o = xmalloc((size_t)(N * C) * sizeof *o);
    float *g = xmalloc((size_t)(N * I) * sizeof *g), *up = xmalloc((size_t)(N * I) * sizeof *up);
    for (int l = 0; l < c->depth; l++) {
        const VisionBlock *b = &v->blocks[l];
        int full = c->qwen2;  // Qwen2-VL: every block over the whole image
        for (int i = 0; i < c->n_fullatt; i++) full |= c->fullatt[i] == l;
        norm_forward(h, x, b->norm1, b->norm1_b, N, C, c->eps);
        matmul_forward(qkv, h, b->qkv_w, b->qkv_b, DTYPE_F32, N, C, 3 * C);
        // rotate q and k: rope_forward works on rows of n_heads * D; q and k are 2H heads of each qkv row
        for (int64_t r = 0; r < N; r++) rope_forward(qkv + r * 3 * C, cs + r * D, 1, 2 * H, D);
        attend(att, qkv, H, D, full ? fseg : wseg, full ? grid[0] : n_wseg, per_t);
        matmul_forward(o, att, b->proj_w, b->proj_b, DTYPE_F32, N, C, C);
        residual_forward(x, o, N * C);
        norm_forward(h, x, b->norm2, b->norm2_b, N, C, c->eps);
        matmul_forward(up, h, b->up_w, b->up_b, DTYPE_F32, N, C, I);
        if (c->qwen2) {  // fc1, quick_gelu
            for (int64_t i = 0; i < N * I; i++) g[i] = up[i] / (1.0f + expf(-1.702f * up[i]));
        } else {  // SwiGLU
            matmul_forward(g, h, b->gate_w, b->gate_b, DTYPE_F32, N, C, I);
            glu_forward(g, g, up, N * I, GLU_SILU);
        }
        matmul_forward(o, g, b->down_w, b->down_b, DTYPE_F32, N, I, C);
        residual_forward(x, o, N * C);
    }
    // each unit's U patches back to the image's order
    for (int64_t u = 0; u < units; u++)
        memcpy(hidden + index[u] * U * C, x + u * U * C, (size_t)(U * C) * sizeof *hidden);
    free(x), free(cs), free(h), free(qkv), free(att), free(o), free(g), free(up);
    free(index), free(wseg), free(fseg);
}

// The merger's forward on be, keeping what its backward reads: h (units, U*C) the normed input, z (units, U*C)
// before GELU (NULL: not kept), y (units, out_hidden); a (units, U*C) is scratch.
static void merge_forward(const Backend *be, const VisionConfig *c, const VisionMerger *w, const float *hidden,
                          int64_t units, float *h, float *z, float *a, float *y) {
    int64_t C = c->hidden, M4 = C * c->merge * c->merge;
    if (w->ln_q_b) be->layernorm_forward(be, h, hidden, w->ln_q, w->ln_q_b, units * M4 / C, C, c->eps);
    else be->rmsnorm_forward(be, h, hidden, w->ln_q, DTYPE_F32, units * M4 / C, C, c->eps, 0.0f);
    be->matmul_forward(be, a, h, w->w0, w->b0, DTYPE_F32, units, M4, M4);
    if (z) be->copy(be, z, a, (size_t)(units * M4) * sizeof *z);
    be->gelu_forward(be, a, a, units * M4);
    be->matmul_forward(be, y, a, w->w2, w->b2, DTYPE_F32, units, M4, c->out_hidden);
}

// n floats of be's memory (at least one).
static float *floats(const Backend *be, int64_t n) { return be->alloc(be, (size_t)(n > 0 ? n : 1) * sizeof(float)); }

void vision_merge(const Backend *be, const VisionConfig *c, const VisionMerger *w, const float *hidden, int64_t units,
                  float *out) {
    int64_t M4 = (int64_t)c->hidden * c->merge * c->merge;
    float *h = floats(be, units * M4), *a = floats(be, units * M4);
    merge_forward(be, c, w, hidden, units, h, NULL, a, out);
    be->free(be, h);
    be->free(be, a);
}

void vision_merge_backward(const Backend *be, const VisionConfig *c, const VisionMerger *w, const float *hidden,
                           int64_t units, const float *dout, const VisionMergerGrads *dw) {
    int64_t C = c->hidden, M4 = C * c->merge * c->merge, O = c->out_hidden, n = units * M4;
    float *h = floats(be, n), *z = floats(be, n), *a = floats(be, n), *y = floats(be, units * O);
    float *da = floats(be, n), *dh = floats(be, n), *dx = floats(be, n);  // zeroed: the backward ops add
    merge_forward(be, c, w, hidden, units, h, z, a, y);  // a = GELU(z)
    be->matmul_backward(be, da, dw->w2, dw->b2, dout, a, w->w2, DTYPE_F32, units, M4, O);
    be->gelu_backward(be, da, da, z, n);
    be->matmul_backward(be, dh, dw->w0, dw->b0, da, h, w->w0, DTYPE_F32, units, M4, M4);
    // the tower below is frozen: the norm's input gradient (dx) is not needed, only its weights'
    if (w->ln_q_b) be->layernorm_backward(be, NULL, dw->ln_q, dw->ln_q_b, dh, hidden, w->ln_q, n / C, C, c->eps);
    else be->rmsnorm_backward(be, dx, dw->ln_q, dh, hidden, w->ln_q, DTYPE_F32, n / C, C, c->eps, 0.0f);
    float *bufs[] = {h, z, a, y, da, dh, dx};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
}

void vision_forward(const Vision *v, const float *patches, const int grid[3], float *out) {
    const VisionConfig *c = &v->cfg;
    int64_t units = (int64_t)grid[0] * grid[1] * grid[2] / (c->merge * c->merge);
    float *hidden = xmalloc((size_t)(units * c->merge * c->merge * c->hidden) * sizeof *hidden + 1);
    vision_hidden(v, patches, grid, hidden);
    vision_merge(backend_cpu(), c, &v->merger, hidden, units, out);
    free(hidden);
}
