// The parameter slab: its layout (HF tensor names and shapes), build and free, moves between backends, load,
// random initialisation and save.
#include "model/decoder.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/rng.h"
#include "base/util.h"
#include "io/hf_weights.h"
#include "io/safetensors.h"

// ---------------------------------------------------------------------------------------------
// parameters

typedef struct {
    const char *fmt;  // HF name; %d is the layer
    int per_layer;
    int64_t rows, cols;  // cols 0: a vector
} KindSpec;

enum { N_KINDS = 25 };

// Kinds with 0 rows (biases without attn_bias, q/k norms without qk_norm, post-norms without post_norms, a tied
// head) have no storage. Gemma names its pre-MLP norm pre_feedforward_layernorm and its norm of the attention's
// output post_attention_layernorm (everyone else's pre-MLP norm).
static void kind_specs(const DecoderConfig *c, KindSpec k[N_KINDS]) {
    int64_t C = c->hidden, D = c->head_dim, Q = c->heads * D, KV = c->kv_heads * D, I = c->inter, V = c->vocab;
    int64_t bias = c->attn_bias ? 1 : 0, norm = c->qk_norm ? D : 0, post = c->post_norms ? C : 0;
    int64_t mh = c->merger_in, m4 = c->merger_in * c->merger_units, mc = mh ? C : 0;
    int64_t mb = c->merger_ln_bias ? mh : 0;
    const KindSpec specs[N_KINDS] = {
        {"model.embed_tokens.weight", 0, V, C},
        {"model.layers.%d.input_layernorm.weight", 1, C, 0},
        {"model.layers.%d.self_attn.q_proj.weight", 1, Q, C},
        {"model.layers.%d.self_attn.q_proj.bias", 1, bias * Q, 0},
        {"model.layers.%d.self_attn.k_proj.weight", 1, KV, C},
        {"model.layers.%d.self_attn.k_proj.bias", 1, bias * KV, 0},
        {"model.layers.%d.self_attn.v_proj.weight", 1, KV, C},
        {"model.layers.%d.self_attn.v_proj.bias", 1, bias * KV, 0},
        {"model.layers.%d.self_attn.o_proj.weight", 1, C, Q},
        {"model.layers.%d.self_attn.q_norm.weight", 1, norm, 0},
        {"model.layers.%d.self_attn.k_norm.weight", 1, norm, 0},
        {post ? "model.layers.%d.pre_feedforward_layernorm.weight" : "model.layers.%d.post_attention_layernorm.weight",
         1, C, 0},
        {"model.layers.%d.mlp.gate_proj.weight", 1, I, C},
        {"model.layers.%d.mlp.up_proj.weight", 1, I, C},
        {"model.layers.%d.mlp.down_proj.weight", 1, C, I},
        {"model.layers.%d.post_attention_layernorm.weight", 1, post, 0},
        {"model.layers.%d.post_feedforward_layernorm.weight", 1, post, 0},
        {"model.norm.weight", 0, C, 0},
        // no storage when tied; a reward model's score head instead
        {c->score_labels ? "score.weight" : "lm_head.weight", 0, c->score_labels ? c->score_labels : c->tied ? 0 : V, C},
        {"visual.merger.ln_q.weight", 0, mh, 0},  // a trained merger (merger_in), else no storage
        {"visual.merger.ln_q.bias", 0, mb, 0},    // Qwen2-VL's LayerNorm
        {"visual.merger.mlp.0.weight", 0, m4, m4},
        {"visual.merger.mlp.0.bias", 0, m4, 0},
        {"visual.merger.mlp.2.weight", 0, mc, m4},
        {"visual.merger.mlp.2.bias", 0, mc, 0},
    };
    memcpy(k, specs, sizeof specs);
}

static int64_t kind_numel(const KindSpec *k) { return k->rows * (k->cols ? k->cols : 1); }

static void layout_fields(DecoderLayout *w, size_t *f[N_KINDS]) {
    size_t *list[N_KINDS] = {&w->embed, &w->ln1, &w->wq, &w->bq, &w->wk, &w->bk, &w->wv, &w->bv, &w->wo,
                             &w->qnorm, &w->knorm, &w->ln2, &w->wgate, &w->wup, &w->wdown, &w->post_attn_norm,
                             &w->post_mlp_norm, &w->norm, &w->lm_head,
                             &w->merger_ln_q, &w->merger_ln_q_b, &w->merger_w0, &w->merger_b0, &w->merger_w2,
                             &w->merger_b2};
    memcpy(f, list, sizeof list);
}

size_t decoder_layout(const DecoderConfig *c, DecoderLayout *w) {
    KindSpec k[N_KINDS];
    kind_specs(c, k);
    size_t *f[N_KINDS];
    layout_fields(w, f);
    size_t total = 0;
    for (int i = 0; i < N_KINDS; i++) {
        *f[i] = total;
        total += (size_t)kind_numel(&k[i]) * (k[i].per_layer ? (size_t)c->layers : 1);
    }
    if (c->tied && !c->score_labels) w->lm_head = w->embed;
    return total;
}

void decoder_build(Decoder *m, const DecoderConfig *c, DType dtype) { decoder_build_on(m, c, dtype, backend_cpu()); }

void decoder_build_on(Decoder *m, const DecoderConfig *c, DType dtype, const Backend *be) {
    if (dtype != DTYPE_F32 && dtype != DTYPE_BF16) die("internal: a %s model slab", dtype_name(dtype));
    memset(m, 0, sizeof *m);
    m->cfg = *c;
    m->dtype = dtype;
    m->n_params = decoder_layout(c, &m->w);
    m->be = be;
    size_t bytes = m->n_params * dtype_size(dtype);
    m->params = be->on_device ? be->alloc(be, bytes) : xcalloc(m->n_params, dtype_size(dtype));
}

const Decoder *decoder_host(const Decoder *m, Decoder *copy) {
    if (!m->be || !m->be->on_device) return m;
    *copy = *m;
    size_t bytes = m->n_params * dtype_size(m->dtype);
    copy->params = xmalloc(bytes ? bytes : 1);
    m->be->download(m->be, copy->params, m->params, bytes);
    copy->be = backend_cpu();
    copy->lora = NULL;
    copy->q8 = NULL;
    return copy;
}

void decoder_free(Decoder *m) {
    if (m->be && m->be->on_device) m->be->free(m->be, m->params);
    else free(m->params);
    memset(m, 0, sizeof *m);
}

void decoder_to_backend(Decoder *m, const Backend *be) {
    if (!be->on_device || be == m->be) return;
    size_t bytes = m->n_params * dtype_size(m->dtype);
    void *dev = be->alloc(be, bytes);
    be->upload(be, dev, m->params, bytes);
    free(m->params);
    m->params = dev;
    m->be = be;
}

int decoder_tensors(const Decoder *m, DecoderTensor *out) {
    KindSpec k[N_KINDS];
    kind_specs(&m->cfg, k);
    DecoderLayout w;
    decoder_layout(&m->cfg, &w);
    size_t *f[N_KINDS];
    layout_fields(&w, f);
    int n = 0;
    for (int i = 0; i < N_KINDS; i++) {
        int64_t numel = kind_numel(&k[i]);
        if (numel == 0) continue;
        for (int l = 0; l < (k[i].per_layer ? (int)m->cfg.layers : 1); l++, n++) {
            if (!out) continue;
            DecoderTensor *t = &out[n];
            snprintf(t->name, sizeof t->name, k[i].fmt, l);
            t->ndim = k[i].cols ? 2 : 1;
            t->shape[0] = k[i].rows;
            t->shape[1] = k[i].cols;
            t->off = *f[i] + (size_t)(l * numel);
            int host = m->params && m->dtype == DTYPE_F32 && (!m->be || !m->be->on_device);
            t->data = host ? (float *)m->params + t->off : NULL;
        }
    }
    return n;
}

// The tensor table in a fresh array (free it); *n its length.
static DecoderTensor *tensor_list(const Decoder *m, int *n) {
    *n = decoder_tensors(m, NULL);
    DecoderTensor *ts = xmalloc((size_t)*n * sizeof *ts);
    decoder_tensors(m, ts);
    return ts;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t len = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && len < n; d++)
        len += (size_t)snprintf(buf + len, n - len, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (len < n) snprintf(buf + len, n - len, "]");
}

// A layer's tensor that c's layout has no place for (the biases of a Qwen2 file called Llama, the q/k norms of a
// Qwen3 file called Qwen2, attention_bias left out) would be dropped without a word: dies naming it. Older
// checkpoints' rotary_emb.inv_freq buffers are not weights. src: the n tensors the layout reads.
static void refuse_unplaced(const HfWeights *hw, const StTensor *const *src, int n, const DecoderConfig *c) {
    for (int f = 0; f < hw->n_files; f++)
        for (int t = 0; t < hw->files[f].n_tensors; t++) {
            const char *name = hw->files[f].tensors[t].name;
            if (!strstr(name, "layers.") || strstr(name, "visual.") || strstr(name, "rotary_emb.")) continue;
            int used = 0;
            for (int i = 0; i < n && !used; i++) used = !strcmp(src[i]->name, name);
            if (!used)
                die("%s: tensor \"%s\" has no place in a %s (a part config.json does not declare)",
                    hw->files[f].path, name, decoder_arch_name(c));
        }
}

void decoder_load(Decoder *m, const char *dir, DType dtype) {
    DecoderConfig c;
    decoder_config_load(&c, dir);  // refuses a VL model before reading any weight
    decoder_load_vl(m, dir, dtype);
}

void decoder_load_vl(Decoder *m, const char *dir, DType dtype) {
    DecoderConfig c;
    decoder_config_load_vl(&c, dir);
    decoder_load_config(m, dir, dtype, &c);
}

void decoder_load_config(Decoder *m, const char *dir, DType dtype, const DecoderConfig *config) {
    DecoderConfig c = *config;
    HfWeights hw;
    hf_weights_open(&hw, dir);
    // Check every tensor against config.json before allocating the slab, so a wrong config
    // reads as a shape error naming the tensor, not as "out of memory".
    Decoder shell = {.cfg = c};
    int n;
    DecoderTensor *ts = tensor_list(&shell, &n);
    const StTensor **src = xmalloc((size_t)n * sizeof *src);
    for (int i = 0; i < n; i++) {
        const char *file = NULL;
        const StTensor *st = src[i] = hf_weights_find(&hw, ts[i].name, &file);
        char vl_name[128];  // a VL checkpoint of transformers 5: model.language_model.*, model.visual.*
        if (!st && !strncmp(ts[i].name, "model.", 6))
            snprintf(vl_name, sizeof vl_name, "model.language_model.%s", ts[i].name + 6);
        else if (!st)
            snprintf(vl_name, sizeof vl_name, "model.%s", ts[i].name);
        if (!st) st = src[i] = hf_weights_find(&hw, vl_name, &file);
        if (!st) die("%s: missing tensor \"%s\"", dir, ts[i].name);
        int same = st->ndim == ts[i].ndim;
        for (int d = 0; same && d < st->ndim; d++) same = st->shape[d] == ts[i].shape[d];
        if (!same) {
            char got[96], want[96];
            shape_str(got, sizeof got, st->ndim, st->shape);
            shape_str(want, sizeof want, ts[i].ndim, ts[i].shape);
            die("%s: tensor \"%s\" has shape %s, config.json implies %s", file, ts[i].name, got, want);
        }
        if (st->dtype == DTYPE_OTHER)
            die("%s: tensor \"%s\" has dtype %s (supported: F32, BF16, F16)", file, ts[i].name, st->dtype_name);
    }
    refuse_unplaced(&hw, src, n, &c);
    decoder_build(m, &c, dtype);
    decoder_tensors(m, ts);
    // A chunk at a time, each chunk's file pages dropped once copied: the file's pages never add more
    // than a chunk to the slab, whatever the tensor's size (the embedding of Qwen2.5 is 0.5 GB in F32).
    enum { LOAD_CHUNK = 1 << 20 };  // elements
    float *tmp = xmalloc(LOAD_CHUNK * sizeof *tmp);
    for (int i = 0; i < n; i++) {
        size_t numel = (size_t)src[i]->numel, es = dtype_size(src[i]->dtype);
        for (size_t j = 0; j < numel; j += LOAD_CHUNK) {
            size_t k = numel - j < LOAD_CHUNK ? numel - j : LOAD_CHUNK;
            const char *from = (const char *)src[i]->data + j * es;
            void *dst = (char *)m->params + (ts[i].off + j) * dtype_size(dtype);
            if (dtype == src[i]->dtype) {  // bf16 into bf16: as stored
                memcpy(dst, from, k * es);
            } else if (dtype == DTYPE_F32) {
                dtype_to_f32(src[i]->dtype, from, dst, k);
            } else {  // through fp32, then rounded once
                dtype_to_f32(src[i]->dtype, from, tmp, k);
                dtype_from_f32(dtype, tmp, dst, k);
            }
            safetensors_release(src[i], (j + k) * es);
        }
    }
    free(tmp);
    free(src);
    free(ts);
    hf_weights_close(&hw);
}

DType decoder_file_dtype(const char *dir) {
    HfWeights hw;
    hf_weights_open(&hw, dir);
    const char *file = NULL;
    const StTensor *st = hf_weights_find(&hw, "model.embed_tokens.weight", &file);
    DType d = st && st->dtype == DTYPE_BF16 ? DTYPE_BF16 : DTYPE_F32;
    hf_weights_close(&hw);
    return d;
}

void decoder_init_random(Decoder *m, uint64_t seed) {
    if (m->dtype != DTYPE_F32) die("internal: decoder_init_random on a %s slab", dtype_name(m->dtype));
    Rng rng;
    rng_init(&rng, seed);
    int n;
    DecoderTensor *ts = tensor_list(m, &n);
    for (int i = 0; i < n; i++) {
        DecoderTensor *t = &ts[i];
        int64_t numel = t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1);
        int is_norm = strstr(t->name, "norm") != NULL;
        for (int64_t j = 0; j < numel; j++)
            t->data[j] = t->ndim == 2 ? (float)m->cfg.init_std * rng_normal(&rng)
                                      : (is_norm ? 1.0f - m->cfg.norm_offset : 0.0f);  // gains of 1
    }
    free(ts);
}

static void config_save(const DecoderConfig *c, const char *dir, DType dtype) {
    cJSON *r = decoder_config_json(c, dtype);
    char *path = path_join(dir, "config.json");
    json_save_file(path, r);
    free(path);
    cJSON_Delete(r);
}

// Whether t is not a tensor of the tower (nor, with skip_merger, of its merger) that vision_tensors keeps.
static int vision_skipped(const StTensor *t, int skip_merger) {
    const char *name = strncmp(t->name, "model.", 6) ? t->name : t->name + 6;
    return strncmp(name, "visual.", 7) || (skip_merger && !strncmp(name, "visual.merger.", 14));
}

// A VL model's frozen vision tower, as model_dir holds it: its tensors under transformers 4's names
// ("visual.*"), in fp32 (malloc'd, with the data), appended to *ws (n of them).
static float *vision_tensors(const char *model_dir, int skip_merger, StWriteTensor **ws, int *n, char ***names) {
    HfWeights hw;
    hf_weights_open(&hw, model_dir);
    size_t total = 0;
    int count = 0;
    for (int f = 0; f < hw.n_files; f++)
        for (int i = 0; i < hw.files[f].n_tensors; i++) {
            const StTensor *t = &hw.files[f].tensors[i];
            if (vision_skipped(t, skip_merger)) continue;
            total += (size_t)t->numel;
            count++;
        }
    if (count == 0) die("%s: a vision-language model without its vision tower (visual.*)", model_dir);
    float *data = xmalloc(total * sizeof *data), *at = data;
    *ws = xrealloc(*ws, (size_t)(*n + count) * sizeof **ws);
    *names = xcalloc((size_t)count, sizeof **names);
    int k = 0;
    for (int f = 0; f < hw.n_files; f++)
        for (int i = 0; i < hw.files[f].n_tensors; i++) {
            const StTensor *t = &hw.files[f].tensors[i];
            if (vision_skipped(t, skip_merger)) continue;
            const char *name = strncmp(t->name, "model.", 6) ? t->name : t->name + 6;
            if (hw.n_map && hf_weights_find(&hw, t->name, NULL) != t) continue;  // a stale copy in a shard
            dtype_to_f32(t->dtype, t->data, at, (size_t)t->numel);
            StWriteTensor *w = &(*ws)[*n + k];
            *w = (StWriteTensor){.name = (*names)[k] = xstrdup(name), .ndim = t->ndim, .data = at};
            memcpy(w->shape, t->shape, sizeof t->shape);
            at += t->numel;
            k++;
        }
    *n += k;
    hf_weights_close(&hw);
    return data;
}

// model_dir's config.json (a VL model's) into dir, its dtype the saved weights'.
static void vl_config_save(const char *model_dir, const char *dir, DType dtype) {
    char *from = path_join(model_dir, "config.json"), *to = path_join(dir, "config.json");
    cJSON *r = json_load_file(from, FILE_MAX_JSON);
    const char *name = dtype == DTYPE_BF16 ? "bfloat16" : "float32";
    static const char *const keys[2] = {"torch_dtype", "dtype"};  // transformers 4's and 5's
    for (int i = 0; i < 2; i++)
        if (cJSON_GetObjectItemCaseSensitive(r, keys[i]))
            cJSON_ReplaceItemInObjectCaseSensitive(r, keys[i], cJSON_CreateString(name));
    json_save_file(to, r);
    cJSON_Delete(r);
    free(from);
    free(to);
}

void decoder_save(const Decoder *dm, const char *dir, DType dtype, const char *vl_from) {
    Decoder copy;
    const Decoder *m = decoder_host(dm, &copy);  // the file is written from host memory
    if (m->dtype != DTYPE_F32) die("internal: decoder_save of a %s slab", dtype_name(m->dtype));
    if (m->cfg.vl && !vl_from) die("internal: decoder_save of a vision-language model without its source");
    int n;
    DecoderTensor *ts = tensor_list(m, &n);
    StWriteTensor *ws = xmalloc((size_t)n * sizeof *ws);
    for (int i = 0; i < n; i++) {
        ws[i] = (StWriteTensor){.name = ts[i].name, .ndim = ts[i].ndim, .data = ts[i].data};
        memcpy(ws[i].shape, ts[i].shape, sizeof ts[i].shape);
    }
    int n_lm = n;
    char **names = NULL;
    float *vision = m->cfg.vl ? vision_tensors(vl_from, m->cfg.merger_in > 0, &ws, &n, &names) : NULL;
    char *path = path_join(dir, "model.safetensors");
    safetensors_write(path, ws, n, dtype);
    // last: a directory with a config has its weights
    if (m->cfg.vl) vl_config_save(vl_from, dir, dtype);
    else config_save(&m->cfg, dir, dtype);
    for (int i = 0; names && i < n - n_lm; i++) free(names[i]);
    free(names);
    free(vision);
    free(path);
    free(ws);
    free(ts);
    if (m == &copy) decoder_free(&copy);
}

