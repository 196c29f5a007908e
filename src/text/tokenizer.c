#define _POSIX_C_SOURCE 200809L
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/tokenizer.h"

#include <cjson/cJSON.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#include "base/json.h"
#include "text/utf8.h"

// ---------------------------------------------------------------------------------------------
// ByteLevel: GPT-2's reversible map from the 256 byte values to printable code points.

static uint32_t byte_to_codepoint(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return (uint32_t)b;
    int n = 0;  // the others take 256, 257, ... in byte order
    for (int x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) n++;
    return 256 + (uint32_t)n;
}

// Undoes the byte-level map of a vocab string; -1 if a character is outside the map.
static int byte_level_decode(const char *s, size_t n, const int16_t *cp_to_byte, Buf *out) {
    size_t i = 0;
    while (i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0 || cp >= 512 || cp_to_byte[cp] < 0) return -1;
        unsigned char b = (unsigned char)cp_to_byte[cp];
        buf_append(out, &b, 1);
        i += (size_t)k;
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// word cache: direct-mapped, words up to CACHE_MAX_WORD bytes

#define CACHE_SLOTS (1 << 16)
#define CACHE_MAX_WORD 64

struct BpeCache {
    char *key[CACHE_SLOTS];
    uint8_t key_len[CACHE_SLOTS];
    int32_t *ids[CACHE_SLOTS];
    uint32_t n_ids[CACHE_SLOTS];
    // scratch for one word's merges, grown as needed
    int32_t *sym, *prev, *next;
    uint64_t *heap;
    size_t cap;
};

static void cache_free(BpeCache *c) {
    for (size_t i = 0; i < CACHE_SLOTS; i++) {
        free(c->key[i]);
        free(c->ids[i]);
    }
    free(c->sym);
    free(c->prev);
    free(c->next);
    free(c->heap);
    free(c);
}

// ---------------------------------------------------------------------------------------------
// loading

static const char *str_item(const cJSON *obj, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(it) ? it->valuestring : NULL;
}

static int is_type(const cJSON *obj, const char *type) {
    const char *t = str_item(obj, "type");
    return t && strcmp(t, type) == 0;
}

static void set_id_bytes(Tokenizer *t, int32_t id, const char *bytes, size_t n) {
    free(t->id_bytes[id]);
    t->id_bytes[id] = xmalloc(n + 1);
    memcpy(t->id_bytes[id], bytes, n);
    t->id_bytes[id][n] = '\0';
    t->id_len[id] = (uint32_t)n;
}

// SentencePiece's space, U+2581, in UTF-8.
#define SP_SPACE "\xe2\x96\x81"

// A Replace step of a normalizer or decoder: the string `from` (not a regex) by `to`.
static int is_replace(const cJSON *step, const char *from, const char *to) {
    const char *pattern = str_item(cJSON_GetObjectItemCaseSensitive(step, "pattern"), "String");
    const char *content = str_item(step, "content");
    return is_type(step, "Replace") && pattern && content && !strcmp(pattern, from) && !strcmp(content, to);
}

// A SentencePiece-style tokenizer's normalizer, decoder and pre-tokenizer: Replace(" " -> U+2581), after
// Prepend(U+2581) or not; Sequence[Replace(U+2581 -> " "), ByteFallback, Fuse], then Strip(" ", n, 0) or not;
// no pre-tokenizer, or Split(" ", MergedWithPrevious), which finds no space once the normalizer has replaced them.
static void sp_pipeline(Tokenizer *t, const cJSON *norm, const cJSON *dec, const cJSON *pre, const char *path) {
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(norm, "normalizers");
    const cJSON *first = cJSON_GetArrayItem(steps, 0), *last = cJSON_GetArrayItem(steps, 1);
    const char *prepend = str_item(first, "prepend");
    t->prepend = is_type(norm, "Sequence") && cJSON_GetArraySize(steps) == 2 && is_type(first, "Prepend") &&
                 prepend && !strcmp(prepend, SP_SPACE);
    if (!(t->prepend ? is_replace(last, " ", SP_SPACE) : is_replace(norm, " ", SP_SPACE)))
        die("%s: unsupported normalizer with byte_fallback (supported: Replace(\" \" -> \"\u2581\"), after "
            "Prepend(\"\u2581\") or not)", path);
    const cJSON *ds = cJSON_GetObjectItemCaseSensitive(dec, "decoders");
    int n = cJSON_GetArraySize(ds);
    const cJSON *strip = cJSON_GetArrayItem(ds, 3);
    const char *content = str_item(strip, "content");
    const cJSON *start = cJSON_GetObjectItemCaseSensitive(strip, "start");
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(strip, "stop");
    int strips = n == 4 && is_type(strip, "Strip") && content && !strcmp(content, " ") && cJSON_IsNumber(start) &&
                 start->valueint >= 0 && start->valueint <= TOKENIZER_MAX_STRIP && cJSON_IsNumber(stop) &&
                 stop->valueint == 0;
    int chain = is_replace(cJSON_GetArrayItem(ds, 0), SP_SPACE, " ") &&
                is_type(cJSON_GetArrayItem(ds, 1), "ByteFallback") && is_type(cJSON_GetArrayItem(ds, 2), "Fuse");
    if (!is_type(dec, "Sequence") || (n != 3 && !strips) || !chain)
        die("%s: unsupported decoder with byte_fallback (supported: Sequence[Replace(\"\u2581\" -> \" \"), "
            "ByteFallback, Fuse], then Strip(\" \", start, 0) or not)", path);
    t->strip = strips ? start->valueint : 0;
    const char *split = str_item(cJSON_GetObjectItemCaseSensitive(pre, "pattern"), "String");
    const char *behavior = str_item(pre, "behavior");
    int spaces = is_type(pre, "Split") && split && !strcmp(split, " ") && behavior &&
                 !strcmp(behavior, "MergedWithPrevious") &&
                 !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pre, "invert"));
    if (pre && !cJSON_IsNull(pre) && !spaces)
        die("%s: unsupported pre_tokenizer with byte_fallback (supported: none, or Split(\" \", "
            "MergedWithPrevious) as Gemma's)", path);
}

// A SentencePiece-style vocab entry's bytes: <0xXX> the byte XX, else its text with U+2581 as a space.
static void sp_piece_bytes(const char *s, Buf *out) {
    static const char HEX[] = "0123456789ABCDEF";
    const char *hi = strlen(s) == 6 && !strncmp(s, "<0x", 3) && s[5] == '>' ? strchr(HEX, s[3]) : NULL;
    const char *lo = hi ? strchr(HEX, s[4]) : NULL;
    if (lo) {  // (s[3] and s[4] are not NUL: strchr would find HEX's end)
        unsigned char b = (unsigned char)((hi - HEX) << 4 | (lo - HEX));
        buf_append(out, &b, 1);
        return;
    }
    for (const char *p = s; *p;) {
        const char *sp = strstr(p, SP_SPACE);
        size_t k = sp ? (size_t)(sp - p) : strlen(p);
        buf_append(out, p, k);
        if (!sp) break;
        buf_append(out, " ", 1);
        p = sp + 3;
    }
}

// The Qwen2 pre-tokenizer: Sequence[Split(Regex, Isolated), ByteLevel(use_regex: false)].
static const char *split_pattern(const cJSON *pre, const char *path) {
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers");
    const cJSON *split = cJSON_GetArrayItem(list, 0), *bl = cJSON_GetArrayItem(list, 1);
    if (!is_type(pre, "Sequence") || cJSON_GetArraySize(list) != 2 || !is_type(split, "Split") ||
        !is_type(bl, "ByteLevel"))
        die("%s: unsupported pre_tokenizer (expected Sequence[Split, ByteLevel] as in Qwen2)", path);
    const char *behavior = str_item(split, "behavior");
    const char *regex = str_item(cJSON_GetObjectItemCaseSensitive(split, "pattern"), "Regex");
    if (!regex || !behavior || strcmp(behavior, "Isolated") != 0 ||
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(split, "invert")))
        die("%s: unsupported Split pre-tokenizer (expected a Regex pattern, behavior Isolated, invert false)", path);
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(bl, "use_regex")) ||
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(bl, "add_prefix_space")))
        die("%s: unsupported ByteLevel pre-tokenizer options (use_regex / add_prefix_space)", path);
    return regex;
}

static void compile_regex(Tokenizer *t, const char *pattern, const char *path) {
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        die("%s: pre-tokenizer regex does not compile at offset %zu: %s", path, (size_t)off, (char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  // best effort: the interpreter gives the same matches
    t->regex = re;
    t->match_data = pcre2_match_data_create_from_pattern(re, NULL);
    if (!t->match_data) die("out of memory compiling the pre-tokenizer regex");
}

static void load_model(Tokenizer *t, const cJSON *model, const char *path) {
    if (!is_type(model, "BPE")) die("%s: unknown model type \"%s\" (supported: BPE)", path, str_item(model, "type") ? str_item(model, "type") : "");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges)) die("%s: model needs a \"vocab\" object and a \"merges\" array", path);
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    const char *prefix = str_item(model, "continuing_subword_prefix"), *suffix = str_item(model, "end_of_word_suffix");
    if ((dropout && !cJSON_IsNull(dropout)) || (prefix && *prefix) || (suffix && *suffix))
        die("%s: unsupported BPE options (dropout, subword prefix/suffix)", path);
    t->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));

    int16_t cp_to_byte[512];
    memset(cp_to_byte, 0xff, sizeof cp_to_byte);
    for (int b = 0; b < 256; b++) cp_to_byte[byte_to_codepoint(b)] = (int16_t)b;
    strmap_init(&t->vocab, (size_t)cJSON_GetArraySize(vocab));
    Buf bytes = {0};
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int64_t id;
        if (!json_as_int(e, 0, INT32_MAX - 1, &id)) die("%s: vocab entry \"%s\" has no valid id", path, e->string);
        if (id >= t->n_ids) die("%s: vocab id %lld is out of range", path, (long long)id);
        bytes.len = 0;
        if (t->byte_fallback)
            sp_piece_bytes(e->string, &bytes);
        else if (byte_level_decode(e->string, strlen(e->string), cp_to_byte, &bytes) != 0)
            die("%s: vocab entry \"%s\" is not byte-level encoded", path, e->string);
        strmap_put(&t->vocab, e->string, strlen(e->string), (int32_t)id);
        set_id_bytes(t, (int32_t)id, bytes.data ? bytes.data : "", bytes.len);
    }
    buf_free(&bytes);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        if (t->byte_fallback && (t->byte_id[b] = strmap_get(&t->vocab, name, strlen(name))) < 0)
            die("%s: byte_fallback, but the vocab lacks the token %s", path, name);
        if (t->byte_fallback) continue;
        char *ch = t->byte_char[b];
        size_t n = (size_t)utf8proc_encode_char((utf8proc_int32_t)byte_to_codepoint(b), (utf8proc_uint8_t *)ch);
        ch[n] = '\0';
        if ((t->byte_id[b] = strmap_get(&t->vocab, ch, n)) < 0) die("%s: vocab lacks the token for byte 0x%02x", path, b);
    }

    u64map_init(&t->merges, (size_t)cJSON_GetArraySize(merges));
    int64_t rank = 0;
    Buf joined = {0};
    for (const cJSON *e = merges->child; e; e = e->next, rank++) {
        const char *a, *b;
        size_t la, lb;
        if (tokenizer_merge_parts(e, &a, &la, &b, &lb)) {
            if (cJSON_IsString(e))
                die("%s: merge %lld \"%s\" is not two tokens", path, (long long)rank, e->valuestring);
            die("%s: merge %lld is neither \"a b\" nor [\"a\", \"b\"]", path, (long long)rank);
        }
        joined.len = 0;
        buf_append(&joined, a, la);
        buf_append(&joined, b, lb);
        int32_t ia = strmap_get(&t->vocab, a, la), ib = strmap_get(&t->vocab, b, lb);
        int32_t im = strmap_get(&t->vocab, joined.data, joined.len);
        if (ia < 0 || ib < 0 || im < 0) die("%s: merge %lld (\"%.*s\" + \"%.*s\") uses tokens missing from the vocab", path, (long long)rank, (int)la, a, (int)lb, b);
        uint64_t key = (uint64_t)ia << 32 | (uint32_t)ib, old;
        if (!u64map_get(&t->merges, key, &old))  // the first (lowest-rank) occurrence wins
            u64map_put(&t->merges, key, (uint64_t)rank << 32 | (uint32_t)im);
    }
    buf_free(&joined);
}

int tokenizer_merge_parts(const cJSON *e, const char **a, size_t *la, const char **b, size_t *lb) {
    if (cJSON_IsString(e)) {  // "a b"
        const char *sp = strchr(e->valuestring, ' ');
        if (!sp || strchr(sp + 1, ' ')) return -1;
        *a = e->valuestring;
        *la = (size_t)(sp - *a);
        *b = sp + 1;
        *lb = strlen(*b);
        return 0;
    }
    if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2 || !cJSON_IsString(e->child) ||
        !cJSON_IsString(e->child->next))
        return -1;
    *a = e->child->valuestring;  // ["a", "b"]
    *la = strlen(*a);
    *b = e->child->next->valuestring;
    *lb = strlen(*b);
    return 0;
}

static void load_added(Tokenizer *t, const cJSON *added, const char *path) {
    t->n_added = cJSON_GetArraySize(added);
    t->added = xcalloc((size_t)t->n_added, sizeof(AddedToken));
    int i = 0;
    for (const cJSON *e = added->child; e; e = e->next, i++) {
        const char *content = str_item(e, "content");
        int64_t id;
        if (!content || !*content || !json_as_int(cJSON_GetObjectItemCaseSensitive(e, "id"), 0, t->n_ids - 1, &id))
            die("%s: added_tokens[%d] needs a non-empty \"content\" and a valid \"id\"", path, i);
        static const char *flags[] = {"lstrip", "rstrip", "single_word", "normalized", "special"};
        for (int f = 0; f < 5; f++) {
            const cJSON *x = cJSON_GetObjectItemCaseSensitive(e, flags[f]);
            if (x && !cJSON_IsBool(x) && !cJSON_IsNull(x))
                die("%s: added token \"%s\": \"%s\" must be true or false", path, content, flags[f]);
            if (f < 4 && cJSON_IsTrue(x))
                die("%s: added token \"%s\": \"%s\": true is unsupported", path, content, flags[f]);
        }
        t->added[i] = (AddedToken){xstrdup(content), strlen(content), (int32_t)id,
                                   cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "special"))};
        t->added_first[(unsigned char)content[0]] = 1;
        Buf text = {0};  // what the decoder makes of it (SentencePiece-style: U+2581 as a space, as for the vocab)
        if (t->byte_fallback) sp_piece_bytes(content, &text);
        else buf_append(&text, content, strlen(content));
        set_id_bytes(t, (int32_t)id, text.data ? text.data : "", text.len);
        buf_free(&text);
    }
}

// Largest id + 1 over vocab and added tokens, so id arrays can be sized before filling. Ids are dense in
// real tokenizers: one far past the number of entries would size those arrays by an attacker's number
// (id 2^31-2: 16 GB), so the largest id must stay below 2 x entries + 1024 and 2^24.
static int32_t count_ids(const cJSON *vocab, const cJSON *added, const char *path) {
    int64_t max = -1, id, entries = 0;
    for (const cJSON *e = vocab ? vocab->child : NULL; e; e = e->next, entries++)
        if (json_as_int(e, 0, INT32_MAX - 1, &id) && id > max) max = id;
    for (const cJSON *e = added ? added->child : NULL; e; e = e->next, entries++)
        if (json_as_int(cJSON_GetObjectItemCaseSensitive(e, "id"), 0, INT32_MAX - 1, &id) && id > max) max = id;
    int64_t cap = 2 * entries + 1024 < (1 << 24) ? 2 * entries + 1024 : 1 << 24;
    if (max >= cap)
        die("%s: token id %lld is far past the %lld vocab and added entries (ids must be dense, below %lld)", path,
            (long long)max, (long long)entries, (long long)cap);
    return (int32_t)(max + 1);
}

static int32_t config_token(const Tokenizer *t, const cJSON *cfg, const char *key, const char *path) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(it)) it = cJSON_GetObjectItemCaseSensitive(it, "content");  // {"content": "..."} form
    if (!it || cJSON_IsNull(it)) return -1;
    if (!cJSON_IsString(it)) die("%s: \"%s\" must be a token string", path, key);
    int32_t id = tokenizer_token_id(t, it->valuestring);
    if (id < 0) die("%s: \"%s\" names \"%s\", which is not a token", path, key, it->valuestring);
    return id;
}

static void load_config(Tokenizer *t, const char *path, const char *dir) {
    cJSON *cfg = json_load_file(path, FILE_MAX_JSON);
    if (!cJSON_IsObject(cfg)) die("%s: not a JSON object", path);
    t->eos_id = config_token(t, cfg, "eos_token", path);
    t->pad_id = config_token(t, cfg, "pad_token", path);
    chat_template_load(&t->chat, dir, cfg, path);
    cJSON_Delete(cfg);
}

void tokenizer_load(Tokenizer *t, const char *path) {
    memset(t, 0, sizeof *t);
    t->eos_id = t->pad_id = -1;
    struct stat sb;
    if (stat(path, &sb) != 0) die("tokenizer %s does not exist", path);
    char *dir = S_ISDIR(sb.st_mode) ? xstrdup(path) : NULL;
    if (!dir) {  // a file: its directory may hold tokenizer_config.json
        const char *slash = strrchr(path, '/');
        dir = slash ? strndup(path, (size_t)(slash - path)) : xstrdup(".");
        if (!dir) die("out of memory");
    }
    t->path = S_ISDIR(sb.st_mode) ? path_join(path, "tokenizer.json") : xstrdup(path);
    cJSON *root = json_load_file(t->path, TOKENIZER_MAX_FILE);
    const char *p = t->path;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    if (!cJSON_IsObject(model)) die("%s: missing \"model\"", p);
    if (added && !cJSON_IsNull(added) && !cJSON_IsArray(added)) die("%s: \"added_tokens\" must be an array", p);
    t->byte_fallback = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"));
    if (t->byte_fallback) {
        sp_pipeline(t, norm, dec, pre, p);
    } else {
        if (norm && !cJSON_IsNull(norm) && !is_type(norm, "NFC"))
            die("%s: unsupported normalizer (supported: NFC or none; with byte_fallback, SentencePiece's)", p);
        t->nfc = is_type(norm, "NFC");
        if (!is_type(dec, "ByteLevel")) die("%s: unsupported decoder (supported: ByteLevel)", p);
        t->pattern = xstrdup(split_pattern(pre, p));
    }

    t->n_ids = count_ids(cJSON_GetObjectItemCaseSensitive(model, "vocab"), added, p);
    t->id_bytes = xcalloc((size_t)t->n_ids + 1, sizeof *t->id_bytes);
    t->id_len = xcalloc((size_t)t->n_ids + 1, sizeof *t->id_len);
    load_model(t, model, p);
    if (cJSON_IsArray(added)) load_added(t, added, p);
    if (t->pattern) compile_regex(t, t->pattern, p);
    cJSON_Delete(root);

    t->cache = xcalloc(1, sizeof(BpeCache));
    char *cfg = path_join(dir, "tokenizer_config.json");
    if (file_exists(cfg)) load_config(t, cfg, dir);
    else chat_template_load(&t->chat, dir, NULL, NULL);
    free(cfg);
    free(dir);
}

void tokenizer_free(Tokenizer *t) {
    for (int32_t i = 0; i < t->n_ids; i++) free(t->id_bytes[i]);
    free(t->id_bytes);
    free(t->id_len);
    strmap_free(&t->vocab);
    u64map_free(&t->merges);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    pcre2_match_data_free(t->match_data);
    pcre2_code_free(t->regex);
    free(t->pattern);
    if (t->cache) cache_free(t->cache);
    chat_template_free(&t->chat);
    free(t->path);
    memset(t, 0, sizeof *t);
}

int32_t tokenizer_token_id(const Tokenizer *t, const char *token) {
    for (int i = 0; i < t->n_added; i++)
        if (strcmp(t->added[i].content, token) == 0) return t->added[i].id;
    return strmap_get(&t->vocab, token, strlen(token));
}

// ---------------------------------------------------------------------------------------------
// encoding

void idlist_push(IdList *l, int32_t id) {
    if (l->n == l->cap) l->ids = xrealloc(l->ids, (l->cap = l->cap ? 2 * l->cap : 64) * sizeof(int32_t));
    l->ids[l->n++] = id;
}

// Min-heap of (rank << 32 | position): the lowest rank merges first, the leftmost among equals.
static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0 && h[(i - 1) / 2] > v) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
    return top;
}

static int merge_of(const Tokenizer *t, int32_t a, int32_t b, uint64_t *rank_and_id) {
    return u64map_get(&t->merges, (uint64_t)a << 32 | (uint32_t)b, rank_and_id);
}

// The symbols a word of n bytes starts as (at most n): each byte's token (byte-level); each character's token,
// or its bytes' <0xXX> tokens where the vocab lacks it (SentencePiece-style). Returns their count.
static size_t first_symbols(const Tokenizer *t, const unsigned char *w, size_t n, int32_t *sym) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        size_t len = 1;  // the text is valid UTF-8: a character's length is its first byte's
        if (t->byte_fallback) len = w[i] < 0x80 ? 1 : w[i] < 0xE0 ? 2 : w[i] < 0xF0 ? 3 : 4;
        if (len > n - i) len = n - i;
        int32_t id = t->byte_fallback ? strmap_get(&t->vocab, (const char *)w + i, len) : -1;
        if (id >= 0) sym[k++] = id;
        for (size_t j = 0; id < 0 && j < len; j++) sym[k++] = t->byte_id[w[i + j]];
        i += len;
    }
    return k;
}

// BPE over one pre-token of n raw bytes (SentencePiece-style: the normalized text): O(n log n) with a heap and a
// linked list.
static void bpe_word(Tokenizer *t, const unsigned char *w, size_t n, IdList *out) {
    BpeCache *c = t->cache;
    size_t slot = 0;
    if (n <= CACHE_MAX_WORD) {
        slot = hash_bytes(w, n) & (CACHE_SLOTS - 1);
        if (c->key[slot] && c->key_len[slot] == n && memcmp(c->key[slot], w, n) == 0) {
            for (uint32_t i = 0; i < c->n_ids[slot]; i++) idlist_push(out, c->ids[slot][i]);
            return;
        }
    }
    size_t start = out->n;
    int32_t whole = -1;
    if (t->ignore_merges && t->byte_fallback) {
        whole = strmap_get(&t->vocab, (const char *)w, n);
    } else if (t->ignore_merges) {  // the word as one vocab token, if it is one
        Buf s = {0};
        for (size_t i = 0; i < n; i++) buf_append(&s, t->byte_char[w[i]], strlen(t->byte_char[w[i]]));
        whole = s.data ? strmap_get(&t->vocab, s.data, s.len) : -1;
        buf_free(&s);
    }
    if (whole >= 0) {
        idlist_push(out, whole);
    } else {
        if (n > c->cap) {
            c->cap = n;
            c->sym = xrealloc(c->sym, n * sizeof *c->sym);
            c->prev = xrealloc(c->prev, n * sizeof *c->prev);
            c->next = xrealloc(c->next, n * sizeof *c->next);
            c->heap = xrealloc(c->heap, 3 * n * sizeof *c->heap);  // n-1 initial pairs + 2 per merge
        }
        int32_t *sym = c->sym, *prev = c->prev, *next = c->next;
        size_t hn = 0;
        uint64_t m;
        size_t k = first_symbols(t, w, n, sym);
        for (size_t i = 0; i < k; i++) {
            prev[i] = (int32_t)i - 1;
            next[i] = i + 1 < k ? (int32_t)i + 1 : -1;
        }
        for (size_t i = 0; i + 1 < k; i++)
            if (merge_of(t, sym[i], sym[i + 1], &m)) heap_push(c->heap, &hn, (m >> 32) << 32 | i);
        while (hn) {
            uint64_t top = heap_pop(c->heap, &hn);
            int32_t pos = (int32_t)(uint32_t)top, nx = next[pos];
            // Stale entries: the symbol was merged away, or its right neighbour changed.
            if (sym[pos] < 0 || nx < 0 || !merge_of(t, sym[pos], sym[nx], &m) || (m >> 32) != (top >> 32)) continue;
            sym[pos] = (int32_t)(uint32_t)m;
            sym[nx] = -1;
            next[pos] = next[nx];
            if (next[nx] >= 0) prev[next[nx]] = pos;
            if (prev[pos] >= 0 && merge_of(t, sym[prev[pos]], sym[pos], &m))
                heap_push(c->heap, &hn, (m >> 32) << 32 | (uint32_t)prev[pos]);
            if (next[pos] >= 0 && merge_of(t, sym[pos], sym[next[pos]], &m))
                heap_push(c->heap, &hn, (m >> 32) << 32 | (uint32_t)pos);
        }
        for (int32_t i = 0; i >= 0; i = next[i]) idlist_push(out, sym[i]);
    }
    if (n <= CACHE_MAX_WORD) {
        size_t k = out->n - start;
        free(c->key[slot]);
        free(c->ids[slot]);
        c->key[slot] = xmalloc(n);
        memcpy(c->key[slot], w, n);
        c->key_len[slot] = (uint8_t)n;
        c->ids[slot] = xmalloc(k * sizeof(int32_t));
        memcpy(c->ids[slot], out->ids + start, k * sizeof(int32_t));
        c->n_ids[slot] = (uint32_t)k;
    }
}

// SentencePiece-style: U+2581 prepended (when the normalizer does) and for each space, then BPE over it all.
static void sp_segment(Tokenizer *t, const char *s, size_t n, IdList *out) {
    Buf w = {0};
    if (t->prepend) buf_append(&w, SP_SPACE, 3);
    for (size_t i = 0; i < n;) {
        const char *sp = memchr(s + i, ' ', n - i);
        size_t k = sp ? (size_t)(sp - s) - i : n - i;
        buf_append(&w, s + i, k);
        if (sp) buf_append(&w, SP_SPACE, 3);
        i += k + (sp != NULL);
    }
    bpe_word(t, (const unsigned char *)w.data, w.len, out);
    buf_free(&w);
}

// NFC (when the normalizer is), then the Split regex in Isolated mode: matches and the gaps between them are
// pre-tokens (SentencePiece-style: sp_segment).
static void encode_segment(Tokenizer *t, const char *s, size_t n, IdList *out) {
    if (n == 0) return;
    if (t->byte_fallback) {
        sp_segment(t, s, n, out);
        return;
    }
    utf8proc_uint8_t *nfc = NULL;
    int ascii = 1;
    for (size_t i = 0; i < n && ascii; i++) ascii = (unsigned char)s[i] < 0x80;
    if (!ascii && t->nfc) {  // ASCII is already NFC
        utf8proc_ssize_t len = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &nfc,
                                            UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (len < 0) die("NFC normalisation failed: %s", utf8proc_errmsg(len));
        s = (const char *)nfc;
        n = (size_t)len;
    }
    size_t pos = 0;
    while (pos < n) {
        int rc = pcre2_match(t->regex, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, t->match_data, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) die("pre-tokenizer regex failed (PCRE2 error %d)", rc);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->match_data);
        size_t ms = ov[0], me = ov[1];
        if (ms > pos) bpe_word(t, (const unsigned char *)s + pos, ms - pos, out);
        if (me == ms) {  // an empty match would not advance: step one character
            size_t k = 1;
            while (ms + k < n && ((unsigned char)s[ms + k] & 0xC0) == 0x80) k++;
            bpe_word(t, (const unsigned char *)s + ms, k, out);
            me = ms + k;
        } else {
            bpe_word(t, (const unsigned char *)s + ms, me - ms, out);
        }
        pos = me;
    }
    if (pos < n) bpe_word(t, (const unsigned char *)s + pos, n - pos, out);
    free(nfc);
}

int tokenizer_encode(Tokenizer *t, const char *text, size_t n, IdList *out, size_t *bad_offset) {
    size_t bad = utf8_check(text, n);
    if (bad < n) {
        if (bad_offset) *bad_offset = bad;
        return -1;
    }
    // Added tokens are found in the raw text first (leftmost, then longest), as Hugging Face does.
    size_t seg = 0;
    for (size_t i = 0; i < n; i++) {
        if (!t->added_first[(unsigned char)text[i]]) continue;
        const AddedToken *best = NULL;
        for (int k = 0; k < t->n_added; k++) {
            const AddedToken *a = &t->added[k];
            if (a->len <= n - i && memcmp(text + i, a->content, a->len) == 0 && (!best || a->len > best->len)) best = a;
        }
        if (!best) continue;
        encode_segment(t, text + seg, i - seg, out);
        idlist_push(out, best->id);
        i += best->len - 1;
        seg = i + 1;
    }
    encode_segment(t, text + seg, n - seg, out);
    return 0;
}

// ---------------------------------------------------------------------------------------------
// decoding

const char *tokenizer_id_bytes(const Tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_ids || !t->id_bytes[id]) return NULL;
    *len = t->id_len[id];
    return t->id_bytes[id];
}

int tokenizer_id_special(const Tokenizer *t, int32_t id) {
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].id == id) return t->added[i].special;
    return 0;
}

int tokenizer_decode(const Tokenizer *t, const int32_t *ids, size_t n, Buf *out, size_t *bad_index) {
    Buf raw = {0};
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const char *b = tokenizer_id_bytes(t, ids[i], &len);
        if (!b) {
            buf_free(&raw);
            if (bad_index) *bad_index = i;
            return -1;
        }
        buf_append(&raw, b, len);
    }
    size_t skip = tokenizer_lead_strip(t, raw.data, raw.len);
    utf8_append_lossy(out, raw.data ? raw.data + skip : "", raw.len - skip);
    buf_free(&raw);
    return 0;
}

size_t tokenizer_lead_strip(const Tokenizer *t, const char *b, size_t len) {
    size_t k = 0;
    while (k < len && k < (size_t)t->strip && b[k] == ' ') k++;
    return k;
}
