// The architecture table, config.json in and out, the presets, the stop tokens.
#include "model/decoder.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/json.h"
#include "base/util.h"

// ---------------------------------------------------------------------------------------------
// the architecture table: a row per Hugging Face model family

enum {
    PART_QKV_BIAS = 1 << 0,      // q/k/v projections always have biases
    PART_BIAS_KEY = 1 << 1,      // attention_bias / mlp_bias name biases (only false is supported)
    PART_QK_NORM = 1 << 2,       // RMSNorm over each head's query and key before RoPE
    PART_HEAD_DIM = 1 << 3,      // head_dim may differ from hidden_size / num_attention_heads
    PART_VL = 1 << 4,            // a vision-language model's language model (M-RoPE, the image pad)
    PART_ROPE_SCALING = 1 << 5,  // rope_scaling / rope_parameters of type linear or llama3
    PART_SLIDING_KEY = 1 << 6,   // sliding_window (Mistral: every layer's window, or null; Gemma: its local layers')
    PART_USE_SLIDING = 1 << 7,   // use_sliding_window (Qwen2; only false is supported)
    PART_GEMMA = 1 << 8,         // Gemma 3's layer: (1 + w) norms, post-norms, scaled embeddings, GeGLU, local and
                                 // global layers (sliding_window_pattern / layer_types) with their own RoPE bases,
                                 // query_pre_attn_scalar
};

struct DecoderArch {
    DecoderFamily family;
    const char *model_type, *causal, *score;  // config.json's model_type and architectures[0] (score: a reward
                                               // model's, ...ForSequenceClassification; NULL: none)
    unsigned parts;
    // What its config class means when a key is left out (transformers writes only the keys that differ).
    double theta;
    double eps;
    int64_t max_pos;
    int64_t kv_heads;  // 0: num_attention_heads
    int tied;          // tie_word_embeddings
};

static const DecoderArch archs[] = {
    {ARCH_QWEN2, "qwen2", "Qwen2ForCausalLM", "Qwen2ForSequenceClassification", PART_QKV_BIAS | PART_USE_SLIDING,
     10000.0, 1e-6, 32768, 0},
    {ARCH_QWEN3, "qwen3", "Qwen3ForCausalLM", "Qwen3ForSequenceClassification",
     PART_QK_NORM | PART_HEAD_DIM | PART_BIAS_KEY | PART_USE_SLIDING, 10000.0, 1e-6, 32768, 0},
    {ARCH_QWEN2_5_VL, "qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", NULL,
     PART_QKV_BIAS | PART_VL | PART_USE_SLIDING, 1e6, 1e-5, 32768, 8},
    {ARCH_QWEN2_VL, "qwen2_vl", "Qwen2VLForConditionalGeneration", NULL, PART_QKV_BIAS | PART_VL | PART_USE_SLIDING,
     1e6, 1e-5, 32768, 8},
    {ARCH_LLAMA, "llama", "LlamaForCausalLM", "LlamaForSequenceClassification",
     PART_HEAD_DIM | PART_BIAS_KEY | PART_ROPE_SCALING, 10000.0, 1e-6, 2048, 0},
    {ARCH_MISTRAL, "mistral", "MistralForCausalLM", "MistralForSequenceClassification",
     PART_HEAD_DIM | PART_SLIDING_KEY, 10000.0, 1e-6, 4096 * 32, 8},
    {ARCH_GEMMA3, "gemma3_text", "Gemma3ForCausalLM", NULL,
     PART_QK_NORM | PART_HEAD_DIM | PART_BIAS_KEY | PART_ROPE_SCALING | PART_SLIDING_KEY | PART_GEMMA, 1e6, 1e-6,
     131072, 4, 1},
};
enum { N_ARCHS = sizeof archs / sizeof archs[0] };

const DecoderArch *decoder_arch(DecoderFamily family) {
    for (int i = 0; i < N_ARCHS; i++)
        if (archs[i].family == family) return &archs[i];
    die("internal: no architecture row for family %d", (int)family);
}

const char *decoder_arch_name(const DecoderConfig *c) {
    const DecoderArch *a = decoder_arch(c->family);
    return c->score_labels ? a->score : a->causal;
}

void decoder_config_family(DecoderConfig *c, DecoderFamily family) {
    const DecoderArch *a = decoder_arch(family);
    c->family = family;
    c->attn_bias = (a->parts & PART_QKV_BIAS) != 0;
    c->qk_norm = (a->parts & PART_QK_NORM) != 0;
    c->vl = (a->parts & PART_VL) != 0;
    int gemma = (a->parts & PART_GEMMA) != 0;
    c->norm_offset = gemma ? 1.0f : 0.0f;
    c->post_norms = gemma;
    c->embed_scaled = gemma;
    c->act = gemma ? GLU_GELU_TANH : GLU_SILU;
}

// ---------------------------------------------------------------------------------------------
// presets

static const struct {
    const char *name;
    DecoderFamily family;
    int64_t vocab, hidden, inter, layers, heads, kv_heads, head_dim, max_pos;
    double theta;
    float eps;
    int tied;
    int64_t bos, eos;
    RopeFreqs rope;  // with a type: its scaling (theta above)
    int64_t window, pattern;  // Gemma: sliding_window, sliding_window_pattern
    double local_theta, query_scalar;  // Gemma: rope_local_base_freq, query_pre_attn_scalar
} presets[] = {
    {"tiny", ARCH_QWEN2, 151936, 64, 176, 2, 4, 2, 16, 2048, 1e6, 1e-6f, 1, 151643, 151645, {0}},
    {"qwen2.5-0.5b", ARCH_QWEN2, 151936, 896, 4864, 24, 14, 2, 64, 32768, 1e6, 1e-6f, 1, 151643, 151645, {0}},
    {"qwen2.5-1.5b", ARCH_QWEN2, 151936, 1536, 8960, 28, 12, 2, 128, 32768, 1e6, 1e-6f, 1, 151643, 151645, {0}},
    {"qwen2.5-3b", ARCH_QWEN2, 151936, 2048, 11008, 36, 16, 2, 128, 32768, 1e6, 1e-6f, 1, 151643, 151645, {0}},
    {"qwen2.5-7b", ARCH_QWEN2, 152064, 3584, 18944, 28, 28, 4, 128, 32768, 1e6, 1e-6f, 0, 151643, 151645, {0}},
    {"qwen3-tiny", ARCH_QWEN3, 151936, 64, 176, 2, 4, 2, 32, 2048, 1e6, 1e-6f, 1, 151643, 151645, {0}},
    {"qwen3-0.6b", ARCH_QWEN3, 151936, 1024, 3072, 28, 16, 8, 128, 40960, 1e6, 1e-6f, 1, 151643, 151645, {0}},
    {"qwen3-1.7b", ARCH_QWEN3, 151936, 2048, 6144, 28, 16, 8, 128, 40960, 1e6, 1e-6f, 1, 151643, 151645, {0}},
    {"qwen3-4b", ARCH_QWEN3, 151936, 2560, 9728, 36, 32, 8, 128, 40960, 1e6, 1e-6f, 1, 151643, 151645, {0}},
    {"qwen3-8b", ARCH_QWEN3, 151936, 4096, 12288, 36, 32, 8, 128, 40960, 1e6, 1e-6f, 0, 151643, 151645, {0}},
    // Llama 3.x: the 128k context through llama3's rescaling of an 8k one
    {"llama-tiny", ARCH_LLAMA, 128256, 64, 192, 2, 4, 2, 16, 131072, 500000.0, 1e-5f, 1, 128000, 128001,
     {0, ROPE_LLAMA3, 32.0, 1.0, 4.0, 8192}},
    {"llama-3.2-1b", ARCH_LLAMA, 128256, 2048, 8192, 16, 32, 8, 64, 131072, 500000.0, 1e-5f, 1, 128000, 128001,
     {0, ROPE_LLAMA3, 32.0, 1.0, 4.0, 8192}},
    {"llama-3.2-3b", ARCH_LLAMA, 128256, 3072, 8192, 28, 24, 8, 128, 131072, 500000.0, 1e-5f, 1, 128000, 128001,
     {0, ROPE_LLAMA3, 32.0, 1.0, 4.0, 8192}},
    {"llama-3.1-8b", ARCH_LLAMA, 128256, 4096, 14336, 32, 32, 8, 128, 131072, 500000.0, 1e-5f, 0, 128000, 128001,
     {0, ROPE_LLAMA3, 8.0, 1.0, 4.0, 8192}},
    {"mistral-7b", ARCH_MISTRAL, 32768, 4096, 14336, 32, 32, 8, 128, 32768, 1e6, 1e-5f, 0, 1, 2, {0}},
    // Gemma 3: five local layers (a 512- or 1024-key window, RoPE base 1e4) to each global one; the 4B's text
    // model rescales the global RoPE linearly by 8
    {"gemma3-tiny", ARCH_GEMMA3, 262144, 64, 192, 3, 4, 1, 16, 32768, 1e6, 1e-6f, 1, 2, 1, {0}, 16, 3, 1e4, 16},
    {"gemma-3-1b", ARCH_GEMMA3, 262144, 1152, 6912, 26, 4, 1, 256, 32768, 1e6, 1e-6f, 1, 2, 1, {0}, 512, 6, 1e4,
     256},
    {"gemma-3-4b", ARCH_GEMMA3, 262208, 2560, 10240, 34, 8, 4, 256, 131072, 1e6, 1e-6f, 1, 2, 1,
     {0, ROPE_LINEAR, 8.0}, 1024, 6, 1e4, 256},
};

int decoder_config_preset(DecoderConfig *c, const char *name) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(presets[i].name, name) != 0) continue;
        memset(c, 0, sizeof *c);
        decoder_config_family(c, presets[i].family);
        c->vocab = presets[i].vocab;
        c->hidden = presets[i].hidden;
        c->inter = presets[i].inter;
        c->layers = presets[i].layers;
        c->heads = presets[i].heads;
        c->kv_heads = presets[i].kv_heads;
        c->head_dim = presets[i].head_dim;
        c->max_pos = presets[i].max_pos;
        c->rope = presets[i].rope;
        c->rope.theta = presets[i].theta;
        c->eps = presets[i].eps;
        c->tied = presets[i].tied;
        c->bos_id = presets[i].bos;
        c->eos_id = presets[i].eos;
        c->sliding_window = presets[i].window;
        c->sliding_pattern = presets[i].pattern;
        c->rope_local.theta = presets[i].local_theta;
        c->query_scalar = presets[i].query_scalar;
        c->init_std = 0.02;
        return 1;
    }
    return 0;
}

const char *decoder_preset_names(void) {
    return "tiny, qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-3b, qwen2.5-7b, "
           "qwen3-tiny, qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b, "
           "llama-tiny, llama-3.2-1b, llama-3.2-3b, llama-3.1-8b, mistral-7b, gemma3-tiny, gemma-3-1b, gemma-3-4b";
}

// ---------------------------------------------------------------------------------------------
// config.json

void decoder_config_check(const DecoderConfig *c, const char *where) {
    // Bounds far above any real model keep every size product below 2^63.
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
    if (!(c->rope.theta > 0) || !(c->eps > 0)) die("%s: rope_theta and rms_norm_eps must be positive", where);
    if (c->family == ARCH_GEMMA3 && !(c->rope_local.theta > 0))
        die("%s: rope_local_base_freq must be positive", where);
    const RopeFreqs *r = &c->rope;
    if (r->type != ROPE_DEFAULT && !(r->factor >= 1 && r->factor <= 1e6))
        die("%s: the rope scaling factor %g is outside [1, 1e6]", where, r->factor);
    if (r->type == ROPE_LLAMA3 && !(r->low_freq_factor > 0 && r->high_freq_factor > r->low_freq_factor &&
                                    r->original_max_pos >= 1 && r->original_max_pos <= 1 << 24))
        die("%s: rope_scaling of type llama3 needs 0 < low_freq_factor < high_freq_factor and "
            "original_max_position_embeddings in [1, 2^24]", where);
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

void decoder_config_load(DecoderConfig *c, const char *dir) {
    decoder_config_load_vl(c, dir);
    if (c->vl)
        die("%s: a vision-language model: this command does not take them yet (grpo train, sft, generate, "
            "score and serve do)", dir);
}

void decoder_config_load_vl(DecoderConfig *c, const char *dir) {
    decoder_config_read(c, dir);
    if (c->score_labels)
        die("%s: a reward model (a sequence-classification checkpoint) scores responses "
            "(reward.reward_model.model_path, grpo score); it cannot generate or be trained as the policy", dir);
}

void decoder_config_load_rm(DecoderConfig *c, const char *dir) {
    decoder_config_read(c, dir);
    if (!c->score_labels)
        die("%s: a %s is not a reward model (a sequence-classification checkpoint, ...ForSequenceClassification)", dir,
            decoder_arch_name(c));
}

// transformers' num_labels: the size of id2label, 2 when the config has none (PretrainedConfig's default).
static int64_t num_labels(const cJSON *root, const char *path) {
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(root, "id2label");
    if (!ids || cJSON_IsNull(ids)) return json_get_int_or(root, "num_labels", 2, path);
    if (!cJSON_IsObject(ids)) die("%s: id2label must be an object", path);
    return cJSON_GetArraySize(ids);
}

// The names config.json may give (types: the model_types), for an error message.
static char *arch_names(int types) {
    char *out = xstrdup("");
    for (int i = 0; i < N_ARCHS; i++) {
        const char *names[2] = {types ? archs[i].model_type : archs[i].causal, types ? NULL : archs[i].score};
        for (int k = 0; k < 2; k++) {
            if (!names[k]) continue;
            char *next = xprintf("%s%s%s", out, *out ? ", " : "", names[k]);
            free(out);
            out = next;
        }
    }
    return out;
}

// The row config.json names (architectures[0], else model_type); *score: as a reward model's head.
static const DecoderArch *arch_of(const cJSON *root, const char *path, int *score) {
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const char *model_type = json_str(root, "model_type", path);
    *score = 0;
    if (cJSON_IsArray(arch)) {
        const cJSON *a0 = cJSON_GetArrayItem(arch, 0);
        const char *name = cJSON_IsString(a0) ? a0->valuestring : "?";
        for (int i = 0; i < N_ARCHS; i++) {
            *score = archs[i].score && !strcmp(name, archs[i].score);
            if (*score || !strcmp(name, archs[i].causal)) return &archs[i];
        }
        die("%s: unknown architecture \"%s\" (supported: %s)", path, name, arch_names(0));
    }
    for (int i = 0; model_type && i < N_ARCHS; i++)
        if (!strcmp(model_type, archs[i].model_type)) return &archs[i];
    die("%s: unknown architecture: model_type \"%s\" (supported: %s)", path, model_type ? model_type : "",
        arch_names(1));
}

// RoPE type `type` (NULL: default) and its factors from holder (`key`, for errors) into f: the default, or with
// the row's rescaling linear or llama3 (holder NULL: only the default); dies naming the key on any other.
static void rope_type_keys(RopeFreqs *f, const DecoderArch *arch, const cJSON *holder, const char *key,
                           const char *type, const char *path) {
    if (!type || !strcmp(type, "default")) return;
    int llama3 = !strcmp(type, "llama3"), linear = !strcmp(type, "linear");
    if (!holder || !(arch->parts & PART_ROPE_SCALING) || !(llama3 || linear))
        die("%s: %s.rope_type \"%s\" is unsupported for %s (%s)", path, key, type, arch->causal,
            holder && (arch->parts & PART_ROPE_SCALING) ? "default, linear or llama3" : "only default");
    f->type = llama3 ? ROPE_LLAMA3 : ROPE_LINEAR;
    f->factor = json_get_number_or(holder, "factor", 0, path);
    if (llama3) {
        f->low_freq_factor = json_get_number_or(holder, "low_freq_factor", 0, path);
        f->high_freq_factor = json_get_number_or(holder, "high_freq_factor", 0, path);
        f->original_max_pos = json_get_number_or(holder, "original_max_position_embeddings", 0, path);
    }
}

// rope_scaling (transformers 4) or rope_parameters (5): M-RoPE's sections of a VL model, Llama's rescaling, or
// nothing; Gemma's local layers' base (rope_local_base_freq, or rope_parameters per layer type); dies naming
// the key on any other.
static void rope_keys(DecoderConfig *c, const DecoderArch *arch, const cJSON *root, const char *path) {
    const cJSON *scaling = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    if (rp && !cJSON_IsNull(rp) && !cJSON_IsObject(rp)) die("%s: rope_parameters must be an object", path);
    if (scaling && !cJSON_IsNull(scaling) && !cJSON_IsObject(scaling)) die("%s: rope_scaling must be an object", path);
    c->rope.theta = json_get_number_or(root, "rope_theta", arch->theta, path);
    if (cJSON_IsObject(rp)) c->rope.theta = json_get_number_or(rp, "rope_theta", c->rope.theta, path);
    const cJSON *holder = cJSON_IsObject(scaling) ? scaling : cJSON_IsObject(rp) ? rp : NULL;
    const char *key = holder == scaling ? "rope_scaling" : "rope_parameters";
    const char *type = holder ? json_str(holder, "rope_type", path) : NULL;
    if (holder && !type) type = json_str(holder, "type", path);
    if (arch->parts & PART_VL) {  // M-RoPE: mrope_section
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
        return;
    }
    if (!type && holder == scaling && holder) die("%s: rope_scaling without a rope_type is unsupported", path);
    if ((arch->parts & PART_GEMMA) && cJSON_IsObject(rp) && cJSON_GetObjectItemCaseSensitive(rp, "full_attention")) {
        // transformers 5's Gemma 3: rope_parameters per layer type
        const cJSON *full = cJSON_GetObjectItemCaseSensitive(rp, "full_attention");
        const cJSON *local = cJSON_GetObjectItemCaseSensitive(rp, "sliding_attention");
        if (!cJSON_IsObject(full) || !cJSON_IsObject(local))
            die("%s: rope_parameters needs objects full_attention and sliding_attention", path);
        c->rope.theta = json_get_number_or(full, "rope_theta", arch->theta, path);
        c->rope_local.theta = json_get_number_or(local, "rope_theta", 10000.0, path);
        rope_type_keys(&c->rope, arch, full, "rope_parameters.full_attention", json_str(full, "rope_type", path), path);
        rope_type_keys(&c->rope_local, arch, NULL, "rope_parameters.sliding_attention",
                       json_str(local, "rope_type", path), path);
        return;
    }
    if (arch->parts & PART_GEMMA) c->rope_local.theta = json_get_number_or(root, "rope_local_base_freq", 1e4, path);
    rope_type_keys(&c->rope, arch, holder, key, type, path);
}

// Which of Gemma's layers slide: layer_types (transformers 5) must repeat (pattern - 1) sliding layers and a full
// one; or sliding_window_pattern (transformers 4).
static void layer_pattern(DecoderConfig *c, const cJSON *root, const char *path) {
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
    if (!types || cJSON_IsNull(types)) {
        c->sliding_pattern = json_get_int_or(root, "sliding_window_pattern", 6, path);
        if (c->sliding_pattern < 1 || c->sliding_pattern > 1 << 12)
            die("%s: sliding_window_pattern %lld is outside [1, 4096]", path, (long long)c->sliding_pattern);
        return;
    }
    if (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != c->layers)
        die("%s: layer_types must be a list of num_hidden_layers (%lld) strings", path, (long long)c->layers);
    int64_t l = 0;
    c->sliding_pattern = 0;  // every layer slides unless one is full
    for (const cJSON *e = types->child; e; e = e->next, l++) {
        int full = cJSON_IsString(e) && !strcmp(e->valuestring, "full_attention");
        if (!full && !(cJSON_IsString(e) && !strcmp(e->valuestring, "sliding_attention")))
            die("%s: layer_types[%lld] must be \"sliding_attention\" or \"full_attention\"", path, (long long)l);
        if (full && !c->sliding_pattern) c->sliding_pattern = l + 1;
    }
    l = 0;
    for (const cJSON *e = types->child; e; e = e->next, l++) {
        int slides = strcmp(e->valuestring, "sliding_attention") == 0;
        if (slides != decoder_layer_slides(c, l))
            die("%s: layer_types is not a repeating pattern of sliding layers and one full one (layer %lld)", path,
                (long long)l);
    }
}

// Gemma 3's keys beyond the table's flags: the local/global layers, the score scale, and the soft-caps (Gemma 2's,
// null in Gemma 3: refused when set).
static void gemma_keys(DecoderConfig *c, const cJSON *root, const char *path) {
    if (!c->sliding_window) die("%s: sliding_window must be set for Gemma 3's local layers", path);
    layer_pattern(c, root, path);
    c->query_scalar = json_get_number_or(root, "query_pre_attn_scalar", 256, path);
    if (!(c->query_scalar > 0)) die("%s: query_pre_attn_scalar %g must be positive", path, c->query_scalar);
    const char *caps[2] = {"final_logit_softcapping", "attn_logit_softcapping"};
    for (int i = 0; i < 2; i++) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, caps[i]);
        if (it && !cJSON_IsNull(it))
            die("%s: %s is unsupported (Gemma 2's soft-capping; Gemma 3 sets null)", path, caps[i]);
    }
    if (json_get_bool_or(root, "use_bidirectional_attention", 0, path))
        die("%s: use_bidirectional_attention: true (an embedding model) is unsupported", path);
}

void decoder_config_read(DecoderConfig *c, const char *dir) {
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) die("model directory %s does not exist", dir);
    char *path = path_join(dir, "config.json");
    cJSON *root = json_load_file(path, FILE_MAX_JSON);
    if (!cJSON_IsObject(root)) die("%s: not a JSON object", path);
    int score;
    const DecoderArch *arch = arch_of(root, path, &score);
    int vl = (arch->parts & PART_VL) != 0;
    // Qwen2.5-VL and Qwen2-VL: the language model's keys at the top (transformers 4) or in text_config (5)
    const cJSON *top = root;
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (vl && cJSON_IsObject(text) && cJSON_GetObjectItemCaseSensitive(text, "hidden_size")) root = (cJSON *)text;
    if ((arch->parts & PART_USE_SLIDING) && json_get_bool_or(root, "use_sliding_window", 0, path))
        die("%s: sliding-window attention (use_sliding_window: true) is unsupported", path);
    const char *act_key = arch->parts & PART_GEMMA ? "hidden_activation" : "hidden_act";
    const char *act_want = arch->parts & PART_GEMMA ? "gelu_pytorch_tanh" : "silu";
    const char *act = json_str(root, act_key, path);
    if (act && strcmp(act, act_want) != 0) die("%s: %s \"%s\" is unsupported (only %s)", path, act_key, act, act_want);
    memset(c, 0, sizeof *c);
    decoder_config_family(c, arch->family);
    c->image_pad_id = -1;
    if (score) {  // one score a response: what verl and TRL read of a reward model
        c->score_labels = num_labels(root, path);
        if (c->score_labels != 1)
            die("%s: a reward model with %lld labels (id2label); one score a response (num_labels 1) is supported",
                path, (long long)c->score_labels);
    }
    rope_keys(c, arch, root, path);
    if (vl) {
        c->image_pad_id = json_get_int_or(top, "image_token_id", 151655, path);
        // transformers writes a VL text config's keys only where they differ from its class defaults
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
    c->kv_heads = json_get_int_or(root, "num_key_value_heads", arch->kv_heads ? arch->kv_heads : c->heads, path);
    // Defaults below are HF's own (the row's config class), so a config that omits them means what it means there.
    c->max_pos = json_get_int_or(root, "max_position_embeddings", arch->max_pos, path);
    c->eps = (float)json_get_number_or(root, "rms_norm_eps", arch->eps, path);
    // transformers 5 keeps a VL model's tie_word_embeddings at the top, beside text_config
    int tied_top = json_get_bool_or(top, "tie_word_embeddings", 0, path);
    c->tied = json_get_bool_or(root, "tie_word_embeddings", tied_top || arch->tied, path);
    c->init_std = json_get_number_or(root, "initializer_range", 0.02, path);
    c->bos_id = token_id_or(root, "bos_token_id", path);
    c->eos_id = token_id_or(root, "eos_token_id", path);
    c->head_dim = c->heads > 0 ? c->hidden / c->heads : 0;
    int64_t hd = json_get_int_or(root, "head_dim", c->head_dim, path);
    if (arch->parts & PART_HEAD_DIM) {
        c->head_dim = hd;
    } else {
        if (c->heads > 0 && c->hidden % c->heads)
            die("%s: hidden_size %lld is not a multiple of num_attention_heads %lld", path, (long long)c->hidden,
                (long long)c->heads);
        if (hd != c->head_dim)
            die("%s: head_dim %lld != hidden_size / num_attention_heads is unsupported for %s", path, (long long)hd,
                arch->model_type);
    }
    // o_proj's bias (attention_bias) and the MLP's (mlp_bias) are not in the layout
    const char *bias_keys[2] = {"attention_bias", "mlp_bias"};
    for (int i = 0; i < 2 && (arch->parts & PART_BIAS_KEY); i++)
        if (json_get_bool_or(root, bias_keys[i], 0, path))
            die("%s: %s: true is unsupported for %s (only false)", path, bias_keys[i], arch->causal);
    if (arch->parts & PART_SLIDING_KEY) {  // null: full attention
        c->sliding_window = cJSON_GetObjectItemCaseSensitive(root, "sliding_window")
                                ? json_get_int_or(root, "sliding_window", 0, path)
                                : 4096;  // MistralConfig's default
        if (c->sliding_window < 0)
            die("%s: sliding_window %lld is not positive (null: full attention)", path,
                (long long)c->sliding_window);
    }
    if (arch->parts & PART_GEMMA) gemma_keys(c, root, path);
    if (vl && c->mrope_section[0] + c->mrope_section[1] + c->mrope_section[2] != c->head_dim / 2)
        die("%s: mrope_section [%d, %d, %d] does not add up to head_dim / 2 = %lld", path, c->mrope_section[0],
            c->mrope_section[1], c->mrope_section[2], (long long)(c->head_dim / 2));
    decoder_config_check(c, path);
    cJSON_Delete((cJSON *)top);
    free(path);
}

// v as a JSON number with a decimal point (32.0, not 32): transformers checks that a rope factor is a float.
static void add_float(cJSON *obj, const char *key, double v) {
    char buf[40];
    snprintf(buf, sizeof buf, "%.15g", v);
    if (strtod(buf, NULL) != v) snprintf(buf, sizeof buf, "%.17g", v);  // the shortest of the two that reads back v
    if (!strpbrk(buf, ".eEn")) strcat(buf, ".0");
    if (!cJSON_AddRawToObject(obj, key, buf)) die("out of memory");
}

// Gemma 3's own keys, as transformers 4.5x writes them and 5 reads them (layer_types beside the pattern).
static void gemma_json(cJSON *r, const DecoderConfig *c) {
    cJSON *types = cJSON_AddArrayToObject(r, "layer_types");
    if (!types) die("out of memory");
    for (int64_t l = 0; l < c->layers; l++)
        cJSON_AddItemToArray(types, cJSON_CreateString(decoder_layer_slides(c, l) ? "sliding_attention"
                                                                                  : "full_attention"));
    // no global layer: a pattern past the last layer (transformers divides by it)
    cJSON_AddNumberToObject(r, "sliding_window_pattern",
                            (double)(c->sliding_pattern ? c->sliding_pattern : c->layers + 1));
    cJSON_AddNumberToObject(r, "rope_local_base_freq", c->rope_local.theta);
    cJSON_AddNumberToObject(r, "query_pre_attn_scalar", c->query_scalar);
    cJSON_AddNullToObject(r, "final_logit_softcapping");
    cJSON_AddNullToObject(r, "attn_logit_softcapping");
}

cJSON *decoder_config_json(const DecoderConfig *c, DType dtype) {
    cJSON *r = cJSON_CreateObject(), *arch = cJSON_CreateArray();
    if (!r || !arch) die("out of memory");
    const DecoderArch *a = decoder_arch(c->family);
    cJSON_AddItemToArray(arch, cJSON_CreateString(decoder_arch_name(c)));
    cJSON_AddItemToObject(r, "architectures", arch);
    cJSON_AddStringToObject(r, "model_type", a->model_type);
    if (a->parts & PART_HEAD_DIM) cJSON_AddNumberToObject(r, "head_dim", (double)c->head_dim);
    if (a->parts & PART_BIAS_KEY) cJSON_AddBoolToObject(r, "attention_bias", 0);
    if (a->family == ARCH_LLAMA) cJSON_AddBoolToObject(r, "mlp_bias", 0);
    if (a->parts & PART_GEMMA) {
        cJSON_AddStringToObject(r, "hidden_activation", "gelu_pytorch_tanh");
        gemma_json(r, c);
    } else {
        cJSON_AddStringToObject(r, "hidden_act", "silu");
    }
    cJSON_AddNumberToObject(r, "vocab_size", (double)c->vocab);
    cJSON_AddNumberToObject(r, "hidden_size", (double)c->hidden);
    cJSON_AddNumberToObject(r, "intermediate_size", (double)c->inter);
    cJSON_AddNumberToObject(r, "num_hidden_layers", (double)c->layers);
    cJSON_AddNumberToObject(r, "num_attention_heads", (double)c->heads);
    cJSON_AddNumberToObject(r, "num_key_value_heads", (double)c->kv_heads);
    cJSON_AddNumberToObject(r, "max_position_embeddings", (double)c->max_pos);
    cJSON_AddNumberToObject(r, "rope_theta", c->rope.theta);
    if (c->rope.type != ROPE_DEFAULT) {  // transformers 4's rope_scaling, which 5 reads too
        cJSON *rs = cJSON_AddObjectToObject(r, "rope_scaling");
        if (!rs) die("out of memory");
        cJSON_AddStringToObject(rs, "rope_type", c->rope.type == ROPE_LLAMA3 ? "llama3" : "linear");
        add_float(rs, "factor", c->rope.factor);
        if (c->rope.type == ROPE_LLAMA3) {
            add_float(rs, "low_freq_factor", c->rope.low_freq_factor);
            add_float(rs, "high_freq_factor", c->rope.high_freq_factor);
            cJSON_AddNumberToObject(rs, "original_max_position_embeddings", c->rope.original_max_pos);
        }
    }
    // Print eps as the decimal the user means (1e-06), not the float's binary expansion.
    char eps[32];
    snprintf(eps, sizeof eps, "%.7g", (double)c->eps);
    cJSON_AddNumberToObject(r, "rms_norm_eps", strtod(eps, NULL));
    cJSON_AddNumberToObject(r, "initializer_range", c->init_std);
    cJSON_AddBoolToObject(r, "tie_word_embeddings", c->tied);
    if (a->parts & PART_USE_SLIDING) cJSON_AddBoolToObject(r, "use_sliding_window", 0);
    if ((a->parts & PART_SLIDING_KEY) && c->sliding_window) {
        cJSON_AddNumberToObject(r, "sliding_window", (double)c->sliding_window);
    } else if (a->parts & PART_SLIDING_KEY) {
        cJSON_AddNullToObject(r, "sliding_window");
    }
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

int decoder_stop_ids(const char *dir, int32_t *out, int max) {
    char *cfg = path_join(dir, "config.json"), *gen = path_join(dir, "generation_config.json");
    int n = add_eos_ids(gen, out, add_eos_ids(cfg, out, 0, max), max);
    free(cfg);
    free(gen);
    return n;
}
