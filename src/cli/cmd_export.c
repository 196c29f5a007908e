// grpo export: a model (an adapter merged first) in the files other runtimes serve: GGUF for llama.cpp (and
// Ollama, LM Studio), written as llama.cpp's convert_hf_to_gguf.py lays it out; ONNX (cli/export_onnx.c).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/util.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/export_onnx.h"
#include "io/gguf.h"
#include "io/image.h"
#include "io/onnx.h"
#include "model/decoder.h"
#include "model/lora.h"
#include "nn/ops.h"
#include "nn/q8.h"
#include "text/tokenizer.h"

// The Split regexes of the byte-level BPE tokenizers llama.cpp knows by name (its tokenizer.ggml.pre).
static const struct {
    const char *pre, *regex;
} PRE_TOKENIZERS[] = {
    {"qwen2", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
              "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    {"llama-bpe", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
                  "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
};

// llama.cpp's token types (llama_token_type).
enum { TOKEN_NORMAL = 1, TOKEN_CONTROL = 3, TOKEN_USER_DEFINED = 4, TOKEN_UNUSED = 5, TOKEN_BYTE = 6 };

// One tensor of the file: rows x cols of the slab from element `off` (or of `data`), rows in llama.cpp's order.
typedef struct {
    char name[64];
    size_t off;
    const float *data;  // instead of the slab (rope_freqs)
    int64_t rows, cols;
    int64_t heads;      // > 0: the rows are heads of HF's rotate-half pairs, written as llama.cpp's adjacent pairs
    float shift;        // added to every value: Gemma's (1 + w) norms as llama.cpp's plain multiplies
    GgufType type;
} Tensor;

typedef struct {
    Tensor *t;
    int n, cap;
    GgufType matrix;  // the matrices' type (--dtype); vectors are F32
} Tensors;

static void add(Tensors *ts, const char *name, size_t off, int64_t rows, int64_t cols, int64_t heads) {
    if (ts->n == ts->cap) {
        ts->cap = ts->cap ? 2 * ts->cap : 64;
        ts->t = xrealloc(ts->t, (size_t)ts->cap * sizeof *ts->t);
    }
    Tensor *t = &ts->t[ts->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->off = off;
    t->rows = rows;
    t->cols = cols;
    t->heads = heads;
    // Q8_0 needs whole blocks of 32 in a row: other matrices are F16, as convert_hf_to_gguf.py falls back
    t->type = rows == 1 ? GGUF_F32 : ts->matrix == GGUF_Q8_0 && cols % Q8_BLOCK ? GGUF_F16 : ts->matrix;
}

// The layer tensors of layer l: llama.cpp's name "blk.l.<what>" for HF's at slab offset base + l * size.
static void add_layer(Tensors *ts, int64_t l, const char *what, size_t base, int64_t rows, int64_t cols,
                      int64_t heads) {
    char name[64];
    snprintf(name, sizeof name, "blk.%lld.%s", (long long)l, what);
    add(ts, name, base + (size_t)(l * rows * cols), rows, cols, heads);
}

// The tensors of m in llama.cpp's names; `permute`: q and k rows as its non-NeoX RoPE pairs them (Llama's).
static void model_tensors(Tensors *ts, const Decoder *m, int permute) {
    const DecoderConfig *c = &m->cfg;
    const DecoderLayout *w = &m->w;
    int64_t C = c->hidden, I = c->inter, D = c->head_dim, Q = c->heads * D, KV = c->kv_heads * D;
    add(ts, "token_embd.weight", w->embed, c->vocab, C, 0);
    for (int64_t l = 0; l < c->layers; l++) {
        add_layer(ts, l, "attn_norm.weight", w->ln1, 1, C, 0);
        add_layer(ts, l, "attn_q.weight", w->wq, Q, C, permute ? c->heads : 0);
        add_layer(ts, l, "attn_k.weight", w->wk, KV, C, permute ? c->kv_heads : 0);
        add_layer(ts, l, "attn_v.weight", w->wv, KV, C, 0);
        if (c->attn_bias) {
            add_layer(ts, l, "attn_q.bias", w->bq, 1, Q, 0);
            add_layer(ts, l, "attn_k.bias", w->bk, 1, KV, 0);
            add_layer(ts, l, "attn_v.bias", w->bv, 1, KV, 0);
        }
        if (c->qk_norm) {
            add_layer(ts, l, "attn_q_norm.weight", w->qnorm, 1, D, 0);
            add_layer(ts, l, "attn_k_norm.weight", w->knorm, 1, D, 0);
        }
        add_layer(ts, l, "attn_output.weight", w->wo, C, Q, 0);
        if (c->post_norms) add_layer(ts, l, "post_attention_norm.weight", w->post_attn_norm, 1, C, 0);
        add_layer(ts, l, "ffn_norm.weight", w->ln2, 1, C, 0);
        add_layer(ts, l, "ffn_gate.weight", w->wgate, I, C, 0);
        add_layer(ts, l, "ffn_up.weight", w->wup, I, C, 0);
        add_layer(ts, l, "ffn_down.weight", w->wdown, C, I, 0);
        if (c->post_norms) add_layer(ts, l, "post_ffw_norm.weight", w->post_mlp_norm, 1, C, 0);
    }
    add(ts, "output_norm.weight", w->norm, 1, C, 0);
    if (!c->tied) add(ts, "output.weight", w->lm_head, c->vocab, C, 0);
    for (int i = 0; i < ts->n; i++) {  // as convert_hf_to_gguf.py: the offset of Gemma's norms folded in
        size_t n = strlen(ts->t[i].name), k = strlen("norm.weight");
        if (n >= k && !strcmp(ts->t[i].name + n - k, "norm.weight")) ts->t[i].shift = c->norm_offset;
    }
}

// Llama 3's RoPE rescaling as llama.cpp takes it: per pair j, the factor its angle is divided by.
static float *rope_factors(const DecoderConfig *c) {
    int D = (int)c->head_dim;
    RopeFreqs plain = {.theta = c->rope.theta};
    float *f = xmalloc((size_t)D / 2 * sizeof *f);
    for (int j = 0; j < D / 2; j++) f[j] = (float)(rope_inv_freq(plain, j, D) / rope_inv_freq(c->rope, j, D));
    return f;
}

// The source row of row r of a tensor: HF's head rows [pair 0 of each of the D/2 angles; pair 1 of each], or
// with heads, llama.cpp's (angle 0's pair, angle 1's pair, ...).
static int64_t source_row(const Tensor *t, int64_t r) {
    if (!t->heads) return r;
    int64_t D = t->rows / t->heads, h = r / D, i = r % D;
    return h * D + (i % 2) * (D / 2) + i / 2;
}

// A chunk of rows: CHUNK floats as fp32 and in the file's type (allocated before the file is opened).
#define CHUNK ((int64_t)1 << 20)

// A tensor's rows, a chunk at a time, from m's slab (fp32 or bf16) to f in the tensor's type.
static void write_tensor(AtomicFile *f, const Tensor *t, const Decoder *m, float *rows, void *out) {
    const char *slab = (const char *)m->params + t->off * dtype_size(m->dtype);
    DType dt = t->data ? DTYPE_F32 : m->dtype;
    const char *src = t->data ? (const char *)t->data : slab;
    size_t row_bytes = (size_t)t->cols * dtype_size(dt);
    int64_t chunk = t->cols >= CHUNK ? 1 : CHUNK / t->cols;
    size_t bytes = 0;
    for (int64_t r0 = 0; r0 < t->rows; r0 += chunk) {
        int64_t n = t->rows - r0 < chunk ? t->rows - r0 : chunk;
        for (int64_t r = 0; r < n; r++)
            dtype_to_f32(dt, src + (size_t)source_row(t, r0 + r) * row_bytes, rows + r * t->cols, (size_t)t->cols);
        size_t len = (size_t)(n * t->cols);
        for (size_t i = 0; t->shift != 0 && i < len; i++) rows[i] += t->shift;
        const void *data = out;
        if (t->type == GGUF_Q8_0) {
            q8_quantize(out, rows, DTYPE_F32, n, t->cols);
            len = len / Q8_BLOCK * sizeof(Q8Block);
        } else if (t->type == GGUF_F32) {
            data = rows;
            len *= sizeof *rows;
        } else {
            dtype_from_f32(t->type == GGUF_F16 ? DTYPE_F16 : DTYPE_BF16, rows, out, len);
            len *= 2;
        }
        atomic_file_write(f, data, len);
        bytes += len;
    }
    gguf_write_pad(f, bytes);
}

// A special token's id for key: the token tokenizer_config.json names, else `fallback` (config.json's); -1: none.
static int64_t special_id(Gguf *g, const char *key, const Tokenizer *t, const cJSON *cfg, const char *name,
                          int64_t fallback) {
    const char *s = cfg ? chat_config_token(cfg, name) : NULL;
    int64_t id = s ? tokenizer_token_id(t, s) : fallback;
    if (id >= 0) gguf_u32(g, key, (uint32_t)id);
    return id;
}

static int affixed(const char *s, size_t n, const char *prefix, const char *suffix) {
    size_t a = strlen(prefix), b = strlen(suffix);
    return n >= a && n >= b && !strncmp(s, prefix, a) && !strncmp(s + n - b, suffix, b);
}

// convert_hf_to_gguf.py's does_token_look_special: added tokens it makes control tokens though not special.
static int looks_special(const char *s, size_t n) {
    static const char *const names[] = {"<pad>", "<mask>", "<2mass>", "[@BOS@]"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strcmp(s, names[i])) return 1;
    return affixed(s, n, "<|", "|>") || affixed(s, n, "<\xef\xbd\x9c", "\xef\xbd\x9c>") ||  // <｜...｜>
           affixed(s, n, "<unused", ">");
}

// The name llama.cpp gives a byte-level tokenizer's pre-tokenizer, or a one-line refusal.
static const char *bpe_pre(const Tokenizer *t) {
    const char *pre = NULL;
    for (size_t i = 0; i < sizeof PRE_TOKENIZERS / sizeof *PRE_TOKENIZERS; i++)
        if (!strcmp(t->pattern, PRE_TOKENIZERS[i].regex)) pre = PRE_TOKENIZERS[i].pre;
    if (!pre) die("%s: its pre-tokenizer is neither Qwen2's nor Llama 3's, the ones llama.cpp names", t->path);
    if (t->ignore_merges != !strcmp(pre, "llama-bpe"))  // llama.cpp takes it from the name
        die("%s: \"ignore_merges\" %s with %s's pre-tokenizer: llama.cpp would tokenize it otherwise", t->path,
            t->ignore_merges ? "true" : "false", pre);
    return pre;
}

// Merge e of t into *out as "a b" (sep ' ') or as the piece it makes (sep 0); dies if the file changed since t
// read it.
static void merge_text(const Tokenizer *t, const cJSON *e, char sep, Buf *out) {
    const char *a, *b;
    size_t la, lb;
    if (tokenizer_merge_parts(e, &a, &la, &b, &lb)) die("%s: the merges changed while they were read", t->path);
    out->len = 0;
    buf_append(out, a, la);
    if (sep) buf_append(out, &sep, 1);
    buf_append(out, b, lb);
}

// A byte-level tokenizer's merges, as "a b".
static void bpe_kv(Gguf *g, const Tokenizer *t, const cJSON *merges) {
    size_t n_merges = (size_t)cJSON_GetArraySize(merges);
    char **mer = xmalloc((n_merges + 1) * sizeof *mer);
    size_t *mlen = xmalloc((n_merges + 1) * sizeof *mlen);
    size_t k = 0;
    Buf text = {0};
    for (const cJSON *e = merges ? merges->child : NULL; e; e = e->next, k++) {
        merge_text(t, e, ' ', &text);
        mer[k] = xprintf("%.*s", (int)text.len, text.data);
        mlen[k] = text.len;
    }
    gguf_strs(g, "tokenizer.ggml.merges", (const char *const *)mer, mlen, n_merges);
    for (size_t i = 0; i < n_merges; i++) free(mer[i]);
    buf_free(&text);
    free(mer);
    free(mlen);
}

// A SentencePiece-style tokenizer's scores for llama.cpp's "llama" vocabulary, whose tokenizer merges the
// adjacent pair that makes the highest-scoring piece: minus the rank of the first merge making each piece, so
// it merges in the merges' order (SentencePiece's converters list every split of a piece together, in the
// pieces' order); a piece no merge makes, below them all. Whether U+2581 is prepended (add_space_prefix, which
// llama.cpp's decode also strips as the Strip decoder does: a tokenizer doing one without the other is refused).
static void sp_kv(Gguf *g, const Tokenizer *t, const cJSON *merges, int64_t V) {
    if (t->strip != (t->prepend ? 1 : 0))
        die("%s: %s U+2581 and its decoder strips %d leading spaces: llama.cpp's add_space_prefix does both or "
            "neither, one space", t->path, t->prepend ? "prepends" : "does not prepend", t->strip);
    float *score = xmalloc((size_t)V * sizeof *score);
    for (int64_t i = 0; i < V; i++) score[i] = -1e9f;
    Buf piece = {0};
    int64_t rank = 0;
    for (const cJSON *e = merges ? merges->child : NULL; e; e = e->next, rank++) {
        merge_text(t, e, 0, &piece);
        int32_t id = piece.len ? strmap_get(&t->vocab, piece.data, piece.len) : -1;
        if (id < 0) die("%s: the merges changed while they were read", t->path);
        if (score[id] == -1e9f) score[id] = -(float)rank;
    }
    buf_free(&piece);
    gguf_f32s(g, "tokenizer.ggml.scores", score, (size_t)V);
    gguf_bool(g, "tokenizer.ggml.add_space_prefix", t->prepend);
    free(score);
}

// The tokenizer's metadata: llama.cpp's "gpt2" (byte-level BPE: its merges and pre-tokenizer's name) or "llama"
// (SentencePiece-style: scores, byte tokens) vocabulary of V ids (ids the tokenizer lacks are "[PADn]", unused),
// special tokens and the chat template.
static void tokenizer_kv(Gguf *g, const char *dir, const DecoderConfig *c) {
    int64_t V = c->vocab;
    Tokenizer t;
    tokenizer_load(&t, dir);
    if (t.n_ids > V) die("%s: %d token ids do not fit the model's vocab_size %lld", t.path, t.n_ids, (long long)V);
    cJSON *root = json_load_file(t.path, TOKENIZER_MAX_FILE);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const char **tok = xcalloc((size_t)V, sizeof *tok);
    size_t *len = xcalloc((size_t)V, sizeof *len);
    int32_t *type = xmalloc((size_t)V * sizeof *type);
    for (const cJSON *e = vocab ? vocab->child : NULL; e; e = e->next) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= (double)V)
            die("%s: the vocabulary changed while it was read", t.path);
        tok[(int64_t)e->valuedouble] = e->string;
    }
    for (int64_t i = 0; i < V; i++) type[i] = TOKEN_NORMAL;
    for (int i = 0; i < t.n_added; i++) {  // as convert_hf_to_gguf.py: special, or looking it
        const AddedToken *a = &t.added[i];
        tok[a->id] = a->content;
        type[a->id] = a->special || looks_special(a->content, a->len) ? TOKEN_CONTROL : TOKEN_USER_DEFINED;
        // SentencePiece-style: a piece of the vocab listed as added too (Gemma's runs of U+2581) stays a piece,
        // which llama.cpp decodes as one (U+2581 as a space)
        if (t.byte_fallback && !a->special && strmap_get(&t.vocab, a->content, a->len) >= 0)
            type[a->id] = TOKEN_NORMAL;
    }
    for (int b = 0; b < 256 && t.byte_fallback; b++) type[t.byte_id[b]] = TOKEN_BYTE;
    char **pads = xcalloc((size_t)V, sizeof *pads);
    for (int64_t i = 0; i < V; i++) {
        if (!tok[i]) {
            tok[i] = pads[i] = xprintf("[PAD%lld]", (long long)i);
            type[i] = TOKEN_UNUSED;
        }
        len[i] = strlen(tok[i]);
    }
    char *cfg_path = path_join(dir, "tokenizer_config.json");
    cJSON *cfg = file_exists(cfg_path) ? json_load_file(cfg_path, FILE_MAX_JSON) : NULL;
    gguf_str(g, "tokenizer.ggml.model", t.byte_fallback ? "llama" : "gpt2");
    if (!t.byte_fallback) gguf_str(g, "tokenizer.ggml.pre", bpe_pre(&t));
    gguf_strs(g, "tokenizer.ggml.tokens", tok, len, (size_t)V);
    gguf_i32s(g, "tokenizer.ggml.token_type", type, (size_t)V);
    if (t.byte_fallback)
        sp_kv(g, &t, merges, V);
    else
        bpe_kv(g, &t, merges);
    int64_t bos = special_id(g, "tokenizer.ggml.bos_token_id", &t, cfg, "bos_token", c->bos_id);
    special_id(g, "tokenizer.ggml.eos_token_id", &t, cfg, "eos_token", c->eos_id);
    special_id(g, "tokenizer.ggml.padding_token_id", &t, cfg, "pad_token", -1);
    if (t.byte_fallback) {  // (llama.cpp's llama vocabulary takes id 0 without it: Gemma's <pad>)
        const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
        int64_t unk_id = cJSON_IsString(unk) ? tokenizer_token_id(&t, unk->valuestring) : -1;
        special_id(g, "tokenizer.ggml.unknown_token_id", &t, cfg, "unk_token", unk_id);
    }
    // tokenizer_config.json's add_bos_token, else whether it names a bos (a fast tokenizer then adds it)
    const cJSON *add = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token") : NULL;
    int add_bos = cJSON_IsBool(add) ? cJSON_IsTrue(add) : cfg && chat_config_token(cfg, "bos_token");
    gguf_bool(g, "tokenizer.ggml.add_bos_token", add_bos && bos >= 0);
    if (t.chat.source) gguf_str(g, "tokenizer.chat_template", t.chat.source);
    for (int64_t i = 0; i < V; i++) free(pads[i]);
    free(pads);
    free(tok);
    free(len);
    free(type);
    free(cfg_path);
    cJSON_Delete(cfg);
    cJSON_Delete(root);
    tokenizer_free(&t);
}

// The architecture's hyperparameters under llama.cpp's keys.
static void model_kv(Gguf *g, const DecoderConfig *c, const char *arch, const char *name, uint32_t file_type) {
    char key[96];
#define KEY(k) (snprintf(key, sizeof key, "%s.%s", arch, k), key)
    gguf_str(g, "general.architecture", arch);
    gguf_str(g, "general.name", name);
    gguf_u32(g, "general.file_type", file_type);
    gguf_u32(g, "general.quantization_version", 2);
    gguf_u32(g, KEY("vocab_size"), (uint32_t)c->vocab);
    gguf_u32(g, KEY("context_length"), (uint32_t)c->max_pos);
    gguf_u32(g, KEY("embedding_length"), (uint32_t)c->hidden);
    gguf_u32(g, KEY("block_count"), (uint32_t)c->layers);
    gguf_u32(g, KEY("feed_forward_length"), (uint32_t)c->inter);
    gguf_u32(g, KEY("attention.head_count"), (uint32_t)c->heads);
    gguf_u32(g, KEY("attention.head_count_kv"), (uint32_t)c->kv_heads);
    gguf_u32(g, KEY("attention.key_length"), (uint32_t)c->head_dim);
    gguf_u32(g, KEY("attention.value_length"), (uint32_t)c->head_dim);
    gguf_u32(g, KEY("rope.dimension_count"), (uint32_t)c->head_dim);
    gguf_f32(g, KEY("rope.freq_base"), (float)c->rope.theta);
    gguf_f32(g, KEY("attention.layer_norm_rms_epsilon"), c->eps);
    if (c->rope.type == ROPE_LINEAR) {  // positions divided by the factor (Gemma: on its global layers only)
        gguf_str(g, KEY("rope.scaling.type"), "linear");
        gguf_f32(g, KEY("rope.scaling.factor"), (float)c->rope.factor);
    }
    if (c->family == ARCH_GEMMA3 && c->sliding_window > 0) {  // layer l slides unless pattern divides l + 1
        gguf_u32(g, KEY("attention.sliding_window"), (uint32_t)c->sliding_window);
        gguf_u32(g, KEY("attention.sliding_window_pattern"), (uint32_t)c->sliding_pattern);
        gguf_f32(g, KEY("rope.freq_base_swa"), (float)c->rope_local.theta);
    }
#undef KEY
}

// general.name: the model directory's last part.
static char *model_name(const char *dir) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t a = n;
    while (a > 0 && dir[a - 1] != '/') a--;
    return xprintf("%.*s", (int)(n - a), dir + a);
}

// llama.cpp's architecture for c, or a one-line refusal.
static const char *gguf_arch(const DecoderConfig *c, const char *dir) {
    if (c->vl)
        die("%s: a vision-language model's GGUF (a language model and an mmproj file) is not built yet", dir);
    if (c->score_labels) die("%s: a reward model has no GGUF architecture (llama.cpp runs causal LMs)", dir);
    if (c->family == ARCH_GEMMA3) {
        // llama.cpp's gemma3 scales queries by head_dim^-1/2, or the 27B's (62 layers) by (hidden / heads)^-1/2
        int64_t scalar = c->layers == 62 ? c->hidden / c->heads : c->head_dim;
        if (c->query_scalar != (double)scalar)
            die("%s: query_pre_attn_scalar %g: llama.cpp's gemma3 takes %lld for this shape", dir, c->query_scalar,
                (long long)scalar);
        if (c->rope.type == ROPE_LLAMA3) die("%s: llama3 RoPE scaling: llama.cpp's gemma3 takes linear only", dir);
        return "gemma3";
    }
    if (c->sliding_window > 0)
        die("%s: \"sliding_window\" %lld: llama.cpp's llama architecture has no sliding window", dir,
            (long long)c->sliding_window);
    if (c->rope.type == ROPE_LLAMA3 && c->family != ARCH_LLAMA)
        die("%s: llama3 RoPE scaling outside a Llama model is not exported to GGUF", dir);
    return c->family == ARCH_QWEN2 ? "qwen2" : c->family == ARCH_QWEN3 ? "qwen3" : "llama";
}

// The model of config c as stored (bf16 stays bf16), or in fp32 with an adapter merged in.
static void load_merged(Decoder *m, const char *dir, const char *adapter, const DecoderConfig *c) {
    decoder_load_config(m, dir, adapter ? DTYPE_F32 : decoder_file_dtype(dir), c);
    if (!adapter) return;
    Lora lora;
    lora_load(&lora, &m->cfg, adapter);
    lora_merge(m, &lora);
    lora_free(&lora);
}

// A vision-language model's ONNX: its language model (transformers.js's embed_tokens and decoder_model_merged) and
// its vision graphs for images of `size` (WxH).
static int onnx_vl_main(const char *dir, const char *out, const char *size, int f16, int external) {
    char *end = NULL;
    long width = size ? strtol(size, &end, 10) : 0, height = 0;
    if (end && *end == 'x' && end[1] >= '0' && end[1] <= '9') height = strtol(end + 1, &end, 10);
    if (!size || *end || width < 1 || height < 1 || (double)width * (double)height > IMAGE_MAX_PIXELS)
        die("%s: a vision-language model's ONNX needs --image-size WxH (its vision graphs are static; at most %lld "
            "pixels)%s%s", dir, (long long)IMAGE_MAX_PIXELS, size ? ", not " : "", size ? size : "");
    VlProcessor p;
    vl_processor_load(&p, dir);
    OnnxVision vis = {.p = &p, .width = (int)width, .height = (int)height};
    export_onnx_grid(&p, vis.width, vis.height, vis.grid);  // a refused size before any weight is read
    char *cfg_path = path_join(dir, "config.json");
    cJSON *cfg = json_load_file(cfg_path, FILE_MAX_JSON);
    VisionConfig vc;
    vision_config_parse(&vc, cJSON_GetObjectItemCaseSensitive(cfg, "vision_config"), cfg_path);
    Vision v;
    vision_load(&v, &vc, dir);
    vis.v = &v;
    Decoder m;
    decoder_load_vl(&m, dir, decoder_file_dtype(dir));
    vision_check(&vc, p.patch, p.temporal, p.merge, m.cfg.hidden, dir);
    double t0 = time_now();
    size_t bytes = export_onnx(&m, dir, out, f16, external, &vis);
    fprintf(stderr, "grpo export: wrote %s (ONNX opset %d, %s, %.2f GB of weights, %.1f s): embed_tokens, "
            "decoder_model_merged, vision_encoder (the processor's patches) and vision_encoder_image, for one %ld x "
            "%ld image (resized to %d x %d)\n", out, ONNX_OPSET, f16 ? "f16" : "f32", (double)bytes / 1e9,
            time_now() - t0, width, height, vis.grid[2] * p.patch, vis.grid[1] * p.patch);
    decoder_free(&m);
    vision_free(&v);
    cJSON_Delete(cfg);
    free(cfg_path);
    return 0;
}

// --format onnx: the folder, or a one-line refusal.
static int onnx_main(const char *dir, const char *adapter, const char *out, const char *dts, int external,
                     const char *image_size) {
    if (strcmp(dts, "f32") && strcmp(dts, "f16"))
        die("option --dtype: ONNX export takes f32 or f16, not \"%s\"", dts);
    DecoderConfig c;
    decoder_config_read(&c, dir);
    char *tok = path_join(dir, "tokenizer.json");
    if (!file_exists(tok)) die("%s: no tokenizer.json: the exported folder would have no tokenizer", dir);
    free(tok);
    if (c.vl && adapter) die("option --adapter: a vision-language model's adapter is not merged for ONNX yet");
    if (c.score_labels && adapter) die("option --adapter: a reward model's adapter is not merged for ONNX yet");
    if (c.vl) return onnx_vl_main(dir, out, image_size, !strcmp(dts, "f16"), external);
    if (image_size) die("option --image-size: %s is not a vision-language model", dir);
    Decoder m;
    load_merged(&m, dir, adapter, &c);
    double t0 = time_now();
    size_t bytes = export_onnx(&m, dir, out, !strcmp(dts, "f16"), external, NULL);
    fprintf(stderr, "grpo export: wrote %s (ONNX opset %d, %s, %.2f GB of weights, %.1f s)\n", out, ONNX_OPSET,
            dts, (double)bytes / 1e9, time_now() - t0);
    decoder_free(&m);
    return 0;
}

int cmd_export(int argc, char **argv) {
    CliOpt opts[] = {
        {"--model", "DIR", "the model (Hugging Face directory with its tokenizer)", NULL, 1},
        {"--adapter", "DIR", "a PEFT LoRA adapter of that model, merged in first", NULL, 0},
        {"--format", "gguf|onnx", "the file format", NULL, 1},
        {"--out", "PATH", "the file (gguf) or folder (onnx) to write", NULL, 1},
        {"--dtype", "f32|f16|bf16|q8_0", "the matrices' type (norms, biases stay f32; onnx: f32 or f16)", "f16", 0},
        {"--external-data", NULL, "onnx: the weights in a file beside the graph even under 2 GB", NULL, 0},
        {"--image-size", "WxH", "onnx of a VL model: the image size its static vision graph takes", NULL, 0},
        {"--force", NULL, "overwrite --out", NULL, 0},
    };
    CliSpec spec = {"grpo export --model DIR [--adapter DIR] --format gguf|onnx --out PATH [--dtype ...] "
                    "[--image-size WxH]",
                    "Writes the model, an adapter merged in first, for other runtimes. gguf: one file for\n"
                    "llama.cpp (and Ollama, LM Studio), convert_hf_to_gguf.py's layout for Qwen2, Qwen3, Llama\n"
                    "and Mistral models, the tokenizer and chat template inside; q8_0 is llama.cpp's 8-bit blocks\n"
                    "(a matrix whose rows are not whole blocks of 32 is f16, as the converter does). onnx: a\n"
                    "folder in Hugging Face Optimum's layout (onnx/model.onnx, or model_fp16.onnx, with its KV\n"
                    "cache, beside the config and tokenizer) that onnxruntime and transformers.js load, for\n"
                    "every model grpo trains (a vision-language model's vision graphs for one --image-size).",
                    opts, sizeof opts / sizeof opts[0]};
    cli_parse(&spec, argc, argv);
    const char *dir = cli_str(&spec, "--model"), *out = cli_str(&spec, "--out"), *fmt = cli_str(&spec, "--format");
    const char *adapter = cli_str(&spec, "--adapter"), *dts = cli_str(&spec, "--dtype");
    dir_check("option --model", dir);
    if (adapter) dir_check("option --adapter", adapter);
    if (strcmp(fmt, "gguf") && strcmp(fmt, "onnx")) die("option --format: \"%s\" is not gguf or onnx", fmt);
    if (!cli_str(&spec, "--force") && file_exists(out))
        die("%s exists; choose another --out or pass --force", out);
    int external = cli_str(&spec, "--external-data") != NULL;
    const char *image_size = cli_str(&spec, "--image-size");
    if (!strcmp(fmt, "onnx")) return onnx_main(dir, adapter, out, dts, external, image_size);
    if (image_size) die("option --image-size: only --format onnx has a vision graph");
    if (external) die("option --external-data: only --format onnx has external data");
    static const struct {
        const char *name;
        GgufType type;
        uint32_t file_type;  // llama_ftype
    } DTYPES[] = {{"f32", GGUF_F32, 0}, {"f16", GGUF_F16, 1}, {"q8_0", GGUF_Q8_0, 7}, {"bf16", GGUF_BF16, 32}};
    size_t d = 0, n_dtypes = sizeof DTYPES / sizeof *DTYPES;
    while (d < n_dtypes && strcmp(dts, DTYPES[d].name)) d++;
    if (d == n_dtypes) die("option --dtype: \"%s\" is not f32, f16, bf16 or q8_0", dts);
    DecoderConfig c;
    decoder_config_read(&c, dir);
    const char *arch = gguf_arch(&c, dir);
    Gguf g = {0};
    char *name = model_name(dir);
    model_kv(&g, &c, arch, name, DTYPES[d].file_type);
    tokenizer_kv(&g, dir, &c);  // before the weights: a tokenizer llama.cpp cannot take is refused at once
    Decoder m;
    load_merged(&m, dir, adapter, &c);
    Tensors ts = {.matrix = DTYPES[d].type};
    model_tensors(&ts, &m, !strcmp(arch, "llama"));  // the others rotate halves as HF does (NeoX)
    float *factors = NULL;
    if (c.rope.type == ROPE_LLAMA3) {
        factors = rope_factors(&c);
        add(&ts, "rope_freqs.weight", 0, 1, c.head_dim / 2, 0);
        ts.t[ts.n - 1].data = factors;
    }
    size_t total = 0;
    for (int i = 0; i < ts.n; i++) {
        const Tensor *t = &ts.t[i];
        if (t->cols > CHUNK) die("%s: %s rows of %lld values are beyond the export's chunk", dir, t->name,
                                 (long long)t->cols);
        total += gguf_tensor(&g, t->name, t->rows, t->cols, t->type);
    }
    float *rows = xmalloc((size_t)CHUNK * sizeof *rows);
    void *chunk = xmalloc((size_t)CHUNK * sizeof(float));
    AtomicFile f;
    atomic_file_open(&f, out);
    gguf_write_head(&g, &f);
    double t0 = time_now(), shown = t0;
    size_t done = 0;
    for (int i = 0; i < ts.n; i++) {
        write_tensor(&f, &ts.t[i], &m, rows, chunk);
        done += (size_t)(ts.t[i].rows * ts.t[i].cols);
        if (time_now() - shown > 5) {
            shown = time_now();
            fprintf(stderr, "grpo export: %.0f%% (%s)\n", 100.0 * (double)done / (double)m.n_params, ts.t[i].name);
        }
    }
    atomic_file_commit(&f);
    fprintf(stderr, "grpo export: wrote %s (GGUF %s, %s, %d tensors, %.2f GB, %.1f s)\n", out, arch, dts, ts.n,
            (double)total / 1e9, time_now() - t0);
    free(rows);
    free(chunk);
    free(factors);
    free(name);
    free(ts.t);
    gguf_free(&g);
    decoder_free(&m);
    return 0;
}
