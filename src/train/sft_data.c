#include "train/sft_data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/util.h"
#include "io/records.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "train/vl_rows.h"

typedef struct {
    RecordReader r;  // the file, its current row and that row's U+0000 sentinel
    const char *path, *model_dir;
    Tokenizer tok;
    int tok_loaded;
    const VlProcessor *vl;  // a vision-language model's image processor, or NULL
    int32_t image_pad;
    VlImage *ims;           // the current row's images
    int n_images, placeholders;
} Loader;

static void read_ids(Loader *L, const cJSON *arr, const char *key, int64_t vocab, IdList *out) {
    if (!cJSON_IsArray(arr))
        die("%s: \"%s\" must be a list of token ids", L->r.where, key);
    int64_t i = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++) {
        int64_t v;
        if (!json_as_int(e, 0, vocab - 1, &v))
            die("%s: \"%s\"[%lld] is not a token id in [0, %lld)",
                L->r.where, key, (long long)i, (long long)vocab);
        idlist_push(out, (int32_t)v);
    }
}

static void need_tokenizer(Loader *L) {
    if (L->tok_loaded) return;
    char *tj = path_join(L->model_dir, "tokenizer.json");
    if (!file_exists(tj))
        die("%s: text rows need a tokenizer: %s does not exist (or give prompt_ids/completion_ids)",
            L->r.where, tj);
    tokenizer_load(&L->tok, tj);
    free(tj);
    L->tok_loaded = 1;
}

static void encode_text(Loader *L, const cJSON *item, const char *key, int chat, IdList *out) {
    if (!cJSON_IsString(item)) die("%s: \"%s\" must be a string or a list of messages", L->r.where, key);
    need_tokenizer(L);
    size_t n;
    char *text = json_string_bytes(item, L->r.nul, &n);
    if (chat && L->vl) {  // the prompt of a vision-language model: its "<image>" placeholders
        char *expanded = vl_expand_placeholders(text, &L->placeholders);
        free(text);
        text = expanded;
        n = strlen(text);
    }
    char *err = chat_encode_prompt(&L->tok, text, n, chat, NULL, out);
    if (err) die("%s: \"%s\": %s", L->r.where, key, err);
    free(text);
}

// A conversation (msgs: a "messages" row, or a conversational prompt and completion joined) whose last n_last
// messages are the completion: the prompt is the rest rendered with the generation prompt, the completion what
// the whole rendering adds to it (the assistant turns and their end tokens), as TRL's conversational rows.
static void encode_conversation(Loader *L, const cJSON *given, int n_last, IdList *out, int64_t *plen) {
    need_tokenizer(L);
    cJSON *msgs = L->vl ? vl_row_messages(given, &L->r, "messages", &L->ims, &L->n_images, &L->placeholders)
                        : cJSON_Duplicate(given, 1);
    if (!msgs) die("out of memory");
    int n = cJSON_GetArraySize(msgs);
    if (n_last < 1 || n_last >= n)
        die("%s: a conversation needs a prompt message and a final assistant message", L->r.where);
    const cJSON *last = cJSON_GetArrayItem(msgs, n - 1);
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(last, "role");
    if (!cJSON_IsString(role) || strcmp(role->valuestring, "assistant"))
        die("%s: the conversation's last message must be the assistant's (role \"assistant\")", L->r.where);
    cJSON *head = cJSON_CreateArray();
    if (!head) die("out of memory");
    for (int i = 0; i < n - n_last; i++) cJSON_AddItemReferenceToArray(head, cJSON_GetArrayItem(msgs, i));
    Buf prompt = {0}, full = {0};
    if (L->vl) L->tok.chat.image_text = VL_IMAGE_TEXT;
    char *err = chat_render(&L->tok.chat, head, NULL, NULL, L->r.nul, 1, &prompt);
    if (!err) err = chat_render(&L->tok.chat, msgs, NULL, NULL, L->r.nul, 0, &full);
    if (err) die("%s: %s", L->r.where, err);
    cJSON_Delete(head);
    if (full.len <= prompt.len || memcmp(full.data, prompt.data, prompt.len) != 0)
        die("%s: the chat template's rendering of the whole conversation does not start with its prompt's",
            L->r.where);
    size_t bad_offset;
    if (tokenizer_encode(&L->tok, prompt.data, prompt.len, out, &bad_offset) != 0)
        die("%s: the conversation is not valid UTF-8", L->r.where);
    *plen = (int64_t)out->n;
    if (tokenizer_encode(&L->tok, full.data + prompt.len, full.len - prompt.len, out, &bad_offset) != 0)
        die("%s: the conversation is not valid UTF-8", L->r.where);
    buf_free(&prompt);
    buf_free(&full);
    cJSON_Delete(msgs);
}

// A row with images: their pads, all in the prompt, expanded (*plen grows by as much).
static void expand_prompt_images(Loader *L, IdList *ids, int64_t *plen) {
    for (size_t i = (size_t)*plen; i < ids->n; i++)
        if (ids->ids[i] == L->image_pad)
            die("%s: an image in the completion (images go in the prompt)", L->r.where);
    IdList prompt = {0};
    for (int64_t i = 0; i < *plen; i++) idlist_push(&prompt, ids->ids[i]);
    vl_row_expand(&L->r, L->vl, L->image_pad, L->ims, L->n_images, L->placeholders, &prompt);
    for (size_t i = (size_t)*plen; i < ids->n; i++) idlist_push(&prompt, ids->ids[i]);
    *plen += (int64_t)prompt.n - (int64_t)ids->n;
    free(ids->ids);
    *ids = prompt;
}

// One row into ids (prompt then completion; *plen prompt tokens).
static void read_row(Loader *L, const cJSON *root, const DecoderConfig *c, IdList *ids, int64_t *plen) {
    const cJSON *pi = cJSON_GetObjectItemCaseSensitive(root, "prompt_ids");
    const cJSON *ci = cJSON_GetObjectItemCaseSensitive(root, "completion_ids");
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    const cJSON *comp = cJSON_GetObjectItemCaseSensitive(root, "completion");
    if (pi || ci) {
        if (L->n_images)
            die("%s: a row with images needs text (\"prompt\" or \"messages\"), not token ids", L->r.where);
        read_ids(L, pi, "prompt_ids", c->vocab, ids);
        *plen = (int64_t)ids->n;
        read_ids(L, ci, "completion_ids", c->vocab, ids);
        return;
    }
    if (cJSON_IsArray(msgs)) {
        encode_conversation(L, msgs, 1, ids, plen);
    } else if (cJSON_IsArray(p) && cJSON_IsArray(comp)) {  // TRL's conversational prompt-completion
        cJSON *all = cJSON_CreateArray();
        if (!all) die("out of memory");
        for (const cJSON *m = p->child; m; m = m->next) cJSON_AddItemReferenceToArray(all, (cJSON *)m);
        for (const cJSON *m = comp->child; m; m = m->next) cJSON_AddItemReferenceToArray(all, (cJSON *)m);
        encode_conversation(L, all, cJSON_GetArraySize(comp), ids, plen);
        cJSON_Delete(all);
    } else {
        if (!p || !comp)
            die("%s: a row needs \"prompt\" and \"completion\", \"messages\", or \"prompt_ids\" and "
                "\"completion_ids\"", L->r.where);
        encode_text(L, p, "prompt", 1, ids);
        *plen = (int64_t)ids->n;
        encode_text(L, comp, "completion", 0, ids);
        if ((int64_t)ids->n == *plen) die("%s: the completion is empty", L->r.where);
        int32_t eos = L->tok.eos_id >= 0 ? L->tok.eos_id : (int32_t)c->eos_id;
        if (eos < 0)
            die("%s: no eos token in tokenizer_config.json or config.json to end completions", L->model_dir);
        idlist_push(ids, eos);
    }
    if (L->n_images || L->placeholders) expand_prompt_images(L, ids, plen);
    for (size_t i = 0; i < ids->n; i++)
        if (ids->ids[i] >= c->vocab)
            die("%s: token id %d does not fit the model's vocab_size %lld",
                L->r.where, ids->ids[i], (long long)c->vocab);
}

void sft_data_load(SftData *d, const char *path, const char *key, const char *model_dir, const DecoderConfig *c,
                   const VlProcessor *vl, int64_t max_length, int filter_overlong) {
    memset(d, 0, sizeof *d);
    d->path = xstrdup(path);
    Loader L = {.path = path, .model_dir = model_dir, .image_pad = (int32_t)c->image_pad_id, .vl = vl};
    static const char *const cols[] = {"prompt_ids", "completion_ids", "prompt", "completion", "messages",
                                       "images"};
    records_open(&L.r, path, key, cols, 6);
    size_t n_cap = 0;
    for (cJSON *root; (root = records_next(&L.r));) {
        IdList ids = {0};
        int64_t plen;
        L.placeholders = 0;
        vl_row_images(root, &L.r, "images", &L.ims, &L.n_images);
        read_row(&L, root, c, &ids, &plen);
        cJSON_Delete(root);
        if (plen == 0)
            die("%s: the prompt is empty (the first completion token needs a token before it)", L.r.where);
        if ((int64_t)ids.n == plen) die("%s: the completion is empty", L.r.where);
        if (plen >= max_length && filter_overlong) {
            d->n_filtered++;
            free(ids.ids);
            for (int k = 0; k < L.n_images; k++) vl_image_free(&L.ims[k]);
            free(L.ims);
            continue;
        }
        if (plen >= max_length)
            die("%s: the prompt alone has %lld tokens, --max-length is %lld (or --filter-overlong-prompts)",
                L.r.where, (long long)plen, (long long)max_length);
        if ((int64_t)ids.n > max_length) {
            ids.n = (size_t)max_length;
            d->n_truncated++;
        }
        if ((size_t)d->n == n_cap) {
            n_cap = n_cap ? 2 * n_cap : 64;
            d->s = xrealloc(d->s, n_cap * sizeof *d->s);
        }
        d->s[d->n++] = (SftSample){ids.ids, (int64_t)ids.n, plen, L.r.line, L.ims, L.n_images};
    }
    records_close(&L.r);
    if (L.tok_loaded) tokenizer_free(&L.tok);
    if (d->n == 0 && d->n_filtered) die("%s: no samples (every prompt is over --max-length)", path);
    if (d->n == 0) die("%s: no samples (the file is empty)", path);
}

void sft_data_free(SftData *d) {
    for (int64_t i = 0; i < d->n; i++) {
        free(d->s[i].ids);
        for (int k = 0; k < d->s[i].n_images; k++) vl_image_free(&d->s[i].images[k]);
        free(d->s[i].images);
    }
    free(d->s);
    free(d->path);
    memset(d, 0, sizeof *d);
}
