#define _GNU_SOURCE  // memmem
#include "rollout/rollout.h"

#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "base/hash.h"
#include "base/json.h"
#include "base/util.h"
#include "nn/ops.h"
#include "nn/skinny.h"
#include "rollout/json_mask.h"
#include "text/utf8.h"

typedef struct {
    RolloutRequest *req;  // NULL: the slot is free
    int sample, slot;
    int active;   // the slot holds this sequence
    int fresh;    // added, not yet prefilled
    int stepped;  // sampled a token in this step already (its prefill)
    int64_t pos;  // position of the next token to feed
    int64_t start;  // prefill: the prompt's positions its slot holds (from the cache, then its chunks so
                    // far; all of them once prefilled)
    int32_t last;
    Rng rng;
    int done;
    int paused;  // its model text ends in </tool_call>: the step's tool turns answer it
    int began;   // a token with text is in (the first one's leading spaces went as the tokenizer's decode strips)
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

char *rollout_sample_messages(const RolloutSample *s, const char *prompt, const char *prompt_messages) {
    char *out = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&out, &n);
    if (!f) die("open_memstream failed");
    size_t pm = prompt_messages ? strlen(prompt_messages) : 0;
    if (pm >= 4 && prompt_messages[0] == '[' && prompt_messages[pm - 1] == ']') {
        fwrite(prompt_messages, 1, pm - 2, f);  // the prompt's messages but the last "}]"
    } else {
        fputs("[{\"role\": \"user\", \"content\": ", f);
        json_text(f, prompt, 0, (int64_t)strlen(prompt));
    }
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

int rollout_stop_ids(const char *dir, const Tokenizer *tok, int32_t out[16]) {
    int n = decoder_stop_ids(dir, out, 16);
    if (!tok || tok->eos_id < 0 || n >= 16) return n;
    int dup = 0;
    for (int i = 0; i < n; i++) dup |= out[i] == tok->eos_id;
    if (!dup) out[n++] = tok->eos_id;
    return n;
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
static void seq_record(Seq *q, int32_t id, float lp, const Tokenizer *tok, const RolloutRequest *r,
                       RolloutSample *out) {
    const RolloutConfig *cfg = r->cfg;
    out->tokens[out->n] = id;
    if (out->mask) out->mask[out->n] = 1;
    out->logprobs[out->n++] = lp;
    q->last = id;
    q->pos++;
    if (r->fn) r->fn(r->user, r->index, q->sample, id);
    for (int i = 0; i < cfg->n_stop_ids; i++)
        if (id == cfg->stop_ids[i]) q->done = 1, out->finish = FINISH_STOP;
    if (tok && !q->done) {  // the text leaves out a final stop token, as vLLM and TRL do
        size_t len, before = out->text.len;
        int skip = cfg->skip_special && tokenizer_id_special(tok, id);
        const char *b = skip ? NULL : tokenizer_id_bytes(tok, id, &len);
        size_t lead = b && len && !q->began ? tokenizer_lead_strip(tok, b, len) : 0;  // as decode begins a text
        q->began |= b && len;
        buf_append(&out->text, b ? b + lead : "", b ? len - lead : 0);
        out->text_end = (int64_t)out->text.len;
        int n_stop = out->n >= cfg->proc.min_tokens ? cfg->n_stop_strings : 0;
        for (int i = 0; i < n_stop && !q->done; i++) {  // within the model's own turn
            size_t sl = strlen(cfg->stop_strings[i]), from = before >= sl ? before - sl + 1 : 0;
            if (from < (size_t)out->turn_start) from = (size_t)out->turn_start;
            const char *hit = memmem(out->text.data + from, out->text.len - from, cfg->stop_strings[i], sl);
            if (!hit) continue;
            q->done = 1;
            out->finish = FINISH_STOP;
            out->text_end = hit - out->text.data + (cfg->include_stop_str ? (int64_t)sl : 0);
        }
    }
    if (!q->done && out->n >= r->prompt->max_new_tokens) q->done = 1, out->finish = FINISH_LENGTH;
    if (!q->done && cfg->end_at_tool_call && ends_with_tool_call(out)) q->done = 1, out->finish = FINISH_STOP;
    if (!q->done && cfg->tool_fn && out->turns < cfg->max_turns && ends_with_tool_call(out)) q->paused = 1;
}

// Records the next token of q's tool turn (mask 0, log-prob 0); after the last one the model's next turn
// starts.
static void seq_record_fed(Seq *q, const Tokenizer *tok, const RolloutRequest *r, RolloutSample *out) {
    int32_t id = q->feed.ids[q->feed_next++];
    out->tokens[out->n] = id;
    out->mask[out->n] = 0;
    out->logprobs[out->n++] = 0;
    q->last = id;
    q->pos++;
    if (r->fn) r->fn(r->user, r->index, q->sample, id);
    size_t len;
    const char *b = tokenizer_id_bytes(tok, id, &len);
    buf_append(&out->text, b ? b : "", b ? len : 0);
    q->began |= b && len;
    // text_end moves once the whole tool turn is in: a sample cut inside one ends with its tool call
    int fed = q->feed_next == (int64_t)q->feed.n;
    if (fed) out->turn_start = out->next_start[out->turns - 1] = out->text_end = (int64_t)out->text.len;
    if (out->n >= r->prompt->max_new_tokens) q->done = 1, out->finish = FINISH_LENGTH;  // no room for the model's turn
    if (fed || q->done) {
        free(q->feed.ids);
        memset(&q->feed, 0, sizeof q->feed);
    }
}

// A token's uniform draw: one from its sequence's RNG when sampling, none when greedy.
static double draw_unit(const RolloutConfig *cfg, Seq *q) {
    return cfg->sampler.temperature > 0 ? sampler_unit(&q->rng) : 0.0;
}

size_t rollout_workspace_bytes(const Backend *be, const DecoderConfig *c, DType dtype, int64_t n_slots, int64_t slot_len,
                               int64_t prefill_rows) {
    int64_t act_rows = prefill_rows > n_slots ? prefill_rows : n_slots;
    return (size_t)n_slots * (size_t)slot_len * decoder_kv_bytes_per_token(c) +
           decoder_acts_bytes(be, c, dtype, act_rows, slot_len) + (size_t)n_slots * (size_t)c->vocab * 4 +
           4 * 64;  // 64-byte alignment of KV, activations, logits
}

// The engine: the model, the KV cache slots and workspace, and the sequences in them (seqs[slot]).
struct RolloutEngine {
    const Decoder *m;
    const Tokenizer *tok;
    int n_slots;
    int64_t slot_len, prefill_rows;
    Arena own, *arena;
    DecoderKV kv;
    DecoderActs acts;
    float *logits;       // (n_slots, V) in the backend's memory
    float *host_logits;  // (n_slots, V) their host copy, for logits_fn on a device (allocated on first use)
    Seq *seqs;           // per slot; active ones hold a sequence
    RolloutRequest **pending;  // added, not yet prefilled, in order
    int n_pending;
    int32_t *tokens, *slots, *pos, *rope_pos;
    int64_t *seq_off;
    int *row_seq;  // batch entry -> (first) slot it feeds
    float *lps;
    double *u;     // each row's uniform draw from its sequence's RNG
    void *scr;     // the backend's sampler scratch
    float *proc_row;        // (V) a processed row of logits (host)
    int32_t *proc_count;    // (V) sampler_process's counters
    uint8_t *json_plain;    // (V) json_plain_tokens, for JSON mode
    SamplerScratch proc_scr;  // the host sampler's, for processed rows
    // Prefix caching: what each slot's cache holds, valid as long as the slot is not taken (running or free)
    int prefix;
    int64_t chunk;      // chunked prefill: prompt rows a step at most while sequences decode (0: whole prompts)
    int32_t *kv_ids;    // (n_slots, slot_len) the tokens whose keys and values the slot holds
    int64_t *kv_n;      // (n_slots) how many: positions [0, kv_n) are valid
    uint64_t *kv_used;  // (n_slots) when its sequence ended or it was last copied from (the least recent is
                        // taken first)
    uint64_t clock;
    // KV memory: on the CPU committed as positions are written (decoder_kv_reserve), given back when a slot's
    // cache ends
    int64_t kv_budget;  // positions the running sequences may fill (each its prompt and max_new_tokens) and
                        // the free slots' caches hold, together at most (rollout_engine_kv_budget; default:
                        // every slot whole)
    int64_t *kv_held;   // (n_slots) a free slot's positions whose memory it holds (its cache)
    RolloutStats stats;
};

RolloutEngine *rollout_engine_new(const Decoder *m, const Tokenizer *tok, int n_slots, int64_t slot_len,
                                  int64_t prefill_rows, Arena *workspace) {
    const DecoderConfig *c = &m->cfg;
    if (!m->be->on_device) skinny_tuning(m->q8 ? DTYPE_Q8 : m->dtype);  // the decode kernel, resolved before any timed phase
    RolloutEngine *e = xcalloc(1, sizeof *e);
    *e = (RolloutEngine){.m = m, .tok = tok, .n_slots = n_slots, .slot_len = slot_len, .prefill_rows = prefill_rows};
    int64_t act_rows = prefill_rows > n_slots ? prefill_rows : n_slots;
    size_t kv_bytes = (size_t)n_slots * (size_t)slot_len * decoder_kv_bytes_per_token(c);
    e->arena = workspace ? workspace : &e->own;
    if (workspace) {
        arena_reset(workspace);
        decoder_kv_init(&e->kv, c, n_slots, slot_len, workspace);
    } else {
        size_t rest = rollout_workspace_bytes(m->be, c, m->dtype, n_slots, slot_len, prefill_rows) - kv_bytes;
        backend_arena_init(m->be, &e->own, rest);
        decoder_kv_reserve(&e->kv, m->be, c, n_slots, slot_len);
    }
    e->kv_budget = (int64_t)n_slots * slot_len;
    e->kv_held = xcalloc((size_t)n_slots, sizeof *e->kv_held);
    decoder_acts_init(&e->acts, m->be, c, m->dtype, act_rows, slot_len, e->arena);
    e->logits = arena_alloc(e->arena, (size_t)n_slots * (size_t)c->vocab * sizeof(float));
    e->seqs = xcalloc((size_t)n_slots, sizeof *e->seqs);
    e->pending = xcalloc((size_t)n_slots, sizeof *e->pending);
    e->tokens = xmalloc((size_t)act_rows * sizeof *e->tokens);
    e->slots = xmalloc((size_t)act_rows * sizeof *e->slots);
    e->pos = xmalloc((size_t)act_rows * sizeof *e->pos);
    e->rope_pos = xmalloc((size_t)act_rows * sizeof *e->rope_pos);
    e->seq_off = xmalloc(((size_t)act_rows + 1) * sizeof *e->seq_off);
    e->row_seq = xmalloc((size_t)act_rows * sizeof *e->row_seq);
    e->lps = xmalloc((size_t)n_slots * sizeof *e->lps);
    e->u = xmalloc((size_t)n_slots * sizeof *e->u);
    e->scr = m->be->sampler_new(m->be, c->vocab);
    e->stats.kv_bytes = kv_bytes;
    e->stats.kv_bytes_per_token = decoder_kv_bytes_per_token(c);
    return e;
}

void rollout_engine_free(RolloutEngine *e) {
    if (!e) return;
    for (int s = 0; s < e->n_slots; s++) {
        free(e->seqs[s].feed.ids);
    }
    e->m->be->sampler_free(e->m->be, e->scr);
    free(e->u);
    free(e->lps);
    free(e->row_seq);
    free(e->seq_off);
    free(e->pos);
    free(e->rope_pos);
    free(e->slots);
    free(e->tokens);
    free(e->pending);
    free(e->seqs);
    free(e->host_logits);
    free(e->proc_row);
    free(e->proc_count);
    free(e->json_plain);
    free(e->proc_scr.prob);
    free(e->proc_scr.idx);
    free(e->kv_ids);
    free(e->kv_n);
    free(e->kv_used);
    free(e->kv_held);
    decoder_kv_free(&e->kv, e->m->be);
    decoder_acts_free(&e->acts);
    if (e->arena == &e->own) backend_arena_free(e->m->be, &e->own);
    free(e);
}

const RolloutStats *rollout_engine_stats(const RolloutEngine *e) { return &e->stats; }

int rollout_engine_free_slots(const RolloutEngine *e) {
    int n = 0;
    for (int s = 0; s < e->n_slots; s++) n += !e->seqs[s].active;
    return n;
}

void rollout_engine_prefix_cache(RolloutEngine *e, int on) {
    e->prefix = on;
    if (!on) return;
    if (!e->kv_ids) e->kv_ids = xmalloc((size_t)e->n_slots * (size_t)e->slot_len * sizeof *e->kv_ids);
    free(e->kv_n);
    free(e->kv_used);
    e->kv_n = xcalloc((size_t)e->n_slots, sizeof *e->kv_n);  // nothing cached yet
    e->kv_used = xcalloc((size_t)e->n_slots, sizeof *e->kv_used);
}

void rollout_engine_kv_budget(RolloutEngine *e, int64_t positions) { e->kv_budget = positions; }

// A sequence of r's most positions: its prompt and its new tokens.
static int64_t seq_most(const RolloutRequest *r) { return r->prompt->n + r->prompt->max_new_tokens; }

// The KV positions the running sequences may fill.
static int64_t kv_promised(const RolloutEngine *e) {
    int64_t n = 0;
    for (int s = 0; s < e->n_slots; s++)
        if (e->seqs[s].active) n += seq_most(e->seqs[s].req);
    return n;
}

int64_t rollout_engine_kv_room(const RolloutEngine *e) { return e->kv_budget - kv_promised(e); }

// Slot s keeps positions [0, from) of its cache and gives back the memory of the rest.
static void kv_keep(RolloutEngine *e, int s, int64_t from) {
    decoder_kv_release(e->m, &e->kv, s, from);
    e->kv_held[s] = from;
    if (e->prefix && e->kv_n[s] > from) e->kv_n[s] = from;
}

int64_t rollout_engine_prefill_chunk(RolloutEngine *e, int64_t tokens) {
    int64_t rows = e->prefill_rows > e->n_slots ? e->prefill_rows : e->n_slots;
    int64_t room = rows - e->n_slots;  // beside the decode rows
    e->chunk = tokens < room ? tokens : room;
    return e->chunk;
}

// Whether r's prompt is text whose prompt logits nobody wants: it may start from cached keys and values, and be
// prefilled in chunks.
static int text_only(const RolloutRequest *r) {
    return !r->prompt->vl && !(r->logits_fn && r->want_prompt_logits);
}

static int uses_cache(const RolloutEngine *e, const RolloutRequest *r) { return e->prefix && text_only(r); }

// Whether the cache keeps what r's sequences compute (text: an image pad's keys depend on its image).
static int feeds_cache(const RolloutEngine *e, const RolloutRequest *r) { return e->prefix && !r->prompt->vl; }

// The positions of a prompt ids (n) that a cache holding tokens have (na) can give: their tokens in common from
// the start, in whole blocks, leaving the prompt's last token to prefill (its row gives the first new token's
// logits).
static int64_t common_blocks(const int32_t *have, int64_t na, const int32_t *ids, int64_t n) {
    int64_t lcp = 0, most = na < n - 1 ? na : n - 1;
    while (lcp < most && have[lcp] == ids[lcp]) lcp++;
    return lcp / ROLLOUT_PREFIX_BLOCK * ROLLOUT_PREFIX_BLOCK;
}

static int64_t slot_match(const RolloutEngine *e, int s, const int32_t *ids, int64_t n) {
    return common_blocks(e->kv_ids + (int64_t)s * e->slot_len, e->kv_n[s], ids, n);
}

// The slot but `self` whose cache gives the most of prompt p (free ones only with free_only), its match in *len
// (0 and -1: none gives a block).
static int best_source(const RolloutEngine *e, const RolloutPrompt *p, int self, int free_only, int64_t *len) {
    int best = -1;
    *len = 0;
    for (int s = 0; s < e->n_slots; s++) {
        if (s == self || (free_only && e->seqs[s].active)) continue;
        int64_t m = slot_match(e, s, p->ids, p->n);
        if (m > *len) best = s, *len = m;
    }
    return best;
}

// A free slot holding no cache (empty), else the free one used least recently.
static int free_slot(const RolloutEngine *e, int empty) {
    int best = -1;
    for (int s = 0; s < e->n_slots; s++) {
        if (e->seqs[s].active) continue;
        if (e->kv_n[s] == 0) return s;
        if (!empty && (best < 0 || e->kv_used[s] < e->kv_used[best])) best = s;
    }
    return best;
}

// A free slot for sample j of r: without prefix caching the lowest; with it, an empty one (the prefill copies
// what another slot's cache gives), else the one whose cache gives the most of r's prompt (sample 0; it keeps
// that much), else the least recently used. So a cache is taken only when no slot is empty.
static int take_slot(RolloutEngine *e, const RolloutRequest *r, int j) {
    int slot = 0;
    if (!e->prefix) {
        while (e->seqs[slot].active) slot++;
        return slot;
    }
    int64_t keep = 0;
    slot = free_slot(e, 1);
    if (slot < 0 && j == 0 && uses_cache(e, r)) slot = best_source(e, r->prompt, -1, 1, &keep);
    if (slot < 0) slot = free_slot(e, 0);
    kv_keep(e, slot, keep);
    return slot;
}

// Free slots' caches given back, the least recently used first, until they fit in the budget beside what the
// running sequences may fill (on the CPU: a device's cache is held whole, nothing to give back). The blocks a
// pending prompt is to copy from a free cache are given back last: first every cache's rest.
static void kv_evict(RolloutEngine *e) {
    if (!e->kv.on_demand) return;
    int64_t over = kv_promised(e) - e->kv_budget;
    for (int s = 0; s < e->n_slots; s++)
        if (!e->seqs[s].active) over += e->kv_held[s];
    if (over <= 0) return;
    int64_t *wanted = xcalloc((size_t)e->n_slots, sizeof *wanted);
    for (int i = 0; i < e->n_pending; i++) {
        int64_t len;
        int src = uses_cache(e, e->pending[i]) ? best_source(e, e->pending[i]->prompt, -1, 1, &len) : -1;
        if (src >= 0 && len > wanted[src]) wanted[src] = len;
    }
    for (int pass = 0; pass < 2; pass++)  // down to what is wanted, then to nothing
        while (over > 0) {
            int lru = -1;
            for (int s = 0; s < e->n_slots; s++)
                if (!e->seqs[s].active && e->kv_held[s] > (pass ? 0 : wanted[s]) &&
                    (lru < 0 || (e->prefix && e->kv_used[s] < e->kv_used[lru])))
                    lru = s;
            if (lru < 0) break;
            int64_t keep = pass ? 0 : wanted[lru];
            over -= e->kv_held[lru] - keep;
            kv_keep(e, lru, keep);
        }
    free(wanted);
}

int rollout_engine_add(RolloutEngine *e, RolloutRequest *r) {
    if (r->n < 1 || r->n > rollout_engine_free_slots(e) || r->prompt->n < 1 || seq_most(r) > e->slot_len ||
        r->prompt->n > e->prefill_rows || r->n * seq_most(r) > rollout_engine_kv_room(e))
        return -1;
    r->running = r->n;
    r->cached = 0;
    e->pending[e->n_pending++] = r;
    for (int j = 0; j < r->n; j++) {
        int slot = take_slot(e, r, j);
        Seq *q = &e->seqs[slot];
        *q = (Seq){.req = r, .sample = j, .slot = slot, .pos = r->prompt->n, .active = 1, .fresh = 1};
        seq_seed(q, r->cfg, r->prompt, r->index);
        sample_init(&r->out[j], r->prompt->max_new_tokens, r->cfg->max_turns);
    }
    int64_t len;
    int src = uses_cache(e, r) ? best_source(e, r->prompt, -1, 1, &len) : -1;
    if (src >= 0) e->kv_used[src] = ++e->clock;  // the free cache its prefill will copy from: given back last
    kv_evict(e);
    return 0;
}

// Ends q: its slot is free for the next sequence (its cache kept, with prefix caching).
static void seq_end(RolloutEngine *e, Seq *q) {
    if (e->prefix) e->kv_used[q->slot] = ++e->clock;
    kv_keep(e, q->slot, e->prefix ? e->kv_n[q->slot] : 0);
    free(q->feed.ids);
    q->req->out[q->sample].done = 1;
    q->req->running--;
    memset(q, 0, sizeof *q);
}

void rollout_engine_cancel(RolloutEngine *e, RolloutRequest *r) {
    for (int s = 0; s < e->n_slots; s++)
        if (e->seqs[s].active && e->seqs[s].req == r) seq_end(e, &e->seqs[s]);
    int k = 0;
    for (int i = 0; i < e->n_pending; i++)
        if (e->pending[i] != r) e->pending[k++] = e->pending[i];
    e->n_pending = k;
}

static void record(RolloutEngine *e, Seq *q, int32_t id, float lp) {
    RolloutRequest *r = q->req;
    RolloutSample *out = &r->out[q->sample];
    if (q->feed.n) seq_record_fed(q, e->tok, r, out);
    else seq_record(q, id, lp, e->tok, r, out);
}

// Host memory holding `rows` rows of logits at `logits` (the backend's): those, or their copy.
static const float *host_rows(RolloutEngine *e, const float *logits, int64_t rows) {
    const Backend *be = e->m->be;
    if (!be->on_device) return logits;
    size_t bytes = (size_t)rows * (size_t)e->m->cfg.vocab * sizeof(float);
    if (!e->host_logits) e->host_logits = xmalloc((size_t)e->n_slots * (size_t)e->m->cfg.vocab * sizeof(float));
    be->download(be, e->host_logits, logits, bytes);
    return e->host_logits;
}

// Whether q's request samples on the host from processed logits: it has logits processing, or a min_p that
// only the host sampler has.
static int host_sampled(const RolloutEngine *e, const RolloutConfig *cfg) {
    return sampler_processing(&cfg->proc) || cfg->json_object || cfg->n_choices || cfg->regex ||
           (cfg->sampler.min_p > 0 && e->m->be->on_device);
}

// q's next token from its row of logits (backend memory), processed on the host (host_sampled); logits_fn
// sees the processed row.
static int32_t sample_processed(RolloutEngine *e, Seq *q, const float *row, double u, float *lp) {
    int64_t V = e->m->cfg.vocab;
    const RolloutRequest *r = q->req;
    const RolloutSample *out = &r->out[q->sample];
    if (!e->proc_row) {
        e->proc_row = xmalloc((size_t)V * sizeof *e->proc_row);
        e->proc_count = xcalloc((size_t)V, sizeof *e->proc_count);
        e->proc_scr = (SamplerScratch){xmalloc((size_t)V * sizeof(float)), xmalloc((size_t)V * sizeof(int32_t))};
    }
    memcpy(e->proc_row, host_rows(e, row, 1), (size_t)V * sizeof *e->proc_row);
    sampler_process(&r->cfg->proc, e->proc_row, r->prompt->ids, r->prompt->n, out->tokens, out->n,
                    r->cfg->stop_ids, r->cfg->n_stop_ids, e->proc_count);
    const char *text = out->text.data ? out->text.data : "";
    int64_t left = r->prompt->max_new_tokens - out->n;
    const RolloutConfig *c = r->cfg;
    if (c->json_object) {
        if (!e->json_plain) e->json_plain = json_plain_tokens(e->tok, V);
        json_mask(e->tok, c->json_schema, e->json_plain, c->mask_cache, text, out->text.len, left, c->stop_ids,
                  c->n_stop_ids, e->proc_row, V);
    }
    if (c->n_choices)
        choice_mask(e->tok, c->choices, c->n_choices, text, out->text.len, left, c->stop_ids, c->n_stop_ids,
                    e->proc_row, V);
    if (c->regex)
        regex_mask(e->tok, c->regex, c->mask_cache, text, out->text.len, left, c->stop_ids, c->n_stop_ids,
                   e->proc_row, V);
    int32_t id = sampler_sample(&r->cfg->sampler, e->proc_row, V, u, &e->proc_scr, lp);
    if (r->logits_fn && r->want_logits) r->logits_fn(r->user, r->index, q->sample, 0, 1, e->proc_row);
    return id;
}

// The tool turns of the sequences that paused in this step: one call of a hook for all that share it.
static void tool_turns(RolloutEngine *e) {
    for (;;) {
        const RolloutConfig *cfg = NULL;
        int n = 0;
        for (int s = 0; s < e->n_slots; s++) {
            const Seq *q = &e->seqs[s];
            if (!q->active || !q->paused) continue;
            if (!cfg) cfg = q->req->cfg;
            n += q->req->cfg->tool_fn == cfg->tool_fn && q->req->cfg->tool_user == cfg->tool_user;
        }
        if (n == 0) return;
        RolloutToolTurn *t = xcalloc((size_t)n, sizeof *t);
        int *at = xmalloc((size_t)n * sizeof *at);
        n = 0;
        for (int s = 0; s < e->n_slots; s++) {
            const Seq *q = &e->seqs[s];
            if (!q->active || !q->paused || q->req->cfg->tool_fn != cfg->tool_fn ||
                q->req->cfg->tool_user != cfg->tool_user)
                continue;
            const RolloutSample *out = &q->req->out[q->sample];
            at[n] = s;
            t[n++] = (RolloutToolTurn){.prompt = q->req->index, .sample = q->sample,
                                       .text = out->text.data + out->turn_start,
                                       .n = out->text.len - (size_t)out->turn_start};
        }
        cfg->tool_fn(cfg->tool_user, t, n);
        for (int i = 0; i < n; i++) {
            Seq *q = &e->seqs[at[i]];
            RolloutSample *out = &q->req->out[q->sample];
            q->paused = 0;
            out->turn_end[out->turns] = (int64_t)out->text.len;
            out->next_start[out->turns] = -1;  // until the tool turn is fed
            out->tool_content[out->turns] = t[i].content;
            out->turns++;
            q->feed = t[i].append;
            q->feed_next = 0;
            if (q->feed.n == 0) {  // the hook ended it
                out->finish = FINISH_STOP;
                seq_end(e, q);
            }
        }
        free(at);
        free(t);
    }
}

// Frees the slots of the sequences that finished in this step.
static void end_finished(RolloutEngine *e) {
    for (int s = 0; s < e->n_slots; s++)
        if (e->seqs[s].active && e->seqs[s].done) seq_end(e, &e->seqs[s]);
}

// The prompt logits of request r, whose prompt fills rows [from, from + n) of the last forward: passed to
// its logits_fn in chunks of the logits buffer.
static void prompt_logits(RolloutEngine *e, RolloutRequest *r, int64_t from) {
    const Decoder *m = e->m;
    for (int64_t i = 0; i < r->prompt->n;) {
        int64_t rows = r->prompt->n - i < e->n_slots ? r->prompt->n - i : e->n_slots;
        decoder_logits(m, e->acts.xn + (from + i) * m->cfg.hidden, rows, &e->acts, e->logits);
        r->logits_fn(r->user, r->index, -1, i, rows, host_rows(e, e->logits, rows));
        i += rows;
    }
}

// The prefill forward of the batch in e->tokens / seq_off / slots / row_seq; with a vision-language prompt in
// it, the batch's image inputs are its prompts' (text prompts' rows: their positions' rotation).
static void prefill_forward(RolloutEngine *e, int B) {
    const Decoder *m = e->m;
    int64_t D = m->cfg.head_dim, n_images = 0;
    int any = 0;
    for (int b = 0; b < B; b++) {
        const RolloutPrompt *p = e->seqs[e->row_seq[b]].req->prompt;
        any |= p->vl != NULL;
        n_images += p->vl ? p->vl->n_image_rows : 0;
    }
    if (!any) {
        decoder_forward(m, e->tokens, e->seq_off, B, &e->acts, &e->kv, e->slots);
        return;
    }
    int64_t N = e->seq_off[B];
    DecoderVlInputs in = {.N = N, .rope = xmalloc((size_t)(N * D) * sizeof(float)),
                        .image_rows = xmalloc((size_t)n_images * sizeof(int64_t) + 1),
                        .image_feats = xmalloc((size_t)n_images * sizeof(float *) + 1)};
    for (int b = 0; b < B; b++) {
        const RolloutPrompt *p = e->seqs[e->row_seq[b]].req->prompt;
        int64_t lo = e->seq_off[b], n = e->seq_off[b + 1] - lo;
        if (p->vl && p->vl->N != n)
            die("internal: a prompt's image inputs of %lld rows for %lld", (long long)p->vl->N, (long long)n);
        if (p->vl) {
            memcpy(in.rope + lo * D, p->vl->rope, (size_t)(n * D) * sizeof(float));
            for (int64_t k = 0; k < p->vl->n_image_rows; k++) {
                in.image_rows[in.n_image_rows] = lo + p->vl->image_rows[k];
                in.image_feats[in.n_image_rows++] = p->vl->image_feats[k];
            }
            continue;
        }
        int32_t *pos = xmalloc((size_t)n * sizeof *pos);
        for (int64_t i = 0; i < n; i++) pos[i] = (int32_t)i;
        rope_table(in.rope + lo * D, pos, n, (int)D, m->cfg.rope);
        free(pos);
    }
    decoder_forward_vl(m, e->tokens, e->seq_off, B, &e->acts, &e->kv, e->slots, &in);
    free(in.rope);
    free(in.image_rows);
    free(in.image_feats);
}

// Where q's prefill starts: the prompt's positions its own slot's cache holds, or more that slot *src's gives
// (else -1); 0 for a request that does not use the cache.
static int64_t prefix_start(const RolloutEngine *e, const Seq *q, int *src) {
    *src = -1;
    if (!uses_cache(e, q->req)) return 0;
    int64_t own = e->kv_n[q->slot], m;
    int s = best_source(e, q->req->prompt, q->slot, 0, &m);
    if (m <= own) return own;
    *src = s;
    return m;
}

// q's prefill begins at start: positions [0, start) are in its slot's cache (copied from slot src, unless -1).
// Nothing for a group that began already (its chunks so far).
static void take_prefix(RolloutEngine *e, Seq *q, int src, int64_t start) {
    if (q->start > 0) return;
    q->start = start;
    if (q->sample == 0) q->req->cached = start;
    e->stats.cached_tokens += start;
    if (src < 0) return;
    decoder_kv_copy(e->m, &e->kv, q->slot, src, start);
    memcpy(e->kv_ids + (int64_t)q->slot * e->slot_len, e->kv_ids + (int64_t)src * e->slot_len,
           (size_t)start * sizeof *e->kv_ids);
    e->kv_n[q->slot] = start;
    e->kv_used[src] = ++e->clock;
}

// After slot `slot` got the keys and values of its prompt's first n tokens (its prefill's, or a copy of slot
// from's): what it holds.
static void cache_prompt(RolloutEngine *e, int slot, int from, int64_t n) {
    const RolloutRequest *r = e->seqs[from].req;
    if (!feeds_cache(e, r)) return;
    memcpy(e->kv_ids + (int64_t)slot * e->slot_len, r->prompt->ids, (size_t)n * sizeof *e->kv_ids);
    e->kv_n[slot] = n;
}

// Where group q's prefill goes on: the positions it has (chunks so far), else where prefix_start says (*src: the
// slot to copy them from, or -1).
static int64_t plan_start(const RolloutEngine *e, const Seq *q, int *src) {
    *src = -1;
    return q->start > 0 ? q->start : prefix_start(e, q, src);
}

// Whether chunked prefill takes r's prompt.
static int chunked(const RolloutEngine *e, const RolloutRequest *r) { return e->chunk > 0 && text_only(r); }

// The pending prompts' row groups, in order: one a prompt (shared prefill) or a sample, the first sequence's
// slot each; with chunks 0 those chunked prefill leaves whole, 1 those it chunks, -1 all. Returns their count.
static int pending_groups(const RolloutEngine *e, int *groups, int chunks) {
    int n = 0;
    for (int i = 0; i < e->n_pending; i++) {
        RolloutRequest *r = e->pending[i];
        for (int s = 0; s < e->n_slots; s++) {
            const Seq *q = &e->seqs[s];
            if (!q->active || q->req != r || !q->fresh) continue;
            if (q->sample > 0 && r->cfg->share_prefill) continue;
            if (chunks >= 0 && chunked(e, r) != chunks) continue;
            groups[n++] = s;
        }
    }
    return n;
}

// Keeps pending the requests with a sequence still to prefill.
static void drop_started(RolloutEngine *e) {
    int k = 0;
    for (int i = 0; i < e->n_pending; i++) {
        int fresh = 0;
        for (int s = 0; s < e->n_slots; s++)
            fresh |= e->seqs[s].active && e->seqs[s].req == e->pending[i] && e->seqs[s].fresh;
        if (fresh) e->pending[k++] = e->pending[i];
    }
    e->n_pending = k;
}

// The first token of each sequence whose prefill (group first's) ended in the logits row `row` (backend
// memory): first's, and its samples' sharing the prefill, which get a copy of its keys and values.
static void first_tokens(RolloutEngine *e, Seq *first, const float *row) {
    const Decoder *m = e->m;
    RolloutRequest *r = first->req;
    for (int s = 0; s < e->n_slots; s++) {
        Seq *q = &e->seqs[s];
        if (!q->active || q->req != r || !q->fresh) continue;
        if (q != first && (!r->cfg->share_prefill || q->sample == 0)) continue;
        if (q != first) decoder_kv_copy(m, &e->kv, q->slot, first->slot, r->prompt->n);
        if (q != first) cache_prompt(e, q->slot, first->slot, r->prompt->n);
        float lp;
        int32_t id;
        double u = draw_unit(r->cfg, q);
        if (host_sampled(e, r->cfg)) {
            id = sample_processed(e, q, row, u, &lp);
        } else {
            m->be->sample(m->be, &r->cfg->sampler, row, 1, m->cfg.vocab, &u, e->scr, &id, &lp);
            if (r->logits_fn && r->want_logits)
                r->logits_fn(r->user, r->index, q->sample, 0, 1, host_rows(e, row, 1));
        }
        q->fresh = 0;
        q->stepped = 1;
        record(e, q, id, lp);
        if (!r->cfg->share_prefill) break;
    }
}

// Whether group q, to start at `start`, is to wait for the prompts of groups (n) in this forward: one of them
// would give it more.
static int waits_for(const RolloutEngine *e, const Seq *q, int64_t start, const int *groups, int n) {
    if (!uses_cache(e, q->req) || q->start > 0) return 0;
    const RolloutPrompt *p = q->req->prompt;
    for (int b = 0; b < n; b++) {
        const RolloutRequest *r = e->seqs[groups[b]].req;
        if (feeds_cache(e, r) && common_blocks(r->prompt->ids, r->prompt->n, p->ids, p->n) > start) return 1;
    }
    return 0;
}

// Prefill of the pending requests (with whole_only, those chunked prefill leaves whole): each prompt once (then
// copied to its other samples' slots), or once per sample, from where its cache or its chunks so far leave it;
// every sequence samples its first token.
static void prefill(RolloutEngine *e, int whole_only) {
    const Decoder *m = e->m;
    const DecoderConfig *c = &m->cfg;
    int *groups = xmalloc((size_t)e->n_slots * sizeof *groups);
    int n_groups = pending_groups(e, groups, whole_only ? 0 : -1);
    for (int g = 0; g < n_groups;) {
        // A batch of whole prompts (slots: one a sequence), or of prompts' rows after the positions their
        // slots hold (extend; slots and pos: one a row).
        int B = 0, extend = 0;
        e->seq_off[0] = 0;
        for (; g < n_groups; g++) {
            Seq *q = &e->seqs[groups[g]];
            const RolloutPrompt *p = q->req->prompt;
            int src;
            int64_t start = plan_start(e, q, &src);
            int64_t n = p->n - start;
            if (B > 0 && ((start > 0) != extend || e->seq_off[B] + n > e->prefill_rows)) break;
            if (B > 0 && waits_for(e, q, start, e->row_seq, B)) break;
            take_prefix(e, q, src, start);
            extend = start > 0;
            memcpy(e->tokens + e->seq_off[B], p->ids + start, (size_t)n * sizeof *e->tokens);
            for (int64_t i = 0; extend && i < n; i++) {
                e->slots[e->seq_off[B] + i] = q->slot;
                e->pos[e->seq_off[B] + i] = (int32_t)(start + i);
            }
            if (!extend) e->slots[B] = q->slot;
            e->row_seq[B] = q->slot;
            e->seq_off[B + 1] = e->seq_off[B] + n;
            B++;
        }
        if (extend) decoder_extend(m, &e->kv, e->tokens, e->slots, e->pos, e->pos, e->seq_off[B], &e->acts);
        else prefill_forward(e, B);
        e->stats.step_rows += e->seq_off[B];
        for (int b = 0; b < B; b++) {
            Seq *q = &e->seqs[e->row_seq[b]];
            q->start = q->req->prompt->n;
            cache_prompt(e, q->slot, q->slot, q->start);
            if (q->req->logits_fn && q->req->want_prompt_logits && q->sample == 0)
                prompt_logits(e, q->req, e->seq_off[b]);
        }
        for (int b = 0; b < B; b++)  // the last row of each prompt predicts its first new token
            m->be->copy(m->be, e->acts.proj + b * c->hidden, e->acts.xn + (e->seq_off[b + 1] - 1) * c->hidden,
                        (size_t)c->hidden * sizeof(float));
        decoder_logits(m, e->acts.proj, B, &e->acts, e->logits);
        for (int b = 0; b < B; b++) first_tokens(e, &e->seqs[e->row_seq[b]], e->logits + (int64_t)b * c->vocab);
    }
    free(groups);
    drop_started(e);
}

// This step's decode rows: every running sequence but those that sampled in it already, its last token at
// pos - 1 (rows 0..B of tokens, slots, pos, rope_pos, row_seq). Returns B.
static int decode_rows(RolloutEngine *e) {
    int B = 0;
    for (int s = 0; s < e->n_slots; s++) {
        Seq *q = &e->seqs[s];
        if (!q->active || q->done || q->fresh || q->stepped) continue;
        e->tokens[B] = q->last;
        e->slots[B] = s;
        e->pos[B] = (int32_t)q->pos - 1;  // the last sampled token sits at pos - 1
        e->rope_pos[B] = e->pos[B] + (q->req->prompt->vl ? (int32_t)q->req->prompt->vl->delta[0] : 0);
        e->row_seq[B++] = s;
    }
    return B;
}

// After the forward of the B decode rows: their tokens' keys and values are in their slots; each samples its
// next token from its row of e->logits.
static void decoded(RolloutEngine *e, int B) {
    const Decoder *m = e->m;
    for (int b = 0; b < B; b++) {
        const Seq *q = &e->seqs[e->row_seq[b]];
        if (!feeds_cache(e, q->req)) continue;
        e->kv_ids[(int64_t)q->slot * e->slot_len + e->pos[b]] = e->tokens[b];
        e->kv_n[q->slot] = e->pos[b] + 1;
    }
    for (int b = 0; b < B; b++) {  // a row feeding a tool turn samples nothing: it takes no draw
        Seq *q = &e->seqs[e->row_seq[b]];
        e->u[b] = q->feed.n ? 0.0 : draw_unit(q->req->cfg, q);
    }
    for (int b0 = 0; b0 < B;) {  // one sampler call per run of rows with the same sampler settings
        const RolloutConfig *cfg = e->seqs[e->row_seq[b0]].req->cfg;
        int b1 = b0 + 1;
        while (b1 < B && e->seqs[e->row_seq[b1]].req->cfg == cfg) b1++;
        const float *rows = e->logits + (int64_t)b0 * m->cfg.vocab;
        if (host_sampled(e, cfg)) {
            for (int b = b0; b < b1; b++) {
                Seq *q = &e->seqs[e->row_seq[b]];
                if (!q->feed.n)
                    e->tokens[b] = sample_processed(e, q, rows + (int64_t)(b - b0) * m->cfg.vocab, e->u[b],
                                                    &e->lps[b]);
            }
        } else {
            m->be->sample(m->be, &cfg->sampler, rows, b1 - b0, m->cfg.vocab, e->u + b0, e->scr, e->tokens + b0,
                          e->lps + b0);
        }
        b0 = b1;
    }
    for (int b = 0; b < B; b++) {
        Seq *q = &e->seqs[e->row_seq[b]];
        RolloutRequest *r = q->req;
        if (r->logits_fn && r->want_logits && !q->feed.n && !host_sampled(e, r->cfg))
            r->logits_fn(r->user, r->index, q->sample, 0, 1,
                         host_rows(e, e->logits + (int64_t)b * m->cfg.vocab, 1));
        q->stepped = 1;
        record(e, q, e->tokens[b], e->lps[b]);
    }
}

// One decode step: every running sequence but those this step prefilled advances one token.
static void decode(RolloutEngine *e) {
    int B = decode_rows(e);
    if (B == 0) return;
    decoder_decode_step_at(e->m, &e->kv, e->tokens, e->slots, e->pos, e->rope_pos, B, &e->acts, e->logits);
    e->stats.step_rows += B;
    decoded(e, B);
}

// Chunked prefill's step while sequences decode: their rows and the next rows of the pending prompts it chunks,
// e->chunk at most, in one forward (the weights read once for both); a prompt whose last rows are in it samples
// its first token.
static void decode_with_chunks(RolloutEngine *e) {
    const Decoder *m = e->m;
    const DecoderConfig *c = &m->cfg;
    int *groups = xmalloc((size_t)e->n_slots * sizeof *groups);
    int *in = xmalloc((size_t)e->n_slots * sizeof *in);    // the groups with rows in this forward
    int *done = xmalloc((size_t)e->n_slots * sizeof *done);  // those whose last rows they are
    int64_t *last = xmalloc((size_t)e->n_slots * sizeof *last);  // and the row of each
    int n_groups = pending_groups(e, groups, 1);
    int n_in = 0;
    int n_done = 0;
    int B = decode_rows(e);
    int64_t N = B;
    for (int g = 0; g < n_groups && N - B < e->chunk; g++) {
        Seq *q = &e->seqs[groups[g]];
        const RolloutPrompt *p = q->req->prompt;
        int src;
        int64_t start = plan_start(e, q, &src);
        if (waits_for(e, q, start, in, n_in)) break;
        take_prefix(e, q, src, start);
        int64_t n = p->n - start;
        if (n > e->chunk - (N - B)) n = e->chunk - (N - B);
        for (int64_t i = 0; i < n; i++) {
            e->tokens[N + i] = p->ids[start + i];
            e->slots[N + i] = q->slot;
            e->pos[N + i] = e->rope_pos[N + i] = (int32_t)(start + i);
        }
        N += n;
        q->start = start + n;
        in[n_in++] = q->slot;
        if (q->start == p->n) last[n_done] = N - 1, done[n_done++] = q->slot;
    }
    if (N > 0) {
        decoder_extend(m, &e->kv, e->tokens, e->slots, e->pos, e->rope_pos, N, &e->acts);
        e->stats.step_rows += N;
        for (int k = 0; k < n_in; k++) cache_prompt(e, in[k], in[k], e->seqs[in[k]].start);
        for (int k = 0; k < n_done; k++)  // after the decode rows: the last row of each prompt done
            if (last[k] != B + k)
                m->be->copy(m->be, e->acts.xn + (B + k) * c->hidden, e->acts.xn + last[k] * c->hidden,
                            (size_t)c->hidden * sizeof(float));
        decoder_logits(m, e->acts.xn, B + n_done, &e->acts, e->logits);
        decoded(e, B);
        for (int k = 0; k < n_done; k++) first_tokens(e, &e->seqs[done[k]], e->logits + (int64_t)(B + k) * c->vocab);
    }
    free(last);
    free(done);
    free(in);
    free(groups);
    drop_started(e);
}

int rollout_engine_step(RolloutEngine *e) {
    int running = 0, decoding = 0;
    e->stats.step_rows = 0;
    for (int s = 0; s < e->n_slots; s++) {
        e->seqs[s].stepped = 0;
        decoding |= e->seqs[s].active && !e->seqs[s].fresh && !e->seqs[s].done;
    }
    if (e->n_pending) {
        double t0 = time_now();
        int chunks = e->chunk > 0 && decoding;
        prefill(e, chunks);
        if (chunks) decode_with_chunks(e);
        tool_turns(e);
        end_finished(e);
        e->stats.prefill_seconds += time_now() - t0;
    }
    for (int s = 0; s < e->n_slots; s++) running += e->seqs[s].active && !e->seqs[s].stepped;
    if (running) {
        double t0 = time_now();
        decode(e);
        tool_turns(e);
        end_finished(e);
        e->stats.decode_seconds += time_now() - t0;
    }
    running = 0;
    for (int s = 0; s < e->n_slots; s++) running += e->seqs[s].active;
    return running;
}

// Sequences per wave: the most whose KV cache (and, in a given workspace, activations) fit.
static int64_t wave_capacity(const Decoder *m, const RolloutConfig *cfg, int64_t n_seqs, int64_t slot_len,
                             int64_t prefill_rows) {
    if (!cfg->workspace)
        return (int64_t)(cfg->kv_budget_bytes / (decoder_kv_bytes_per_token(&m->cfg) * (size_t)slot_len));
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

void rollout_generate(const Decoder *m, const Tokenizer *tok, const RolloutConfig *cfg, const RolloutPrompt *prompts,
                      int n_prompts, int G, RolloutSample *out, RolloutStats *stats, RolloutTokenFn fn, void *user) {
    const DecoderConfig *c = &m->cfg;
    if (cfg->max_turns > 0 && (!cfg->tool_fn || !tok)) die("internal: multi-turn rollout without a tool hook or tokenizer");
    memset(stats, 0, sizeof *stats);
    // One slot length for all: the longest prompt plus its new tokens.
    int64_t slot_len = 1, max_prompt = 1, prompt_tokens = 0;
    for (int i = 0; i < n_prompts; i++) {
        if (prompts[i].n + prompts[i].max_new_tokens > slot_len) slot_len = prompts[i].n + prompts[i].max_new_tokens;
        if (prompts[i].n > max_prompt) max_prompt = prompts[i].n;
        prompt_tokens += prompts[i].n;
    }
    size_t per_token = decoder_kv_bytes_per_token(c);
    int64_t prefill_rows = cfg->prefill_tokens > max_prompt ? cfg->prefill_tokens : max_prompt;
    int64_t fit = wave_capacity(m, cfg, (int64_t)n_prompts * G, slot_len, prefill_rows);
    if (fit < G)
        die("the %s (%zu MB) holds %lld sequences of %lld tokens; one prompt's %d samples need %zu MB of KV cache",
            cfg->workspace ? "rollout workspace" : "KV cache budget",
            (cfg->workspace ? cfg->workspace->size : cfg->kv_budget_bytes) >> 20, (long long)fit, (long long)slot_len, G,
            (per_token * (size_t)slot_len * (size_t)G + (1u << 20) - 1) >> 20);
    int per_wave = (int)(fit / G < n_prompts ? fit / G : n_prompts);
    RolloutEngine *e = rollout_engine_new(m, tok, per_wave * G, slot_len, prefill_rows, cfg->workspace);
    RolloutRequest *req = xcalloc((size_t)per_wave, sizeof *req);
    for (int p0 = 0; p0 < n_prompts; p0 += per_wave) {
        int p1 = p0 + per_wave < n_prompts ? p0 + per_wave : n_prompts;
        e->stats.waves++;
        for (int p = p0; p < p1; p++) {
            req[p - p0] = (RolloutRequest){.cfg = cfg, .prompt = &prompts[p], .index = p, .n = G,
                                           .out = &out[p * G], .fn = fn, .user = user};
            if (rollout_engine_add(e, &req[p - p0]) != 0) die("internal: a wave does not fit its engine");
        }
        while (rollout_engine_step(e) > 0) {
        }
    }
    *stats = e->stats;
    stats->prompt_tokens = prompt_tokens;
    for (int i = 0; i < n_prompts * G; i++) stats->generated_tokens += out[i].n;
    free(req);
    rollout_engine_free(e);
}
