#define _GNU_SOURCE  // memmem
#include "rollout/rollout.h"

#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "base/hash.h"
#include "base/json.h"
#include "base/util.h"
#include "nn/ops.h"
#include "text/utf8.h"

typedef struct {
    int prompt, sample, slot;
    int64_t pos;  // position of the next token to feed
    int32_t last;
    Rng rng;
    int done;
    int paused;  // its model text ends in </tool_call>: the step's tool turns answer it
    IdList feed;  // a tool turn's tokens, fed one per step from feed_next
    int64_t feed_next;
} Seq;

static void sample_init(RolloutSample *s, int cap, int max_turns) {
    memset(s, 0, sizeof *s);
    s->tokens = xmalloc((size_t)cap * sizeof *s->tokens);
    s->logprobs = xmalloc((size_t)cap * sizeof *s->logprobs);
    if (max_turns == 0) return;
    s->mask = xmalloc((size_t)cap);
    s->turn_end = xcalloc((size_t)max_turns, sizeof *s->turn_end);
    s->next_start = xcalloc((size_t)max_turns, sizeof *s->next_start);
    s->tool_content = xcalloc((size_t)max_turns, sizeof *s->tool_content);
}

static char *text_range(const RolloutSample *s, int64_t from) {
    char *t = xmalloc((size_t)(s->text_end - from) + 1);
    memcpy(t, s->text.data ? s->text.data + from : "", (size_t)(s->text_end - from));
    t[s->text_end - from] = '\0';
    return t;
}

char *rollout_sample_text(const RolloutSample *s) { return text_range(s, 0); }

char *rollout_sample_final_text(const RolloutSample *s) { return text_range(s, s->turn_start); }

// Appends text[a, b) as a JSON string, made valid UTF-8.
static void json_text(FILE *f, const char *text, int64_t a, int64_t b) {
    Buf clean = {0};
    utf8_append_lossy(&clean, text ? text + a : "", (size_t)(b - a));
    json_write_string(f, clean.data ? clean.data : "", clean.len);
    buf_free(&clean);
}

char *rollout_sample_messages(const RolloutSample *s, const char *prompt) {
    char *out = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&out, &n);
    if (!f) die("open_memstream failed");
    fputs("[{\"role\": \"user\", \"content\": ", f);
    json_text(f, prompt, 0, (int64_t)strlen(prompt));
    int64_t start = 0;
    for (int k = 0; k < s->turns; k++) {
        fputs("}, {\"role\": \"assistant\", \"content\": ", f);
        json_text(f, s->text.data, start, s->turn_end[k]);
        fputs("}, {\"role\": \"tool\", \"content\": ", f);
        const char *c = s->tool_content[k] ? s->tool_content[k] : "";
        json_text(f, c, 0, (int64_t)strlen(c));
        start = s->next_start[k];
    }
    if (start >= 0) {  // -1: the sample ended inside its last tool turn (the token budget)
        fputs("}, {\"role\": \"assistant\", \"content\": ", f);
        json_text(f, s->text.data, start, s->text_end);
    }
    fputs("}]", f);
    if (fclose(f) != 0) die("writing a sample's messages failed");
    return out;
}

void rollout_sample_free(RolloutSample *s) {
    free(s->tokens);
    free(s->logprobs);
    free(s->mask);
    for (int k = 0; s->tool_content && k < s->turns; k++) free(s->tool_content[k]);
    free(s->tool_content);
    free(s->turn_end);
    free(s->next_start);
    buf_free(&s->text);
    memset(s, 0, sizeof *s);
}

static void seq_seed(Seq *q, const RolloutConfig *cfg, const RolloutPrompt *p, int index) {
    int64_t i = cfg->seed_index ? cfg->seed_index[index] : index;
    uint64_t key[3] = {p->has_seed ? p->seed : cfg->seed, p->has_seed ? 0 : (uint64_t)i + 1, (uint64_t)q->sample};
    rng_init(&q->rng, hash_bytes(key, sizeof key));
}

static int ends_with_tool_call(const RolloutSample *out) {
    return out->text.len - (size_t)out->turn_start >= 12 &&
           memcmp(out->text.data + out->text.len - 12, "</tool_call>", 12) == 0;
}

// Records q's next token, the model's, and decides whether q is finished or pauses for a tool turn.
static void seq_record(Seq *q, int32_t id, float lp, const Tokenizer *tok, const RolloutConfig *cfg,
                       const RolloutPrompt *p, RolloutSample *out, RolloutTokenFn fn, void *user) {
    out->tokens[out->n] = id;
    if (out->mask) out->mask[out->n] = 1;
    out->logprobs[out->n++] = lp;
    q->last = id;
    q->pos++;
    if (fn) fn(user, q->prompt, q->sample, id);
    for (int i = 0; i < cfg->n_stop_ids; i++)
        if (id == cfg->stop_ids[i]) q->done = 1, out->finish = FINISH_STOP;
    if (tok && !q->done) {  // the text leaves out a final stop token, as vLLM and TRL do
        size_t len, before = out->text.len;
        const char *b = tokenizer_id_bytes(tok, id, &len);
        buf_append(&out->text, b ? b : "", b ? len : 0);
        out->text_end = (int64_t)out->text.len;
        for (int i = 0; i < cfg->n_stop_strings && !q->done; i++) {  // within the model's own turn
            size_t sl = strlen(cfg->stop_strings[i]), from = before >= sl ? before - sl + 1 : 0;
            if (from < (size_t)out->turn_start) from = (size_t)out->turn_start;
            const char *hit = memmem(out->text.data + from, out->text.len - from, cfg->stop_strings[i], sl);
            if (hit) q->done = 1, out->finish = FINISH_STOP, out->text_end = hit - out->text.data;
        }
    }
    if (!q->done && out->n >= p->max_new_tokens) q->done = 1, out->finish = FINISH_LENGTH;
    if (!q->done && cfg->tool_fn && out->turns < cfg->max_turns && ends_with_tool_call(out)) q->paused = 1;
}

// Records the next token of q's tool turn (mask 0, log-prob 0); after the last one the model's next turn
// starts.
static void seq_record_fed(Seq *q, const Tokenizer *tok, const RolloutPrompt *p, RolloutSample *out,
                           RolloutTokenFn fn, void *user) {
    int32_t id = q->feed.ids[q->feed_next++];
    out->tokens[out->n] = id;
    out->mask[out->n] = 0;
    out->logprobs[out->n++] = 0;
    q->last = id;
    q->pos++;
    if (fn) fn(user, q->prompt, q->sample, id);
    size_t len;
    const char *b = tokenizer_id_bytes(tok, id, &len);
    buf_append(&out->text, b ? b : "", b ? len : 0);
    // text_end moves once the whole tool turn is in: a sample cut inside one ends with its tool call
    int fed = q->feed_next == (int64_t)q->feed.n;
    if (fed) out->turn_start = out->next_start[out->turns - 1] = out->text_end = (int64_t)out->text.len;
    if (out->n >= p->max_new_tokens) q->done = 1, out->finish = FINISH_LENGTH;  // no room for the model's turn
    if (fed || q->done) {
        free(q->feed.ids);
        memset(&q->feed, 0, sizeof q->feed);
    }
}

// A token's uniform draw: one from its sequence's RNG when sampling, none when greedy.
static double draw_unit(const RolloutConfig *cfg, Seq *q) {
    return cfg->sampler.temperature > 0 ? sampler_unit(&q->rng) : 0.0;
}

size_t rollout_workspace_bytes(const Backend *be, const Qwen2Config *c, DType dtype, int64_t n_slots, int64_t slot_len,
                               int64_t prefill_rows) {
    int64_t act_rows = prefill_rows > n_slots ? prefill_rows : n_slots;
    return (size_t)n_slots * (size_t)slot_len * qwen2_kv_bytes_per_token(c) +
           qwen2_acts_bytes(be, c, dtype, act_rows, slot_len) + (size_t)n_slots * (size_t)c->vocab * 4 +
           4 * 64;  // 64-byte alignment of KV, activations, logits
}

// One call's engine: the model, the batch buffers of a wave, the KV cache and workspace they share.
typedef struct {
    const Qwen2 *m;
    const Tokenizer *tok;
    const RolloutConfig *cfg;
    const RolloutPrompt *prompts;
    RolloutSample *out;
    int G;
    RolloutTokenFn fn;
    void *user;
    Qwen2KV kv;
    Qwen2Acts acts;
    float *logits;
    int64_t prefill_rows;
    Seq *seqs;
    int32_t *tokens, *slots, *pos;
    int64_t *seq_off;
    int *row_seq;  // batch entry -> (first) Seq it feeds
    float *lps;
    double *u;     // each row's uniform draw from its sequence's RNG
    void *scr;     // the backend's sampler scratch
} Engine;

// Sequences per wave: the most whose KV cache (and, in a given workspace, activations) fit.
static int64_t wave_capacity(const Qwen2 *m, const RolloutConfig *cfg, int64_t n_seqs, int64_t slot_len,
                             int64_t prefill_rows) {
    if (!cfg->workspace)
        return (int64_t)(cfg->kv_budget_bytes / (qwen2_kv_bytes_per_token(&m->cfg) * (size_t)slot_len));
    int64_t fit = 0;
    for (int64_t hi = n_seqs; fit < hi;) {  // the largest count whose workspace fits
        int64_t mid = (fit + hi + 1) / 2;
        if (rollout_workspace_bytes(m->be, &m->cfg, m->dtype, mid, slot_len, prefill_rows) <= cfg->workspace->size)
            fit = mid;
        else
            hi = mid - 1;
    }
    return fit;
}

static void record(Engine *e, Seq *q, int32_t id, float lp) {
    RolloutSample *out = &e->out[q->prompt * e->G + q->sample];
    if (q->feed.n) seq_record_fed(q, e->tok, &e->prompts[q->prompt], out, e->fn, e->user);
    else seq_record(q, id, lp, e->tok, e->cfg, &e->prompts[q->prompt], out, e->fn, e->user);
}

// The tool turns of the sequences that paused in this step, all in one call of the hook.
static void tool_turns(Engine *e, int n_seq) {
    int n = 0;
    for (int s = 0; s < n_seq; s++) n += e->seqs[s].paused;
    if (n == 0) return;
    RolloutToolTurn *t = xcalloc((size_t)n, sizeof *t);
    n = 0;
    for (int s = 0; s < n_seq; s++) {
        const Seq *q = &e->seqs[s];
        const RolloutSample *out = &e->out[q->prompt * e->G + q->sample];
        if (!q->paused) continue;
        t[n++] = (RolloutToolTurn){.prompt = q->prompt, .sample = q->sample, .text = out->text.data + out->turn_start,
                                   .n = out->text.len - (size_t)out->turn_start};
    }
    e->cfg->tool_fn(e->cfg->tool_user, t, n);
    n = 0;
    for (int s = 0; s < n_seq; s++) {
        Seq *q = &e->seqs[s];
        RolloutSample *out = &e->out[q->prompt * e->G + q->sample];
        if (!q->paused) continue;
        q->paused = 0;
        out->turn_end[out->turns] = (int64_t)out->text.len;
        out->next_start[out->turns] = -1;  // until the tool turn is fed
        out->tool_content[out->turns] = t[n].content;
        out->turns++;
        q->feed = t[n++].append;
        q->feed_next = 0;
        if (q->feed.n == 0) {  // the hook ended it
            free(q->feed.ids);
            memset(&q->feed, 0, sizeof q->feed);
            q->done = 1;
            out->finish = FINISH_STOP;
        }
    }
    free(t);
}

// Prefill of the wave's n_seq sequences: each prompt once (then copied to its other samples' slots), or
// once per sample; every sequence samples its first token.
static void prefill_wave(Engine *e, int n_seq) {
    const Qwen2 *m = e->m;
    const Qwen2Config *c = &m->cfg;
    int step = e->cfg->share_prefill ? e->G : 1;
    for (int s = 0; s < n_seq;) {
        int B = 0;
        e->seq_off[0] = 0;
        for (; s < n_seq; s += step) {
            const RolloutPrompt *p = &e->prompts[e->seqs[s].prompt];
            if (B > 0 && e->seq_off[B] + p->n > e->prefill_rows) break;
            memcpy(e->tokens + e->seq_off[B], p->ids, (size_t)p->n * sizeof *e->tokens);
            e->slots[B] = e->seqs[s].slot;
            e->row_seq[B] = s;
            e->seq_off[B + 1] = e->seq_off[B] + p->n;
            B++;
        }
        qwen2_forward(m, e->tokens, e->seq_off, B, &e->acts, &e->kv, e->slots);
        for (int b = 0; b < B; b++)  // the last row of each prompt predicts its first new token
            m->be->copy(m->be, e->acts.proj + b * c->hidden, e->acts.xn + (e->seq_off[b + 1] - 1) * c->hidden,
                        (size_t)c->hidden * sizeof(float));
        qwen2_logits(m, e->acts.proj, B, &e->acts, e->logits);
        for (int b = 0; b < B; b++)
            for (int j = 0; j < step; j++) {
                Seq *q = &e->seqs[e->row_seq[b] + j];
                if (j > 0) qwen2_kv_copy(m, &e->kv, q->slot, e->seqs[e->row_seq[b]].slot, e->prompts[q->prompt].n);
                float lp;
                int32_t id;
                e->u[0] = draw_unit(e->cfg, q);
                m->be->sample(m->be, &e->cfg->sampler, e->logits + (int64_t)b * c->vocab, 1, c->vocab, e->u, e->scr,
                              &id, &lp);
                record(e, q, id, lp);
            }
    }
}

// Decode: every unfinished sequence advances one token per step; finished ones drop out.
static void decode_wave(Engine *e, int n_seq) {
    const Qwen2 *m = e->m;
    for (;;) {
        int B = 0;
        for (int s = 0; s < n_seq; s++)
            if (!e->seqs[s].done) {
                e->tokens[B] = e->seqs[s].last;
                e->slots[B] = e->seqs[s].slot;
                e->pos[B] = (int32_t)e->seqs[s].pos - 1;  // the last sampled token sits at pos - 1
                e->row_seq[B++] = s;
            }
        if (B == 0) break;
        qwen2_decode_step(m, &e->kv, e->tokens, e->slots, e->pos, B, &e->acts, e->logits);
        for (int b = 0; b < B; b++) {  // a row feeding a tool turn samples nothing: it takes no draw
            Seq *q = &e->seqs[e->row_seq[b]];
            e->u[b] = q->feed.n ? 0.0 : draw_unit(e->cfg, q);
        }
        m->be->sample(m->be, &e->cfg->sampler, e->logits, B, m->cfg.vocab, e->u, e->scr, e->tokens, e->lps);
        for (int b = 0; b < B; b++) record(e, &e->seqs[e->row_seq[b]], e->tokens[b], e->lps[b]);
        tool_turns(e, n_seq);
    }
}

void rollout_generate(const Qwen2 *m, const Tokenizer *tok, const RolloutConfig *cfg, const RolloutPrompt *prompts,
                      int n_prompts, int G, RolloutSample *out, RolloutStats *stats, RolloutTokenFn fn, void *user) {
    const Qwen2Config *c = &m->cfg;
    if (cfg->max_turns > 0 && (!cfg->tool_fn || !tok)) die("internal: multi-turn rollout without a tool hook or tokenizer");
    memset(stats, 0, sizeof *stats);
    // One slot length for all: the longest prompt plus its new tokens.
    int64_t slot_len = 1, max_prompt = 1;
    for (int i = 0; i < n_prompts; i++) {
        if (prompts[i].n + prompts[i].max_new_tokens > slot_len) slot_len = prompts[i].n + prompts[i].max_new_tokens;
        if (prompts[i].n > max_prompt) max_prompt = prompts[i].n;
        stats->prompt_tokens += prompts[i].n;
    }
    size_t per_token = qwen2_kv_bytes_per_token(c);
    Engine e = {.m = m, .tok = tok, .cfg = cfg, .prompts = prompts, .out = out, .G = G, .fn = fn, .user = user};
    e.prefill_rows = cfg->prefill_tokens > max_prompt ? cfg->prefill_tokens : max_prompt;
    int64_t fit = wave_capacity(m, cfg, (int64_t)n_prompts * G, slot_len, e.prefill_rows);
    if (fit < G)
        die("the %s (%zu MB) holds %lld sequences of %lld tokens; one prompt's %d samples need %zu MB of KV cache",
            cfg->workspace ? "rollout workspace" : "KV cache budget",
            (cfg->workspace ? cfg->workspace->size : cfg->kv_budget_bytes) >> 20, (long long)fit, (long long)slot_len, G,
            (per_token * (size_t)slot_len * (size_t)G + (1u << 20) - 1) >> 20);
    int per_wave = (int)(fit / G < n_prompts ? fit / G : n_prompts);
    int n_slots = per_wave * G;
    int64_t act_rows = e.prefill_rows > n_slots ? e.prefill_rows : n_slots;

    Arena own, *arena = cfg->workspace ? cfg->workspace : &own;
    size_t logit_bytes = (size_t)n_slots * (size_t)c->vocab * sizeof(float);
    if (cfg->workspace) arena_reset(arena);
    else backend_arena_init(m->be, arena, rollout_workspace_bytes(m->be, c, m->dtype, n_slots, slot_len, e.prefill_rows));
    qwen2_kv_init(&e.kv, c, n_slots, slot_len, arena);
    qwen2_acts_init(&e.acts, m->be, c, m->dtype, act_rows, slot_len, arena);
    e.logits = arena_alloc(arena, logit_bytes);
    stats->kv_bytes = (size_t)n_slots * (size_t)slot_len * per_token;
    stats->kv_bytes_per_token = per_token;

    e.seqs = xcalloc((size_t)n_slots, sizeof *e.seqs);
    e.tokens = xmalloc((size_t)act_rows * sizeof *e.tokens);
    e.slots = xmalloc((size_t)act_rows * sizeof *e.slots);
    e.pos = xmalloc((size_t)n_slots * sizeof *e.pos);
    e.seq_off = xmalloc(((size_t)act_rows + 1) * sizeof *e.seq_off);
    e.row_seq = xmalloc((size_t)act_rows * sizeof *e.row_seq);
    e.lps = xmalloc((size_t)n_slots * sizeof *e.lps);
    e.u = xmalloc((size_t)n_slots * sizeof *e.u);
    e.scr = m->be->sampler_new(m->be, c->vocab);

    for (int p0 = 0; p0 < n_prompts; p0 += per_wave) {
        int p1 = p0 + per_wave < n_prompts ? p0 + per_wave : n_prompts, n_seq = (p1 - p0) * G;
        stats->waves++;
        for (int s = 0; s < n_seq; s++) {
            Seq *q = &e.seqs[s];
            *q = (Seq){.prompt = p0 + s / G, .sample = s % G, .slot = s, .pos = prompts[p0 + s / G].n};
            seq_seed(q, cfg, &prompts[q->prompt], q->prompt);
            sample_init(&out[q->prompt * G + q->sample], prompts[q->prompt].max_new_tokens, cfg->max_turns);
        }
        double t0 = time_now();
        prefill_wave(&e, n_seq);
        tool_turns(&e, n_seq);
        stats->prefill_seconds += time_now() - t0;
        t0 = time_now();
        decode_wave(&e, n_seq);
        stats->decode_seconds += time_now() - t0;
    }
    for (int i = 0; i < n_prompts * G; i++) stats->generated_tokens += out[i].n;
    m->be->sampler_free(m->be, e.scr);
    free(e.u);
    free(e.lps);
    free(e.row_seq);
    free(e.seq_off);
    free(e.pos);
    free(e.slots);
    free(e.tokens);
    free(e.seqs);
    qwen2_acts_free(&e.acts);
    if (!cfg->workspace) backend_arena_free(m->be, arena);
}
