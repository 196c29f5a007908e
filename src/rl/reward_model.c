#include "rl/reward_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/util.h"
#include "text/chat.h"

int64_t reward_length_limit(int64_t want, int asked, int64_t max_pos, const char *key, const char *dir) {
    if (want <= max_pos) return want;
    if (asked) die("%s %lld exceeds %s's max_position_embeddings %lld", key, (long long)want, dir, (long long)max_pos);
    return max_pos;
}

size_t reward_model_bytes(const DecoderConfig *c, const char *dir, DType dtype, int64_t max_length, int asked,
                          int64_t max_batch) {
    max_length = reward_length_limit(max_length, asked, c->max_pos, "reward.reward_model.max_length", dir);
    size_t weights = decoder_layout(c, &(DecoderLayout){0}) * dtype_size(dtype);
    return weights + decoder_acts_bytes(backend_cpu(), c, dtype, max_batch * max_length, max_length);
}

void reward_model_load(RewardModel *rm, const char *dir, DType dtype, int64_t max_length, int asked, int64_t max_batch) {
    memset(rm, 0, sizeof *rm);
    DecoderConfig c;
    decoder_config_load_rm(&c, dir);
    max_length = reward_length_limit(max_length, asked, c.max_pos, "reward.reward_model.max_length", dir);
    tokenizer_load(&rm->tok, dir);
    if (!rm->tok.chat.tpl) die("reward model %s: its tokenizer has no chat template (tokenizer_config.json)", dir);
    if (rm->tok.n_ids > c.vocab)
        die("reward model %s: its tokenizer has ids up to %d, its vocab_size is %lld", dir, rm->tok.n_ids - 1,
            (long long)c.vocab);
    decoder_load_config(&rm->m, dir, dtype, &c);
    int64_t rows = max_batch * max_length;
    arena_init(&rm->arena, decoder_acts_bytes(rm->m.be, &c, dtype, rows, max_length));
    decoder_acts_init(&rm->acts, rm->m.be, &c, dtype, rows, max_length, &rm->arena);
    rm->max_length = max_length, rm->max_batch = max_batch;
    rm->tokens = xmalloc((size_t)rows * sizeof *rm->tokens);
    rm->seq_off = xmalloc((size_t)(max_batch + 1) * sizeof *rm->seq_off);
    rm->out = xmalloc((size_t)max_batch * sizeof *rm->out);
    rm->dir = xstrdup(dir);
}

void reward_model_free(RewardModel *rm) {
    decoder_acts_free(&rm->acts);
    arena_free(&rm->arena);
    decoder_free(&rm->m);
    tokenizer_free(&rm->tok);
    free(rm->tokens), free(rm->seq_off), free(rm->out), free(rm->dir);
}

// Conversation msgs as the reward model reads it: its template's rendering without a generation prompt, less a
// leading bos_token (verl's), tokenized, into ids.
static void render(RewardModel *rm, const char *msgs, IdList *ids) {
    uint32_t nul = 0;
    cJSON *j = json_parse_line(msgs, strlen(msgs), &nul);
    if (!cJSON_IsArray(j)) die("internal: a reward model's conversation is not a JSON array");
    Buf text = {0};
    char *err = chat_render(&rm->tok.chat, j, NULL, NULL, nul, 0, &text);
    if (err) die("reward model %s: its chat template: %s", rm->dir, err);
    cJSON_Delete(j);
    const cJSON *bos = cJSON_GetObjectItemCaseSensitive(rm->tok.chat.vars, "bos_token");
    size_t skip = 0, bad;
    if (cJSON_IsString(bos) && *bos->valuestring && text.len >= strlen(bos->valuestring) &&
        memcmp(text.data, bos->valuestring, strlen(bos->valuestring)) == 0)
        skip = strlen(bos->valuestring);
    ids->n = 0;
    if (tokenizer_encode(&rm->tok, text.data + skip, text.len - skip, ids, &bad) != 0)
        die("reward model %s: its chat template's rendering is not valid UTF-8 (byte %zu)", rm->dir, bad);
    buf_free(&text);
    if (ids->n == 0) die("reward model %s: a conversation renders to no tokens", rm->dir);
}

int64_t reward_model_score(RewardModel *rm, int64_t n, const char *const *msgs, float *scores) {
    IdList ids = {0};
    int64_t cut = 0;
    for (int64_t i0 = 0; i0 < n; i0 += rm->max_batch) {
        int B = (int)(n - i0 < rm->max_batch ? n - i0 : rm->max_batch);
        rm->seq_off[0] = 0;
        for (int b = 0; b < B; b++) {
            render(rm, msgs[i0 + b], &ids);
            int64_t len = (int64_t)ids.n < rm->max_length ? (int64_t)ids.n : rm->max_length;
            cut += (int64_t)ids.n > len;
            memcpy(rm->tokens + rm->seq_off[b], ids.ids + ids.n - len, (size_t)len * sizeof *rm->tokens);
            rm->seq_off[b + 1] = rm->seq_off[b] + len;
        }
        decoder_seq_scores(&rm->m, rm->tokens, rm->seq_off, B, &rm->acts, rm->out);
        for (int b = 0; b < B; b++)
            if (!isfinite(rm->out[b])) die("reward model %s: a conversation scored %g (a broken checkpoint?)", rm->dir,
                                           (double)rm->out[b]);
        memcpy(scores + i0, rm->out, (size_t)B * sizeof *scores);
    }
    free(ids.ids);
    return cut;
}
