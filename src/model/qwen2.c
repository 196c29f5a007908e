#include "model/qwen2.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/json.h"
#include "base/rng.h"
#include "base/util.h"
#include "io/hf_weights.h"
#include "io/safetensors.h"
#include "model/lora.h"
#include "model/vl_rope.h"
#include "nn/ops.h"
#include "nn/q8.h"
#include "nn/skinny.h"

// ---------------------------------------------------------------------------------------------
// config

static const struct {
    const char *name;
    Qwen2Config c;
} presets[] = {
    // vocab, hidden, inter, layers, heads, kv_heads, head_dim, max_pos, theta, eps, tied, bos, eos, init_std,
    // attn_bias, qk_norm
    {"tiny", {151936, 64, 176, 2, 4, 2, 16, 2048, 1e6, 1e-6f, 1, 151643, 151645, 0.02, 1, 0}},
    {"qwen2.5-0.5b", {151936, 896, 4864, 24, 14, 2, 64, 32768, 1e6, 1e-6f, 1, 151643, 151645, 0.02, 1, 0}},
    {"qwen2.5-1.5b", {151936, 1536, 8960, 28, 12, 2, 128, 32768, 1e6, 1e-6f, 1, 151643, 151645, 0.02, 1, 0}},
    {"qwen2.5-3b", {151936, 2048, 11008, 36, 16, 2, 128, 32768, 1e6, 1e-6f, 1, 151643, 151645, 0.02, 1, 0}},
    {"qwen2.5-7b", {152064, 3584, 18944, 28, 28, 4, 128, 32768, 1e6, 1e-6f, 0, 151643, 151645, 0.02, 1, 0}},
    {"qwen3-tiny", {151936, 64, 176, 2, 4, 2, 32, 2048, 1e6, 1e-6f, 1, 151643, 151645, 0.02, 0, 1}},
    {"qwen3-0.6b", {151936, 1024, 3072, 28, 16, 8, 128, 40960, 1e6, 1e-6f, 1, 151643, 151645, 0.02, 0, 1}},
    {"qwen3-1.7b", {151936, 2048, 6144, 28, 16, 8, 128, 40960, 1e6, 1e-6f, 1, 151643, 151645, 0.02, 0, 1}},
    {"qwen3-4b", {151936, 2560, 9728, 36, 32, 8, 128, 40960, 1e6, 1e-6f, 1, 151643, 151645, 0.02, 0, 1}},
    {"qwen3-8b", {151936, 4096, 12288, 36, 32, 8, 128, 40960, 1e6, 1e-6f, 0, 151643, 151645, 0.02, 0, 1}},
};

int qwen2_config_preset(Qwen2Config *c, const char *name) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(presets[i].name, name) == 0) {
            *c = presets[i].c;
            return 1;
        }
    return 0;
}

const char *qwen2_preset_names(void) {
    return "tiny, qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-3b, qwen2.5-7b, "
           "qwen3-tiny, qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b";
}

void qwen2_config_check(const Qwen2Config *c, const char *where) {
    // Bounds far above any real Qwen2 keep every size product below 2^63.
    const struct { const char *key; int64_t v, max; } sizes[] = {
        {"vocab_size", c->vocab, INT32_MAX},          {"hidden_size", c->hidden, 1 << 20},
        {"intermediate_size", c->inter, 1 << 22},     {"num_hidden_layers", c->layers, 1 << 12},
        {"num_attention_heads", c->heads, 1 << 12},   {"num_key_value_heads", c->kv_heads, 1 << 12},
        {"max_position_embeddings", c->max_pos, 1 << 24}, {"head_dim", c->head_dim, 1 << 12},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i].v < 1 || sizes[i].v > sizes[i].max)
            die("%s: %s = %lld is outside [1, %lld]", where, sizes[i].key, (long long)sizes[i].v, (long long)sizes[i].max);
    if (c->heads % c->kv_heads)
        die("%s: num_attention_heads %lld is not a multiple of num_key_value_heads %lld", where, (long long)c->heads,
            (long long)c->kv_heads);
    if (c->heads / c->kv_heads > 128) die("%s: more than 128 query heads per key/value head is unsupported", where);
    if (c->head_dim % 2) die("%s: head dimension %lld must be even for RoPE", where, (long long)c->head_dim);
    if (!(c->rope_theta > 0) || !(c->eps > 0)) die("%s: rope_theta and rms_norm_eps must be positive", where);
}

// A string key, NULL when absent or null; any other type dies naming the key.
static const char *json_str(const cJSON *obj, const char *key, const char *where) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!it || cJSON_IsNull(it)) return NULL;
    if (!cJSON_IsString(it)) die("%s: key \"%s\" must be a string", where, key);
    return it->valuestring;
}

// eos_token_id may be an int or a list of ints; we keep the first.
static int64_t token_id_or(const cJSON *root, const char *key, const char *where) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (cJSON_IsArray(it)) it = cJSON_GetArrayItem(it, 0);
    if (!it || cJSON_IsNull(it)) return -1;
    int64_t v;
    if (!json_as_int(it, 0, INT32_MAX, &v)) die("%s: key \"%s\" must be a token id", where, key);
    return v;
}

void qwen2_config_load(Qwen2Config *c, const char *dir) {
    qwen2_config_load_vl(c, dir);
    if (c->vl)
        die("%s: a vision-language model: this command does not take them yet (grpo train, sft, generate and "
            "score do)", dir);
}

void qwen2_config_load_vl(Qwen2Config *c, const char *dir) {
    qwen2_config_read(c, dir);
    if (c->score_labels)
        die("%s: a reward model (a sequence-classification checkpoint) scores responses "
            "(reward.reward_model.model_path, grpo score); it cannot generate or be trained as the policy", dir);
}

void qwen2_config_load_rm(Qwen2Config *c, const char *dir) {
    qwen2_config_read(c, dir);
    if (!c->score_labels)
        die("%s: not a reward model (architectures Qwen2ForSequenceClassification or Qwen3ForSequenceClassification)",
            dir);
}

// transformers' num_labels: the size of id2label, 2 when the config has none (PretrainedConfig's default).
static int64_t num_labels(const cJSON *root, const char *path) {
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(root, "id2label");
    if (!ids || cJSON_IsNull(ids)) return json_get_int_or(root, "num_labels", 2, path);
    if (!cJSON_IsObject(ids)) die("%s: id2label must be an object", path);
    return cJSON_GetArraySize(ids);
}

void qwen2_config_read(Qwen2Config *c, const char *dir) {
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) die("model directory %s does not exist", dir);
    char *path = path_join(dir, "config.json");
    cJSON *root = json_load_file(path, FILE_MAX_JSON);
    if (!cJSON_IsObject(root)) die("%s: not a JSON object", path);
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const char *model_type = json_str(root, "model_type", path);
    int qwen3, vl, score = 0;
    if (cJSON_IsArray(arch)) {
        const cJSON *a0 = cJSON_GetArrayItem(arch, 0);
        const char *name = cJSON_IsString(a0) ? a0->valuestring : "?";
        score = !strcmp(name, "Qwen2ForSequenceClassification") || !strcmp(name, "Qwen3ForSequenceClassification");
        qwen3 = !strcmp(name, "Qwen3ForCausalLM") || !strcmp(name, "Qwen3ForSequenceClassification");
        vl = !strcmp(name, "Qwen2_5_VLForConditionalGeneration") || !strcmp(name, "Qwen2VLForConditionalGeneration");
        if (!qwen3 && !vl && !score && strcmp(name, "Qwen2ForCausalLM") != 0)
            die("%s: unknown architecture \"%s\" (supported: Qwen2ForCausalLM, Qwen3ForCausalLM, "
                "Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration; reward models "
                "Qwen2ForSequenceClassification, Qwen3ForSequenceClassification)", path, name);
    } else {
        qwen3 = model_type && strcmp(model_type, "qwen3") == 0;
        vl = model_type && (!strcmp(model_type, "qwen2_5_vl") || !strcmp(model_type, "qwen2_vl"));
        if (!qwen3 && !vl && (!model_type || strcmp(model_type, "qwen2") != 0))
            die("%s: unknown architecture: model_type \"%s\" (supported: qwen2, qwen3, qwen2_5_vl, qwen2_vl)",
                path, model_type ? model_type : "");
    }
    // Qwen2.5-VL and Qwen2-VL: the language model's keys at the top (transformers 4) or in text_config (5)
    const cJSON *top = root;
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (vl && cJSON_IsObject(text) && cJSON_GetObjectItemCaseSensitive(text, "hidden_size")) root = (cJSON *)text;
    if (json_get_bool_or(root, "use_sliding_window", 0, path))
        die("%s: sliding-window attention (use_sliding_window: true) is unsupported", path);
    const char *act = json_str(root, "hidden_act", path);
    if (act && strcmp(act, "silu") != 0) die("%s: hidden_act \"%s\" is unsupported (only silu)", path, act);
    memset(c, 0, sizeof *c);
    c->image_pad_id = -1;
    if (score) {  // one score a response: what verl and TRL read of a reward model
        c->score_labels = num_labels(root, path);
        if (c->score_labels != 1)
            die("%s: a reward model with %lld labels (id2label); one score a response (num_labels 1) is supported",
                path, (long long)c->score_labels);
    }
    const cJSON *scaling = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    if (vl) {  // M-RoPE: mrope_section in rope_scaling (transformers 4) or rope_parameters (5)
        const cJSON *holder = cJSON_IsObject(scaling) ? scaling : rp;
        const char *type = json_str(holder, "rope_type", path);
        if (!type) type = json_str(holder, "type", path);
        if (type && strcmp(type, "mrope") && strcmp(type, "default"))
            die("%s: rope type \"%s\" is unsupported for Qwen2-VL / Qwen2.5-VL (only mrope / default)", path, type);
        const cJSON *sec = cJSON_GetObjectItemCaseSensitive(holder, "mrope_section");
        int i = 0;
        const cJSON *e = cJSON_IsArray(sec) && cJSON_GetArraySize(sec) == 3 ? sec->child : NULL;
        for (; e; e = e->next) {
            int64_t v;
            if (!json_as_int(e, 0, 4096, &v)) break;
            c->mrope_section[i++] = (int)v;
        }
        if (i != 3) die("%s: a Qwen2-VL / Qwen2.5-VL config needs rope_scaling.mrope_section, 3 integers", path);
        c->vl = 1;
        c->image_pad_id = json_get_int_or(top, "image_token_id", 151655, path);
        scaling = NULL;
    }
    if (scaling && !cJSON_IsNull(scaling)) die("%s: rope_scaling is unsupported", path);

    if (vl) {  // transformers writes a VL text config's keys only where they differ from its class defaults
        c->vocab = json_get_int_or(root, "vocab_size", 152064, path);
        c->hidden = json_get_int_or(root, "hidden_size", 8192, path);
        c->inter = json_get_int_or(root, "intermediate_size", 29568, path);
        c->layers = json_get_int_or(root, "num_hidden_layers", 80, path);
        c->heads = json_get_int_or(root, "num_attention_heads", 64, path);
    } else {
        c->vocab = json_get_int(root, "vocab_size", path);
        c->hidden = json_get_int(root, "hidden_size", path);
        c->inter = json_get_int(root, "intermediate_size", path);
        c->layers = json_get_int(root, "num_hidden_layers", path);
        c->heads = json_get_int(root, "num_attention_heads", path);
    }
    c->kv_heads = json_get_int_or(root, "num_key_value_heads", vl ? 8 : c->heads, path);  // HF's default
    // Defaults below are HF's own (Qwen2Config's; Qwen2VLTextConfig's for VL), so a config that omits them
    // means what it means in HF.
    c->max_pos = json_get_int_or(root, "max_position_embeddings", 32768, path);
    c->rope_theta = json_get_number_or(root, "rope_theta", vl ? 1e6 : 10000.0, path);
    // transformers 5 writes rope_parameters {rope_type, rope_theta} instead of rope_theta / rope_scaling
    if (rp && !cJSON_IsNull(rp)) {
        if (!cJSON_IsObject(rp)) die("%s: rope_parameters must be an object", path);
        const char *type = json_str(rp, "rope_type", path);
        if (type && strcmp(type, "default") != 0)
            die("%s: rope_parameters.rope_type \"%s\" is unsupported (only default)", path, type);
        c->rope_theta = json_get_number_or(rp, "rope_theta", c->rope_theta, path);
    }
    c->eps = (float)json_get_number_or(root, "rms_norm_eps", vl ? 1e-5 : 1e-6, path);
    // transformers 5 keeps a VL model's tie_word_embeddings at the top, beside text_config
    int tied_top = json_get_bool_or(top, "tie_word_embeddings", 0, path);
    c->tied = json_get_bool_or(root, "tie_word_embeddings", tied_top, path);
    c->init_std = json_get_number_or(root, "initializer_range", 0.02, path);
    c->bos_id = token_id_or(root, "bos_token_id", path);
    c->eos_id = token_id_or(root, "eos_token_id", path);
    c->head_dim = c->heads > 0 ? c->hidden / c->heads : 0;
    int64_t hd = json_get_int_or(root, "head_dim", c->head_dim, path);
    if (qwen3) {  // Qwen3: its own head_dim, q/k norms, biases only with attention_bias
        c->head_dim = hd;
        c->qk_norm = 1;
        c->attn_bias = json_get_bool_or(root, "attention_bias", 0, path);
    } else {
        if (c->heads > 0 && c->hidden % c->heads)
            die("%s: hidden_size %lld is not a multiple of num_attention_heads %lld", path, (long long)c->hidden,
                (long long)c->heads);
        if (hd != c->head_dim)
            die("%s: head_dim %lld != hidden_size / num_attention_heads is unsupported for qwen2", path, (long long)hd);
        c->attn_bias = 1;
    }
    if (vl && c->mrope_section[0] + c->mrope_section[1] + c->mrope_section[2] != c->head_dim / 2)
        die("%s: mrope_section [%d, %d, %d] does not add up to head_dim / 2 = %lld", path, c->mrope_section[0],
            c->mrope_section[1], c->mrope_section[2], (long long)(c->head_dim / 2));
    qwen2_config_check(c, path);
    cJSON_Delete((cJSON *)top);
    free(path);
}

cJSON *qwen2_config_json(const Qwen2Config *c, DType dtype) {
    cJSON *r = cJSON_CreateObject(), *arch = cJSON_CreateArray();
    if (!r || !arch) die("out of memory");
    const char *name = c->qk_norm ? "Qwen3ForCausalLM" : "Qwen2ForCausalLM", *type = c->qk_norm ? "qwen3" : "qwen2";
    if (c->score_labels) name = c->qk_norm ? "Qwen3ForSequenceClassification" : "Qwen2ForSequenceClassification";
    if (c->vl) name = "Qwen2_5_VLForConditionalGeneration", type = "qwen2_5_vl";
    cJSON_AddItemToArray(arch, cJSON_CreateString(name));
    cJSON_AddItemToObject(r, "architectures", arch);
    cJSON_AddStringToObject(r, "model_type", type);
    if (c->qk_norm) {
        cJSON_AddNumberToObject(r, "head_dim", (double)c->head_dim);
        cJSON_AddBoolToObject(r, "attention_bias", c->attn_bias);
    }
    cJSON_AddStringToObject(r, "hidden_act", "silu");
    cJSON_AddNumberToObject(r, "vocab_size", (double)c->vocab);
    cJSON_AddNumberToObject(r, "hidden_size", (double)c->hidden);
    cJSON_AddNumberToObject(r, "intermediate_size", (double)c->inter);
    cJSON_AddNumberToObject(r, "num_hidden_layers", (double)c->layers);
    cJSON_AddNumberToObject(r, "num_attention_heads", (double)c->heads);
    cJSON_AddNumberToObject(r, "num_key_value_heads", (double)c->kv_heads);
    cJSON_AddNumberToObject(r, "max_position_embeddings", (double)c->max_pos);
    cJSON_AddNumberToObject(r, "rope_theta", c->rope_theta);
    // Print eps as the decimal the user means (1e-06), not the float's binary expansion.
    char eps[32];
    snprintf(eps, sizeof eps, "%.7g", (double)c->eps);
    cJSON_AddNumberToObject(r, "rms_norm_eps", strtod(eps, NULL));
    cJSON_AddNumberToObject(r, "initializer_range", c->init_std);
    cJSON_AddBoolToObject(r, "tie_word_embeddings", c->tied);
    cJSON_AddBoolToObject(r, "use_sliding_window", 0);
    cJSON_AddBoolToObject(r, "use_cache", 1);
    cJSON_AddNumberToObject(r, "attention_dropout", 0.0);
    if (c->bos_id >= 0) cJSON_AddNumberToObject(r, "bos_token_id", (double)c->bos_id);
    if (c->eos_id >= 0) cJSON_AddNumberToObject(r, "eos_token_id", (double)c->eos_id);
    if (c->vl) {  // transformers 4's flat layout: M-RoPE in rope_scaling
        cJSON *rs = cJSON_AddObjectToObject(r, "rope_scaling");
        if (!rs) die("out of memory");
        cJSON_AddStringToObject(rs, "type", "mrope");
        cJSON_AddItemToObject(rs, "mrope_section", cJSON_CreateIntArray(c->mrope_section, 3));
        cJSON_AddNumberToObject(r, "image_token_id", (double)c->image_pad_id);
    }
    if (c->score_labels) {  // transformers' num_labels is the size of id2label
        cJSON *id2label = cJSON_AddObjectToObject(r, "id2label"), *label2id = cJSON_AddObjectToObject(r, "label2id");
        if (!id2label || !label2id) die("out of memory");
        for (int64_t i = 0; i < c->score_labels; i++) {
            char key[24], label[32];
            snprintf(key, sizeof key, "%lld", (long long)i);
            snprintf(label, sizeof label, "LABEL_%lld", (long long)i);
            cJSON_AddStringToObject(id2label, key, label);
            cJSON_AddNumberToObject(label2id, label, (double)i);
        }
    }
    cJSON_AddStringToObject(r, "torch_dtype", dtype == DTYPE_BF16 ? "bfloat16" : "float32");
    return r;
}

static void config_save(const Qwen2Config *c, const char *dir, DType dtype) {
    cJSON *r = qwen2_config_json(c, dtype);
    char *path = path_join(dir, "config.json");
    json_save_file(path, r);
    free(path);
    cJSON_Delete(r);
}

// ---------------------------------------------------------------------------------------------
// parameters

typedef struct {
    const char *fmt;  // HF name; %d is the layer
    int per_layer;
    int64_t rows, cols;  // cols 0: a vector
} KindSpec;

enum { N_KINDS = 23 };

// Kinds with 0 rows (biases without attn_bias, q/k norms without qk_norm, a tied head) have no storage.
static void kind_specs(const Qwen2Config *c, KindSpec k[N_KINDS]) {
    int64_t C = c->hidden, D = c->head_dim, Q = c->heads * D, KV = c->kv_heads * D, I = c->inter, V = c->vocab;
    int64_t bias = c->attn_bias ? 1 : 0, norm = c->qk_norm ? D : 0;
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
        {"model.layers.%d.post_attention_layernorm.weight", 1, C, 0},
        {"model.layers.%d.mlp.gate_proj.weight", 1, I, C},
        {"model.layers.%d.mlp.up_proj.weight", 1, I, C},
        {"model.layers.%d.mlp.down_proj.weight", 1, C, I},
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

static void layout_fields(Qwen2Layout *w, size_t *f[N_KINDS]) {
    size_t *list[N_KINDS] = {&w->embed, &w->ln1, &w->wq, &w->bq, &w->wk, &w->bk, &w->wv, &w->bv, &w->wo,
                             &w->qnorm, &w->knorm, &w->ln2, &w->wgate, &w->wup, &w->wdown, &w->norm, &w->lm_head,
                             &w->merger_ln_q, &w->merger_ln_q_b, &w->merger_w0, &w->merger_b0, &w->merger_w2,
                             &w->merger_b2};
    memcpy(f, list, sizeof list);
}

size_t qwen2_layout(const Qwen2Config *c, Qwen2Layout *w) {
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

void qwen2_build(Qwen2 *m, const Qwen2Config *c, DType dtype) { qwen2_build_on(m, c, dtype, backend_cpu()); }

void qwen2_build_on(Qwen2 *m, const Qwen2Config *c, DType dtype, const Backend *be) {
    if (dtype != DTYPE_F32 && dtype != DTYPE_BF16) die("internal: a %s model slab", dtype_name(dtype));
    memset(m, 0, sizeof *m);
    m->cfg = *c;
    m->dtype = dtype;
    m->n_params = qwen2_layout(c, &m->w);
    m->be = be;
    size_t bytes = m->n_params * dtype_size(dtype);
    m->params = be->on_device ? be->alloc(be, bytes) : xcalloc(m->n_params, dtype_size(dtype));
}

const Qwen2 *qwen2_host(const Qwen2 *m, Qwen2 *copy) {
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

void qwen2_free(Qwen2 *m) {
    if (m->be && m->be->on_device) m->be->free(m->be, m->params);
    else free(m->params);
    memset(m, 0, sizeof *m);
}

void qwen2_to_backend(Qwen2 *m, const Backend *be) {
    if (!be->on_device || be == m->be) return;
    size_t bytes = m->n_params * dtype_size(m->dtype);
    void *dev = be->alloc(be, bytes);
    be->upload(be, dev, m->params, bytes);
    free(m->params);
    m->params = dev;
    m->be = be;
}

int qwen2_tensors(const Qwen2 *m, Qwen2Tensor *out) {
    KindSpec k[N_KINDS];
    kind_specs(&m->cfg, k);
    Qwen2Layout w;
    qwen2_layout(&m->cfg, &w);
    size_t *f[N_KINDS];
    layout_fields(&w, f);
    int n = 0;
    for (int i = 0; i < N_KINDS; i++) {
        int64_t numel = kind_numel(&k[i]);
        if (numel == 0) continue;
        for (int l = 0; l < (k[i].per_layer ? (int)m->cfg.layers : 1); l++, n++) {
            if (!out) continue;
            Qwen2Tensor *t = &out[n];
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
static Qwen2Tensor *tensor_list(const Qwen2 *m, int *n) {
    *n = qwen2_tensors(m, NULL);
    Qwen2Tensor *ts = xmalloc((size_t)*n * sizeof *ts);
    qwen2_tensors(m, ts);
    return ts;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t len = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && len < n; d++)
        len += (size_t)snprintf(buf + len, n - len, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (len < n) snprintf(buf + len, n - len, "]");
}

void qwen2_load(Qwen2 *m, const char *dir, DType dtype) {
    Qwen2Config c;
    qwen2_config_load(&c, dir);  // refuses a VL model before reading any weight
    qwen2_load_vl(m, dir, dtype);
}

void qwen2_load_vl(Qwen2 *m, const char *dir, DType dtype) {
    Qwen2Config c;
    qwen2_config_load_vl(&c, dir);
    qwen2_load_config(m, dir, dtype, &c);
}

void qwen2_load_config(Qwen2 *m, const char *dir, DType dtype, const Qwen2Config *config) {
    Qwen2Config c = *config;
    HfWeights hw;
    hf_weights_open(&hw, dir);
    // Check every tensor against config.json before allocating the slab, so a wrong config
    // reads as a shape error naming the tensor, not as "out of memory".
    Qwen2 shell = {.cfg = c};
    int n;
    Qwen2Tensor *ts = tensor_list(&shell, &n);
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
    qwen2_build(m, &c, dtype);
    qwen2_tensors(m, ts);
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

DType qwen2_file_dtype(const char *dir) {
    HfWeights hw;
    hf_weights_open(&hw, dir);
    const char *file = NULL;
    const StTensor *st = hf_weights_find(&hw, "model.embed_tokens.weight", &file);
    DType d = st && st->dtype == DTYPE_BF16 ? DTYPE_BF16 : DTYPE_F32;
    hf_weights_close(&hw);
    return d;
}

void qwen2_init_random(Qwen2 *m, uint64_t seed) {
    if (m->dtype != DTYPE_F32) die("internal: qwen2_init_random on a %s slab", dtype_name(m->dtype));
    Rng rng;
    rng_init(&rng, seed);
    int n;
    Qwen2Tensor *ts = tensor_list(m, &n);
    for (int i = 0; i < n; i++) {
        Qwen2Tensor *t = &ts[i];
        int64_t numel = t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1);
        int is_norm = strstr(t->name, "norm") != NULL;
        for (int64_t j = 0; j < numel; j++)
            t->data[j] = t->ndim == 2 ? (float)m->cfg.init_std * rng_normal(&rng) : (is_norm ? 1.0f : 0.0f);
    }
    free(ts);
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

void qwen2_save(const Qwen2 *dm, const char *dir, DType dtype, const char *vl_from) {
    Qwen2 copy;
    const Qwen2 *m = qwen2_host(dm, &copy);  // the file is written from host memory
    if (m->dtype != DTYPE_F32) die("internal: qwen2_save of a %s slab", dtype_name(m->dtype));
    if (m->cfg.vl && !vl_from) die("internal: qwen2_save of a vision-language model without its source");
    int n;
    Qwen2Tensor *ts = tensor_list(m, &n);
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
    if (m == &copy) qwen2_free(&copy);
}

// ---------------------------------------------------------------------------------------------
// forward

// The batch metadata block of N rows: tokens, pos, targets, n_keys (int32), then seq_off (N+1),
// kv_off, kv_dst (int64), from `base` (NULL: only measure); returns its size in bytes.
static size_t meta_layout(Qwen2Meta *b, int64_t N, char *base) {
    size_t off = 0;
#define TAKE(field, count) LAYOUT_TAKE(base, &off, b->field, count)
    TAKE(tokens, N);
    TAKE(pos, N);
    TAKE(targets, N);
    TAKE(n_keys, N);
    TAKE(seq_off, N + 1);
    TAKE(kv_off, N);
    TAKE(kv_dst, N);
#undef TAKE
    return off;
}

// Lays out the workspace from `base` (NULL: only measure); returns its size in bytes.
static size_t acts_layout(Qwen2Acts *a, const Backend *be, const Qwen2Config *c, DType dtype, int64_t N,
                          int64_t max_keys, char *base) {
    int64_t C = c->hidden, Q = c->heads * c->head_dim, KV = c->kv_heads * c->head_dim, I = c->inter;
    size_t att = be->attention_scratch(be, max_keys, 0), lp = be->logprob_scratch(be, c->vocab, C, dtype), off = 0;
    int64_t in16 = dtype == DTYPE_BF16 ? N * (C > I ? C : I) : 0;
#define TAKE(field, count) LAYOUT_TAKE(base, &off, a->field, count)
    TAKE(x, N * C);
    TAKE(xn, N * C);
    TAKE(in16, in16);
    TAKE(q, N * Q);
    TAKE(k, N * KV);
    TAKE(v, N * KV);
    TAKE(att, N * Q);
    TAKE(proj, N * C);
    TAKE(gate, N * I);
    TAKE(up, N * I);
    TAKE(scratch, att > lp ? att : lp);
    TAKE(rope, N * c->head_dim);
    TAKE(lora_u, N * c->lora_rank);
#undef TAKE
    a->meta_bytes = meta_layout(&a->dev, N, base ? base + off : NULL);
    off += a->meta_bytes;
    if (!in16) a->in16 = NULL;  // F32 weights: none
    // Every layer in place: the o projection's sum in proj, then the MLP's back into x.
    a->view = (Qwen2LayerActs){.xin = a->x, .xmid = a->proj, .xout = a->x, .xn1 = a->xn, .xn2 = a->xn,
                               .qr = a->q, .kr = a->k, .q = a->q, .k = a->k, .v = a->v, .att = a->att,
                               .gate = a->gate, .up = a->up, .h = a->gate, .rope = a->rope, .lora_u = a->lora_u,
                               .scratch = a->scratch, .in16 = a->in16};
    return off;
}

size_t qwen2_acts_bytes(const Backend *be, const Qwen2Config *c, DType dtype, int64_t max_tokens, int64_t max_keys) {
    Qwen2Acts a;
    return acts_layout(&a, be, c, dtype, max_tokens, max_keys, NULL);
}

void qwen2_acts_init(Qwen2Acts *a, const Backend *be, const Qwen2Config *c, DType dtype, int64_t max_tokens,
                     int64_t max_keys, Arena *arena) {
    memset(a, 0, sizeof *a);
    a->max_tokens = max_tokens;
    acts_layout(a, be, c, dtype, max_tokens, max_keys,
                arena_alloc(arena, qwen2_acts_bytes(be, c, dtype, max_tokens, max_keys)));
    a->host = a->dev;
    if (arena->on_device) {  // the host fills its own copy, uploaded once per forward
        a->host_block = xmalloc(a->meta_bytes);
        meta_layout(&a->host, max_tokens, a->host_block);
    }
}

void qwen2_acts_free(Qwen2Acts *a) {
    free(a->host_block);
    a->host_block = NULL;
}

// The host's metadata to the device (nothing to do on the CPU, where they are the same memory).
static void meta_upload(const Qwen2 *m, Qwen2Acts *a) {
    if (a->host_block) m->be->upload(m->be, a->dev.tokens, a->host_block, a->meta_bytes);
}

size_t qwen2_kv_bytes_per_token(const Qwen2Config *c) { return (size_t)(2 * c->layers * c->kv_heads * c->head_dim) * 4; }

void qwen2_kv_init(Qwen2KV *kv, const Qwen2Config *c, int n_slots, int64_t max_len, Arena *arena) {
    kv->n_slots = n_slots;
    kv->max_len = max_len;
    kv->row = c->kv_heads * c->head_dim;
    size_t n = (size_t)(c->layers * n_slots * max_len * kv->row);
    kv->k = arena_alloc(arena, n * 4);
    kv->v = arena_alloc(arena, n * 4);
}

static int64_t kv_offset(const Qwen2KV *kv, int64_t layer, int slot) {
    return ((layer * kv->n_slots + slot) * kv->max_len) * kv->row;
}

void qwen2_kv_copy(const Qwen2 *m, Qwen2KV *kv, int dst, int src, int64_t n) {
    size_t bytes = (size_t)(n * kv->row) * 4;
    for (int64_t l = 0; l < m->cfg.layers; l++) {
        m->be->copy(m->be, kv->k + kv_offset(kv, l, dst), kv->k + kv_offset(kv, l, src), bytes);
        m->be->copy(m->be, kv->v + kv_offset(kv, l, dst), kv->v + kv_offset(kv, l, src), bytes);
    }
}

const void *qwen2_operand(const Qwen2 *m, const float *x, int64_t n, void *buf) {
    if (m->dtype == DTYPE_F32) return x;
    m->be->round_operand(m->be, m->dtype, x, buf, n);
    return buf;
}

// out (N, OC) = x (N, C) @ W^T + bias, W the matrix at slab offset w: for decode's few rows from m's int8
// copy when it has one (x quantized), else from the slab (x as its projections read it: xo).
static void project(const Qwen2 *m, float *out, const float *x, const void *xo, size_t w, const void *bias, int64_t N,
                    int64_t C, int64_t OC) {
    if (m->q8 && N <= SKINNY_MAX_ROWS) q8_matmul(out, x, qwen2_q8_at(m->q8, w), bias, m->dtype, N, C, OC, m->q8->xq);
    else m->be->matmul_forward(m->be, out, xo, qwen2_at(m, w), bias, m->dtype, N, C, OC);
}

// The halves of a transformer block, over N rows of layer l's views: shared by prefill, decode and
// training (which differ in the attention between them and in where the views point).
static void qkv_block(const Qwen2 *m, int64_t l, int64_t N, const Qwen2LayerActs *a) {
    const Backend *be = m->be;
    const Qwen2Config *c = &m->cfg;
    const Qwen2Layout *w = &m->w;
    DType dt = m->dtype;
    int64_t C = c->hidden, D = c->head_dim, Q = c->heads * D, KV = c->kv_heads * D;
    be->rmsnorm_forward(be, a->xn1, a->xin, qwen2_at(m, w->ln1 + l * C), dt, N, C, c->eps);
    const void *xn = qwen2_operand(m, a->xn1, N * C, a->in16);
    project(m, a->qr, a->xn1, xn, w->wq + l * Q * C, qwen2_bias(m, w->bq + l * Q), N, C, Q);
    project(m, a->kr, a->xn1, xn, w->wk + l * KV * C, qwen2_bias(m, w->bk + l * KV), N, C, KV);
    project(m, a->v, a->xn1, xn, w->wv + l * KV * C, qwen2_bias(m, w->bv + l * KV), N, C, KV);
    lora_forward(m->be, m->lora, LORA_Q, l, a->xn1, N, a->qr, a->lora_u);
    lora_forward(m->be, m->lora, LORA_K, l, a->xn1, N, a->kr, a->lora_u);
    lora_forward(m->be, m->lora, LORA_V, l, a->xn1, N, a->v, a->lora_u);
    if (c->qk_norm) {  // each head's query and key: rows of D
        be->rmsnorm_forward(be, a->q, a->qr, qwen2_at(m, w->qnorm + l * D), dt, N * c->heads, D, c->eps);
        be->rmsnorm_forward(be, a->k, a->kr, qwen2_at(m, w->knorm + l * D), dt, N * c->kv_heads, D, c->eps);
    }
    be->rope_forward(be, a->q, a->rope, N, (int)c->heads, (int)D);
    be->rope_forward(be, a->k, a->rope, N, (int)c->kv_heads, (int)D);
}

// a->att (attention output) -> o_proj + residual into xmid, then the MLP + residual into xout.
static void out_mlp_block(const Qwen2 *m, int64_t l, int64_t N, const Qwen2LayerActs *a) {
    const Backend *be = m->be;
    const Qwen2Config *c = &m->cfg;
    const Qwen2Layout *w = &m->w;
    DType dt = m->dtype;
    int64_t C = c->hidden, I = c->inter, Q = c->heads * c->head_dim;
    const void *att = qwen2_operand(m, a->att, N * Q, a->in16);
    project(m, a->xmid, a->att, att, w->wo + l * C * Q, NULL, N, Q, C);
    lora_forward(m->be, m->lora, LORA_O, l, a->att, N, a->xmid, a->lora_u);
    be->residual_forward(be, a->xmid, a->xin, N * C);
    be->rmsnorm_forward(be, a->xn2, a->xmid, qwen2_at(m, w->ln2 + l * C), dt, N, C, c->eps);
    const void *xn = qwen2_operand(m, a->xn2, N * C, a->in16);
    project(m, a->gate, a->xn2, xn, w->wgate + l * I * C, NULL, N, C, I);
    project(m, a->up, a->xn2, xn, w->wup + l * I * C, NULL, N, C, I);
    lora_forward(m->be, m->lora, LORA_GATE, l, a->xn2, N, a->gate, a->lora_u);
    lora_forward(m->be, m->lora, LORA_UP, l, a->xn2, N, a->up, a->lora_u);
    be->swiglu_forward(be, a->h, a->gate, a->up, N * I);
    const void *h = qwen2_operand(m, a->h, N * I, a->in16);
    project(m, a->xout, a->h, h, w->wdown + l * C * I, NULL, N, I, C);
    lora_forward(m->be, m->lora, LORA_DOWN, l, a->h, N, a->xout, a->lora_u);
    be->residual_forward(be, a->xout, a->xmid, N * C);
}

static void check_workspace(const Qwen2 *m, const Qwen2Acts *a, int64_t N, const char *what) {
    if (N > a->max_tokens) die("internal: %s of %lld rows, workspace holds %lld", what, (long long)N, (long long)a->max_tokens);
    if (m->dtype != DTYPE_F32 && !a->in16) die("internal: a %s model in an F32 workspace", dtype_name(m->dtype));
}

void qwen2_layer_forward(const Qwen2 *m, int64_t l, const Qwen2Batch *b, const Qwen2LayerActs *a, Qwen2KV *kv,
                         const int32_t *slots) {
    const Backend *be = m->be;
    const Qwen2Config *c = &m->cfg;
    int64_t KV = c->kv_heads * c->head_dim;
    qkv_block(m, l, b->N, a);
    for (int s = 0; kv && s < b->B; s++) {  // the prompt's keys and values start its cache slot
        int64_t lo = b->host_seq_off[s];
        size_t bytes = (size_t)((b->host_seq_off[s + 1] - lo) * KV) * sizeof(float);
        be->copy(be, kv->k + kv_offset(kv, l, slots[s]), a->k + lo * KV, bytes);
        be->copy(be, kv->v + kv_offset(kv, l, slots[s]), a->v + lo * KV, bytes);
    }
    be->attention_forward(be, a->att, a->lse, a->q, a->k, a->v, b->seq_off, b->B, b->N, (int)c->heads,
                          (int)c->kv_heads, (int)c->head_dim, a->scratch);
    out_mlp_block(m, l, b->N, a);
}

void qwen2_forward_layers(const Qwen2 *m, const Qwen2Batch *b, const Qwen2LayerActs *views, int64_t n_views,
                          float *out, Qwen2KV *kv, const int32_t *slots) {
    const Backend *be = m->be;
    const Qwen2Config *c = &m->cfg;
    const Qwen2VlInputs *vl = b->vl;
    if (vl && vl->N != b->N) die("internal: image inputs of %lld rows for %lld", (long long)vl->N, (long long)b->N);
    if (vl)
        be->upload(be, views[0].rope, vl->rope, (size_t)(b->N * c->head_dim) * sizeof(float));
    else
        be->rope_table(be, views[0].rope, b->pos, b->N, (int)c->head_dim, c->rope_theta);
    be->embedding_forward(be, views[0].xin, b->tokens, qwen2_at(m, m->w.embed), m->dtype, b->N, c->hidden);
    for (int64_t i = 0; vl && i < vl->n_image_rows; i++)  // image features in place of the pads' embeddings
        be->upload(be, views[0].xin + vl->image_rows[i] * c->hidden, vl->image_feats[i],
                   (size_t)c->hidden * sizeof(float));
    for (int64_t l = 0; l < c->layers; l++) qwen2_layer_forward(m, l, b, &views[n_views == 1 ? 0 : l], kv, slots);
    const float *last = views[n_views == 1 ? 0 : c->layers - 1].xout;
    be->rmsnorm_forward(be, out, last, qwen2_at(m, m->w.norm), m->dtype, b->N, c->hidden, c->eps);
}

// The forward over the batch batch_fill put in a->host: positions, the upload, then every layer (vl: image
// inputs, or NULL).
static void forward(const Qwen2 *m, int B, Qwen2Acts *a, Qwen2KV *kv, const int32_t *slots, const Qwen2VlInputs *vl) {
    const Qwen2Meta *h = &a->host;
    int64_t N = h->seq_off[B];
    for (int b = 0; b < B; b++)
        for (int64_t i = h->seq_off[b]; i < h->seq_off[b + 1]; i++) h->pos[i] = (int32_t)(i - h->seq_off[b]);
    meta_upload(m, a);
    Qwen2Batch batch = {.B = B, .N = N, .tokens = a->dev.tokens, .pos = a->dev.pos, .seq_off = a->dev.seq_off,
                        .host_seq_off = h->seq_off};
    batch.vl = vl;
    qwen2_forward_layers(m, &batch, &a->view, 1, a->xn, kv, slots);
}

// The batch's tokens and sequence offsets into a's host metadata.
static void batch_fill(const Qwen2 *m, Qwen2Acts *a, const int32_t *tokens, const int64_t *seq_off, int B) {
    int64_t N = seq_off[B];
    check_workspace(m, a, N, "forward");
    memcpy(a->host.tokens, tokens, (size_t)N * sizeof *tokens);
    memcpy(a->host.seq_off, seq_off, (size_t)(B + 1) * sizeof *seq_off);
}

void qwen2_forward(const Qwen2 *m, const int32_t *tokens, const int64_t *seq_off, int B, Qwen2Acts *a, Qwen2KV *kv,
                   const int32_t *slots) {
    batch_fill(m, a, tokens, seq_off, B);
    forward(m, B, a, kv, slots, NULL);
}

void qwen2_forward_vl(const Qwen2 *m, const int32_t *tokens, const int64_t *seq_off, int B, Qwen2Acts *a,
                      Qwen2KV *kv, const int32_t *slots, const Qwen2VlInputs *vl) {
    batch_fill(m, a, tokens, seq_off, B);
    forward(m, B, a, kv, slots, vl);
}

// Each row's log-prob of the next token of its sequence into out (host), over the forward with image inputs vl
// (or NULL).
static void logprobs(const Qwen2 *m, const int32_t *tokens, const int64_t *seq_off, int B, Qwen2Acts *a,
                     const Qwen2VlInputs *vl, float *out) {
    const Backend *be = m->be;
    int64_t N = seq_off[B];
    batch_fill(m, a, tokens, seq_off, B);
    for (int b = 0; b < B; b++)
        for (int64_t i = seq_off[b]; i < seq_off[b + 1]; i++)
            a->host.targets[i] = i + 1 < seq_off[b + 1] ? tokens[i + 1] : -1;
    forward(m, B, a, NULL, NULL, vl);
    // The log-probs land in a->proj (free by now), then come to the host.
    be->logprob_forward(be, a->proj, NULL, a->xn, qwen2_at(m, m->w.lm_head), m->dtype, a->dev.targets, N,
                        m->cfg.hidden,
                        m->cfg.vocab, a->scratch);
    be->download(be, out, a->proj, (size_t)N * sizeof *out);
}

void qwen2_logprobs(const Qwen2 *m, const int32_t *tokens, const int64_t *seq_off, int B, Qwen2Acts *a, float *out) {
    logprobs(m, tokens, seq_off, B, a, NULL, out);
}

int qwen2_vl_inputs(const Qwen2 *m, const int32_t *tokens, const int64_t *seq_off, int B, const int64_t *prompt_len,
                    const float *const *feats, const int (*const *grids)[3], const int *n_images, int merge,
                    Qwen2VlInputs *in) {
    const Qwen2Config *c = &m->cfg;
    int64_t N = seq_off[B], D = c->head_dim, longest = 0;
    int32_t pad = (int32_t)c->image_pad_id;
    memset(in, 0, sizeof *in);
    in->N = N;
    in->rope = xmalloc((size_t)(N * D) * sizeof *in->rope + 1);
    in->image_rows = xmalloc((size_t)N * sizeof *in->image_rows + 1);
    in->image_feats = xmalloc((size_t)N * sizeof *in->image_feats + 1);
    in->delta = xmalloc((size_t)B * sizeof *in->delta + 1);
    for (int b = 0; b < B; b++)
        if (seq_off[b + 1] - seq_off[b] > longest) longest = seq_off[b + 1] - seq_off[b];
    int32_t *pos3 = xmalloc((size_t)(3 * longest) * sizeof *pos3 + 1);
    for (int b = 0; b < B; b++) {
        int64_t lo = seq_off[b], n = seq_off[b + 1] - lo, np = prompt_len ? prompt_len[b] : n;
        if (vl_rope_index(tokens + lo, np, pad, grids[b], n_images[b], merge, pos3, &in->delta[b]) != 0) {
            free(pos3);
            qwen2_vl_inputs_free(in);
            return -1;
        }
        // pos3 is 3 rows of n: the prompt's positions move to their rows' places, the response's count on
        for (int s = 2; s >= 0; s--) {
            memmove(pos3 + s * n, pos3 + s * np, (size_t)np * sizeof *pos3);
            for (int64_t i = np; i < n; i++) pos3[s * n + i] = (int32_t)(i + in->delta[b]);
        }
        vl_rope_table(in->rope + lo * D, pos3, n, (int)D, c->rope_theta, c->mrope_section);
        for (int64_t i = lo, k = 0; i < lo + np; i++)  // the prompt's pads, in order, are the features' rows
            if (tokens[i] == pad) {
                in->image_rows[in->n_image_rows] = i;
                in->image_feats[in->n_image_rows++] = feats[b] + (k++) * c->hidden;
            }
    }
    free(pos3);
    return 0;
}

void qwen2_vl_inputs_free(Qwen2VlInputs *in) {
    free(in->rope);
    free(in->image_rows);
    free(in->image_feats);
    free(in->image_grads);
    free(in->delta);
    memset(in, 0, sizeof *in);
}

void qwen2_logprobs_vl(const Qwen2 *m, const int32_t *tokens, const int64_t *seq_off, int B, Qwen2Acts *a,
                       const Qwen2VlInputs *vl, float *out) {
    logprobs(m, tokens, seq_off, B, a, vl, out);
}

void qwen2_decode_step(const Qwen2 *m, Qwen2KV *kv, const int32_t *tokens, const int32_t *slots, const int32_t *pos,
                       int B, Qwen2Acts *a, float *logits) {
    qwen2_decode_step_at(m, kv, tokens, slots, pos, pos, B, a, logits);
}

void qwen2_decode_step_at(const Qwen2 *m, Qwen2KV *kv, const int32_t *tokens, const int32_t *slots,
                          const int32_t *pos, const int32_t *rope_pos, int B, Qwen2Acts *a, float *logits) {
    const Backend *be = m->be;
    const Qwen2Config *c = &m->cfg;
    int64_t KV = c->kv_heads * c->head_dim;
    check_workspace(m, a, B, "decode batch");
    Qwen2Meta *h = &a->host;
    memcpy(h->tokens, tokens, (size_t)B * sizeof *tokens);
    memcpy(h->pos, rope_pos, (size_t)B * sizeof *pos);  // the rotation's; the cache offsets below use pos
    for (int b = 0; b < B; b++) {  // offsets within a layer's cache: the slot, and the new position in it
        h->n_keys[b] = pos[b] + 1;
        h->kv_off[b] = kv_offset(kv, 0, slots[b]);
        h->kv_dst[b] = h->kv_off[b] + pos[b] * KV;
    }
    meta_upload(m, a);
    be->rope_table(be, a->rope, a->dev.pos, B, (int)c->head_dim, c->rope_theta);
    be->embedding_forward(be, a->x, a->dev.tokens, qwen2_at(m, m->w.embed), m->dtype, B, c->hidden);
    for (int64_t l = 0; l < c->layers; l++) {
        qkv_block(m, l, B, &a->view);
        float *k0 = kv->k + kv_offset(kv, l, 0), *v0 = kv->v + kv_offset(kv, l, 0);
        // append the new key/value, then attend over the whole slot
        be->kv_append(be, k0, v0, a->k, a->v, a->dev.kv_dst, B, KV);
        be->attention_decode_forward(be, a->att, a->q, k0, v0, a->dev.kv_off, a->dev.n_keys, B, (int)c->heads,
                                     (int)c->kv_heads, (int)c->head_dim, a->scratch);
        out_mlp_block(m, l, B, &a->view);
    }
    be->rmsnorm_forward(be, a->xn, a->x, qwen2_at(m, m->w.norm), m->dtype, B, c->hidden, c->eps);
    qwen2_logits(m, a->xn, B, a, logits);
}

void qwen2_logits(const Qwen2 *m, const float *h, int64_t B, Qwen2Acts *a, float *logits) {
    const Qwen2Config *c = &m->cfg;
    const void *x = qwen2_operand(m, h, B * c->hidden, a->in16);
    project(m, logits, h, x, m->w.lm_head, NULL, B, c->hidden, c->score_labels ? c->score_labels : c->vocab);
}

void qwen2_seq_scores(const Qwen2 *m, const int32_t *tokens, const int64_t *seq_off, int B, Qwen2Acts *a, float *out) {
    const Backend *be = m->be;
    const Qwen2Config *c = &m->cfg;
    if (!c->score_labels) die("internal: qwen2_seq_scores on a model without a score head");
    qwen2_forward(m, tokens, seq_off, B, a, NULL, NULL);
    // each sequence's last row (verl's: the last attended token), through kv_dst, which only decode reads
    for (int b = 0; b < B; b++) a->host.kv_dst[b] = seq_off[b + 1] - 1;
    if (a->dev.kv_dst != a->host.kv_dst)
        be->upload(be, a->dev.kv_dst, a->host.kv_dst, (size_t)B * sizeof *a->host.kv_dst);
    be->gather_rows(be, a->proj, a->xn, a->dev.kv_dst, B, c->hidden, 1.0f);
    qwen2_logits(m, a->proj, B, a, a->q);
    be->download(be, out, a->q, (size_t)B * (size_t)c->score_labels * sizeof *out);
}

// eos_token_id of one JSON file (int or list) appended to out without duplicates.
static int add_eos_ids(const char *path, int32_t *out, int n, int max) {
    if (!file_exists(path)) return n;
    cJSON *root = json_load_file(path, FILE_MAX_JSON);
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
    const cJSON *first = cJSON_IsArray(it) ? it->child : it;
    for (const cJSON *e = first; e; e = cJSON_IsArray(it) ? e->next : NULL) {
        int64_t v;
        if (cJSON_IsNull(e)) continue;
        if (!json_as_int(e, 0, INT32_MAX, &v)) die("%s: \"eos_token_id\" must be a token id or a list of them", path);
        int dup = 0;
        for (int i = 0; i < n; i++) dup |= out[i] == (int32_t)v;
        if (!dup && n < max) out[n++] = (int32_t)v;
    }
    cJSON_Delete(root);
    return n;
}

int qwen2_stop_ids(const char *dir, int32_t *out, int max) {
    char *cfg = path_join(dir, "config.json"), *gen = path_join(dir, "generation_config.json");
    int n = add_eos_ids(gen, out, add_eos_ids(cfg, out, 0, max), max);
    free(cfg);
    free(gen);
    return n;
}
