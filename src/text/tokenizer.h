// BPE tokenizer loaded from a Hugging Face tokenizer.json (the Decoder family), in one of two kinds:
// - byte-level (Qwen, Llama 3): added tokens matched in the raw text first, NFC normalisation (or none), the
//   Split pre-tokenizer's regex (PCRE2), the ByteLevel byte<->char mapping, rank-ordered BPE merges, and the
//   ByteLevel decoder;
// - SentencePiece-style (Gemma, Llama 2, Mistral): added tokens first, then each space as U+2581 (after one
//   U+2581 prepended, where the normalizer does), BPE over the whole text from its characters, a character
//   outside the vocabulary as its bytes' <0xXX> tokens (byte_fallback), and the decoder that undoes it (U+2581
//   back to a space, byte tokens to bytes, and the leading space its Strip removes).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "base/hash.h"
#include "base/util.h"
#include "text/chat.h"

typedef struct {
    char *content;
    size_t len;
    int32_t id;
    int special;
} AddedToken;

typedef struct BpeCache BpeCache;

typedef struct {
    int32_t n_ids;      // highest id + 1, added tokens included
    char **id_bytes;    // raw bytes each id decodes to (byte-level mapping undone); NULL for gaps
    uint32_t *id_len;
    StrMap vocab;       // token string as written in tokenizer.json -> id
    U64Map merges;      // (left id << 32 | right id) -> (rank << 32 | merged id)
    int32_t byte_id[256];  // the single-byte token for each byte
    char byte_char[256][4];  // each byte's ByteLevel character, UTF-8 (NUL-terminated)
    int ignore_merges;  // a whole word found in the vocab is one token (HF's ignore_merges)
    int nfc;            // the normalizer is NFC (Qwen's); none leaves the text as it is (Llama 3's)
    int byte_fallback;  // SentencePiece-style: no regex nor byte map; byte_id holds the <0xXX> tokens
    int prepend;        // with byte_fallback: U+2581 is prepended to each text between added tokens (Llama 2's)
    int strip;          // with byte_fallback: leading spaces the decoder strips from a text (its Strip's start,
                        // at most TOKENIZER_MAX_STRIP)
    AddedToken *added;
    int n_added;
    unsigned char added_first[256];  // bytes an added token can start with
    void *regex;        // pcre2_code *, the Split pattern (NULL with byte_fallback)
    char *pattern;      // the Split pattern's text (NULL with byte_fallback)
    void *match_data;   // pcre2_match_data *
    BpeCache *cache;    // recently seen words -> ids
    // From tokenizer_config.json (-1 / NULL when absent).
    int32_t eos_id, pad_id;
    ChatTemplate chat;  // the model's chat template (chat.tpl NULL: none)
    char *path;
} Tokenizer;

#define TOKENIZER_MAX_STRIP 8

// The largest tokenizer.json read: public ones hold up to about 35 MB (Gemma 3's); parsing a hostile one of
// this size can take about 28 times its size (measured: 1.8 GB, bench/hostile_memory.py).
#define TOKENIZER_MAX_FILE ((size_t)64 << 20)

// PATH is a tokenizer.json or a directory holding one; tokenizer_config.json beside it is read
// when present. Dies with a one-line error naming the file on anything unsupported or malformed.
void tokenizer_load(Tokenizer *t, const char *path);
void tokenizer_free(Tokenizer *t);

typedef struct {
    int32_t *ids;
    size_t n, cap;
} IdList;
void idlist_push(IdList *l, int32_t id);

// Appends the ids of text[0..n) to out. Returns 0, or -1 when the text is not valid UTF-8
// (*bad_offset: where).
int tokenizer_encode(Tokenizer *t, const char *text, size_t n, IdList *out, size_t *bad_offset);
// Raw bytes of one id (NULL when the id is outside the vocabulary).
const char *tokenizer_id_bytes(const Tokenizer *t, int32_t id, size_t *len);
// Whether id is an added token marked "special" (what skip_special_tokens leaves out of a text).
int tokenizer_id_special(const Tokenizer *t, int32_t id);
// Appends the text of ids; invalid UTF-8 from partial tokens becomes U+FFFD, one per maximal invalid subsequence
// (as transformers.js decodes; Hugging Face's Rust ByteFallback writes one per byte of an invalid byte-token run).
// Returns -1 at the first id outside the vocabulary (*bad_index), else 0.
int tokenizer_decode(const Tokenizer *t, const int32_t *ids, size_t n, Buf *out, size_t *bad_index);
// How many of the len bytes b of a text's first token its decoder leaves out (the leading spaces a
// SentencePiece-style decoder strips; 0 for the others), so text built token by token is what decode gives.
size_t tokenizer_lead_strip(const Tokenizer *t, const char *b, size_t len);
int32_t tokenizer_token_id(const Tokenizer *t, const char *token);  // -1 when absent
// A tokenizer.json merge's two tokens: "a b", or ["a", "b"]; -1 when it is neither.
int tokenizer_merge_parts(const cJSON *merge, const char **a, size_t *la, const char **b, size_t *lb);
// Tokenizes a prompt, appending to ids: as a user message of t's chat template with the generation prompt when
// `chat` is set and t has a template (tools: an array or NULL), else as it is. Returns NULL, or what is wrong
// (malloc'd): the template's error, or text that is not UTF-8.
char *chat_encode_prompt(Tokenizer *t, const char *text, size_t n, int chat, const cJSON *tools, IdList *ids);
