#include "model/lora.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/rng.h"
#include "base/util.h"
#include "io/safetensors.h"
#include "nn/gemm.h"

static const char *const NAMES[LORA_TARGETS] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                "gate_proj", "up_proj", "down_proj"};
static const char *const SHORT[LORA_TARGETS] = {"q", "k", "v", "o", "gate", "up", "down"};

const char *lora_target_name(LoraTarget t) { return NAMES[t]; }

int lora_targets_add(unsigned *mask, const char *name) {
    if (strcmp(name, "all-linear") == 0) {
        *mask |= (1u << LORA_TARGETS) - 1;
        return 1;
    }
    for (int t = 0; t < LORA_TARGETS; t++)
        if (strcmp(name, NAMES[t]) == 0 || strcmp(name, SHORT[t]) == 0) {
            *mask |= 1u << t;
            return 1;
        }
    return 0;
}

static int adapted(const Lora *lo, LoraTarget t) { return (lo->spec.targets >> t) & 1u; }

// Sizes and offsets of spec's adapters for config c; params stays NULL.
static void lora_layout(Lora *lo, const DecoderConfig *c, const LoraSpec *spec) {
    memset(lo, 0, sizeof *lo);
    lo->spec = *spec;
    lo->scale = (float)(spec->alpha / (double)spec->rank);
    lo->layers = c->layers;
    int64_t C = c->hidden, Q = c->heads * c->head_dim, KV = c->kv_heads * c->head_dim, I = c->inter;
    const int64_t in[LORA_TARGETS] = {C, C, C, Q, C, C, I}, out[LORA_TARGETS] = {Q, KV, KV, C, I, I, C};
    size_t off = 0;
    for (int t = 0; t < LORA_TARGETS; t++) {
        lo->in[t] = in[t];
        lo->out[t] = out[t];
        int64_t r = adapted(lo, (LoraTarget)t) ? spec->rank : 0;
        lo->a[t] = off;
        off += (size_t)(c->layers * r * in[t]);
        lo->b[t] = off;
        off += (size_t)(c->layers * out[t] * r);
    }
    lo->n = off;
}

void lora_init(Lora *lo, const DecoderConfig *c, const LoraSpec *spec, uint64_t seed) {
    if (spec->rank < 1 || !spec->targets) die("internal: lora_init with rank %lld", (long long)spec->rank);
    lora_layout(lo, c, spec);
    lo->params = xcalloc(lo->n ? lo->n : 1, 4);
    lo->be = backend_cpu();
    Rng rng;
    rng_init(&rng, seed);
    for (int t = 0; t < LORA_TARGETS; t++) {
        float bound = (float)(1.0 / sqrt((double)lo->in[t]));  // kaiming_uniform_(a=sqrt(5)): gain sqrt(1/3)
        size_t n = lo->b[t] - lo->a[t];
        for (size_t i = 0; i < n; i++) lo->params[lo->a[t] + i] = (2.0f * rng_next_float(&rng) - 1.0f) * bound;
    }
}

size_t lora_params(const DecoderConfig *c, const LoraSpec *spec) {
    Lora lo;
    lora_layout(&lo, c, spec);
    return lo.n;
}

void lora_free(Lora *lo) {
    if (lo->be && lo->be->on_device) lo->be->free(lo->be, lo->params);
    else free(lo->params);
    memset(lo, 0, sizeof *lo);
}

void lora_to_backend(Lora *lo, const Backend *be) {
    if (!be->on_device || be == lo->be) return;
    size_t bytes = (lo->n ? lo->n : 1) * sizeof(float);
    float *dev = be->alloc(be, bytes);
    be->upload(be, dev, lo->params, bytes);
    free(lo->params);
    lo->params = dev;
    lo->be = be;
}

const Lora *lora_host(const Lora *lo, Lora *copy) {
    if (!lo->be || !lo->be->on_device) return lo;
    *copy = *lo;
    copy->params = xmalloc((lo->n ? lo->n : 1) * sizeof(float));
    lo->be->download(lo->be, copy->params, lo->params, lo->n * sizeof(float));
    copy->be = backend_cpu();
    return copy;
}

int lora_tensors(const Lora *lo, DecoderTensor *out) {
    int n = 0;
    for (int t = 0; t < LORA_TARGETS; t++) {
        if (!adapted(lo, (LoraTarget)t)) continue;
        const char *block = t <= LORA_O ? "self_attn" : "mlp";
        int64_t r = lo->spec.rank;
        for (int64_t l = 0; l < lo->layers; l++)
            for (int ab = 0; ab < 2; ab++, n++) {
                if (!out) continue;
                DecoderTensor *x = &out[n];
                snprintf(x->name, sizeof x->name, "base_model.model.model.layers.%lld.%s.%s.lora_%c.weight",
                         (long long)l, block, NAMES[t], ab ? 'B' : 'A');
                x->ndim = 2;
                x->shape[0] = ab ? lo->out[t] : r;
                x->shape[1] = ab ? r : lo->in[t];
                x->off = ab ? lo->b[t] + (size_t)(l * lo->out[t] * r) : lo->a[t] + (size_t)(l * r * lo->in[t]);
                x->data = lo->params && (!lo->be || !lo->be->on_device) ? lo->params + x->off : NULL;
            }
    }
    return n;
}

static DecoderTensor *tensor_list(const Lora *lo, int *n) {
    *n = lora_tensors(lo, NULL);
    DecoderTensor *ts = xmalloc((size_t)(*n ? *n : 1) * sizeof *ts);
    lora_tensors(lo, ts);
    return ts;
}

void lora_save(const Lora *dlo, const char *dir, const char *base_model) {
    Lora copy;
    const Lora *lo = lora_host(dlo, &copy);
    int n;
    DecoderTensor *ts = tensor_list(lo, &n);
    StWriteTensor *ws = xcalloc((size_t)(n ? n : 1), sizeof *ws);
    for (int i = 0; i < n; i++) {
        ws[i] = (StWriteTensor){.name = ts[i].name, .ndim = 2, .data = ts[i].data};
        memcpy(ws[i].shape, ts[i].shape, sizeof ts[i].shape);
    }
    char *path = path_join(dir, "adapter_model.safetensors");
    safetensors_write(path, ws, n, DTYPE_F32);
    free(path);
    cJSON *r = cJSON_CreateObject(), *tm = cJSON_CreateArray();
    if (!r || !tm) die("out of memory");
    for (int t = 0; t < LORA_TARGETS; t++)
        if (adapted(lo, (LoraTarget)t)) cJSON_AddItemToArray(tm, cJSON_CreateString(NAMES[t]));
    cJSON_AddStringToObject(r, "peft_type", "LORA");
    cJSON_AddStringToObject(r, "task_type", "CAUSAL_LM");
    cJSON_AddStringToObject(r, "base_model_name_or_path", base_model ? base_model : "");
    cJSON_AddNumberToObject(r, "r", (double)lo->spec.rank);
    cJSON_AddNumberToObject(r, "lora_alpha", lo->spec.alpha);
    cJSON_AddNumberToObject(r, "lora_dropout", 0.0);
    cJSON_AddItemToObject(r, "target_modules", tm);
    cJSON_AddStringToObject(r, "bias", "none");
    cJSON_AddBoolToObject(r, "fan_in_fan_out", 0);
    cJSON_AddBoolToObject(r, "use_rslora", 0);
    cJSON_AddBoolToObject(r, "use_dora", 0);
    cJSON_AddBoolToObject(r, "inference_mode", 1);
    cJSON_AddBoolToObject(r, "init_lora_weights", 1);
    cJSON_AddNullToObject(r, "modules_to_save");
    path = path_join(dir, "adapter_config.json");
    json_save_file(path, r);  // last: a directory with a config has its weights
    free(path);
    cJSON_Delete(r);
    free(ws);
    free(ts);
    if (lo == &copy) lora_free(&copy);
}

// adapter_config.json -> spec; dies naming the key on what grpo cannot run.
static void read_config(LoraSpec *spec, const char *path) {
    cJSON *r = json_load_file(path, FILE_MAX_JSON);
    if (!cJSON_IsObject(r)) die("%s: not a JSON object", path);
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(r, "peft_type");
    if (!cJSON_IsString(pt) || strcmp(pt->valuestring, "LORA") != 0)
        die("%s: key \"peft_type\" must be \"LORA\" (only LoRA adapters are supported)", path);
    const char *off[] = {"use_dora", "use_rslora", "fan_in_fan_out"};
    for (size_t i = 0; i < sizeof off / sizeof off[0]; i++)
        if (json_get_bool_or(r, off[i], 0, path)) die("%s: key \"%s\": true is not supported", path, off[i]);
    const cJSON *bias = cJSON_GetObjectItemCaseSensitive(r, "bias");
    if (bias && !cJSON_IsNull(bias) && !(cJSON_IsString(bias) && strcmp(bias->valuestring, "none") == 0))
        die("%s: key \"bias\": only \"none\" is supported", path);
    const char *empty[] = {"modules_to_save", "rank_pattern", "alpha_pattern", "layers_to_transform"};
    for (size_t i = 0; i < sizeof empty / sizeof empty[0]; i++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(r, empty[i]);
        if (x && !cJSON_IsNull(x) && cJSON_GetArraySize(x) > 0)
            die("%s: key \"%s\" is not supported (it must be null or empty)", path, empty[i]);
    }
    spec->rank = json_get_int(r, "r", path);
    spec->alpha = json_get_number(r, "lora_alpha", path);
    if (spec->rank < 1 || spec->rank > 65536) die("%s: key \"r\" must be in [1, 65536]", path);
    if (!isfinite(spec->alpha) || spec->alpha == 0) die("%s: key \"lora_alpha\" must be a non-zero number", path);
    spec->targets = 0;
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(r, "target_modules");
    if (cJSON_IsString(tm)) {
        if (!lora_targets_add(&spec->targets, tm->valuestring))
            die("%s: key \"target_modules\": unknown module \"%s\"", path, tm->valuestring);
    } else if (cJSON_IsArray(tm) && cJSON_GetArraySize(tm) > 0) {
        for (const cJSON *x = tm->child; x; x = x->next)
            if (!cJSON_IsString(x) || !lora_targets_add(&spec->targets, x->valuestring))
                die("%s: key \"target_modules\": unknown module %s%s%s (q_proj k_proj v_proj o_proj gate_proj "
                    "up_proj down_proj)", path, cJSON_IsString(x) ? "\"" : "",
                    cJSON_IsString(x) ? x->valuestring : "(not a string)", cJSON_IsString(x) ? "\"" : "");
    } else {
        die("%s: key \"target_modules\" must be a non-empty list of module names", path);
    }
    cJSON_Delete(r);
}

void lora_read_spec(LoraSpec *spec, const char *dir) {
    char *cp = path_join(dir, "adapter_config.json");
    read_config(spec, cp);
    free(cp);
}

void lora_spec_from_adapter(LoraSpec *spec, const char *adapter, const char *rank_key, int targets_given,
                            const char *targets_key) {
    LoraSpec file;
    lora_read_spec(&file, adapter);
    if (spec->rank && spec->rank != file.rank)
        die("%s %lld: adapter %s has r = %lld", rank_key, (long long)spec->rank, adapter, (long long)file.rank);
    if (targets_given && spec->targets != file.targets)
        die("%s: adapter %s adapts other modules (its adapter_config.json decides)", targets_key, adapter);
    *spec = file;
}

void lora_load(Lora *lo, const DecoderConfig *c, const char *dir) {
    char *wp = path_join(dir, "adapter_model.safetensors");
    LoraSpec spec;
    lora_read_spec(&spec, dir);
    lora_layout(lo, c, &spec);
    SafeTensors st;
    safetensors_open(&st, wp);
    int n;
    DecoderTensor *ts = tensor_list(lo, &n);
    lo->params = xcalloc(lo->n ? lo->n : 1, 4);
    lo->be = backend_cpu();
    for (int i = 0; i < n; i++) {
        const StTensor *x = safetensors_find(&st, ts[i].name);
        if (!x) die("%s: missing tensor \"%s\" (adapter_config.json's target_modules need it)", wp, ts[i].name);
        if (x->ndim != 2 || x->shape[0] != ts[i].shape[0] || x->shape[1] != ts[i].shape[1])
            die("%s: tensor \"%s\" must have shape [%lld, %lld] (r = %lld)", wp, ts[i].name,
                (long long)ts[i].shape[0], (long long)ts[i].shape[1], (long long)spec.rank);
        dtype_to_f32(x->dtype, x->data, lo->params + ts[i].off, (size_t)x->numel);
    }
    // Every tensor must be one grpo applies: an adapter on another module would silently be dropped.
    for (int j = 0; j < st.n_tensors; j++) {
        int known = 0;
        for (int i = 0; i < n && !known; i++) known = strcmp(st.tensors[j].name, ts[i].name) == 0;
        if (!known) die("%s: tensor \"%s\" is not a LoRA weight of this model's adapted modules", wp, st.tensors[j].name);
    }
    safetensors_close(&st);
    free(ts);
    free(wp);
}

void lora_attach(Decoder *m, const Lora *lo) {
    const Backend *lb = lo->be ? lo->be : backend_cpu();  // NULL: made by hand on the host
    if (lb != m->be) die("internal: adapters on %s attached to a model on %s", lb->name, m->be->name);
    if (lo->layers != m->cfg.layers) die("internal: adapters of %lld layers on a %lld-layer model",
                                         (long long)lo->layers, (long long)m->cfg.layers);
    m->lora = lo;
    m->cfg.lora_rank = lo->spec.rank;
}

static const float *lora_a(const Lora *lo, LoraTarget t, int64_t l) {
    return lo->params + lo->a[t] + (size_t)(l * lo->spec.rank * lo->in[t]);
}

static const float *lora_b(const Lora *lo, LoraTarget t, int64_t l) {
    return lo->params + lo->b[t] + (size_t)(l * lo->out[t] * lo->spec.rank);
}

void lora_merge(Decoder *m, const Lora *lo) {
    if (m->dtype != DTYPE_F32) die("internal: lora_merge into a %s model", dtype_name(m->dtype));
    const DecoderLayout *w = &m->w;
    const size_t base[LORA_TARGETS] = {w->wq, w->wk, w->wv, w->wo, w->wgate, w->wup, w->wdown};
    for (int t = 0; t < LORA_TARGETS; t++) {
        if (!adapted(lo, (LoraTarget)t)) continue;
        int64_t in = lo->in[t], out = lo->out[t];
        for (int64_t l = 0; l < lo->layers; l++) {
            float *W = (float *)m->params + base[t] + (size_t)(l * out * in);  // (out, in) += scale * B (out, r) A (r, in)
            gemm(DTYPE_F32, 0, 0, out, in, lo->spec.rank, lo->scale, lora_b(lo, (LoraTarget)t, l), lo->spec.rank,
                 lora_a(lo, (LoraTarget)t, l), in, NULL, 1, W, in);
        }
    }
}

void lora_forward(const Backend *be, const Lora *lo, LoraTarget t, int64_t l, const float *x, int64_t N, float *out,
                  float *u) {
    if (!lo || !adapted(lo, t) || N == 0) return;
    int64_t r = lo->spec.rank, in = lo->in[t], oc = lo->out[t];
    be->gemm(be, 0, 1, N, r, in, 1.0f, x, in, lora_a(lo, t, l), in, 0, u, r);
    be->gemm(be, 0, 1, N, oc, r, lo->scale, u, r, lora_b(lo, t, l), r, 1, out, oc);
}

void lora_backward(const Backend *be, const Lora *lo, float *grads, LoraTarget t, int64_t l, const float *x,
                   const float *dout, int64_t N, float *dx, float *u, float *du) {
    if (!lo || !adapted(lo, t) || N == 0) return;
    int64_t r = lo->spec.rank, in = lo->in[t], oc = lo->out[t];
    float *dA = grads + (lora_a(lo, t, l) - lo->params), *dB = grads + (lora_b(lo, t, l) - lo->params);
    be->gemm(be, 0, 1, N, r, in, 1.0f, x, in, lora_a(lo, t, l), in, 0, u, r);             // u = x A^T
    be->gemm(be, 1, 0, oc, r, N, lo->scale, dout, oc, u, r, 1, dB, r);                    // dB += s dout^T u
    be->gemm(be, 0, 0, N, r, oc, lo->scale, dout, oc, lora_b(lo, t, l), r, 0, du, r);     // du = s dout B
    be->gemm(be, 1, 0, r, in, N, 1.0f, du, r, x, in, 1, dA, in);                          // dA += du^T x
    be->gemm(be, 0, 0, N, in, r, 1.0f, du, r, lora_a(lo, t, l), in, 1, dx, in);           // dx += du A
}
