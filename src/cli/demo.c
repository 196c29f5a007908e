#include "cli/demo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/rng.h"
#include "base/util.h"
#include "parallel/comm.h"
#include "model/lora.h"
#include "model/vl.h"
#include "rl/reward.h"
#include "rollout/rollout.h"
#include "rollout/tools.h"
#include "text/tokenizer.h"
#include "train/grpo/grpo.h"
#include "train/grpo/config.h"
#include "train/prompt_data.h"
#include "train/sft.h"

// Qwen2's pre-tokenizer pattern: digits split one by one, words keep their leading space.
static const char *QWEN2_SPLIT = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
                                 "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// Words the prompts use; each is merged left to right into one token.
static const char *MERGED_WORDS[] = {"Sort"};
#define N_MERGED_WORDS (sizeof MERGED_WORDS / sizeof *MERGED_WORDS)
static const char *SPECIALS[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
#define N_SPECIALS (sizeof SPECIALS / sizeof *SPECIALS)
#define DEMO_EOS "<|endoftext|>"
#define DEMO_MAX_PROMPT 16    // "Sort" + " " + 7 digits = 9 tokens
#define DEMO_MAX_RESPONSE 10  // 7 digits + eos, with room to spare

void demo_task_defaults(DemoTask *t) {
    *t = (DemoTask){.len_min = 4, .len_max = 7, .n_train = 4000, .n_val = 200, .n_sft = 20000,
                    .careless = DEMO_CARELESS};
}

// ---------------------------------------------------------------------------------------------
// tokenizer and model

// GPT-2's ByteLevel alphabet: the bytes that print as themselves keep their code point, the
// others take U+0100.. in byte order. Ids 0..255 list the printable ones first, as Qwen's vocab does.
static int byte_printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }

static void byte_level_append(Buf *out, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int b = (unsigned char)s[i];
        unsigned cp = (unsigned)b;
        if (!byte_printable(b)) {
            cp = 256;
            for (int x = 0; x < b; x++) cp += !byte_printable(x);
        }
        char ch[2] = {(char)cp, 0};
        if (cp >= 0x80) ch[0] = (char)(0xC0 | cp >> 6), ch[1] = (char)(0x80 | (cp & 0x3F));
        buf_append(out, ch, cp >= 0x80 ? 2 : 1);
    }
}

// Writes "key": id for the ByteLevel spelling of s[0..n).
static void vocab_entry(FILE *f, const char *s, size_t n, int id) {
    Buf b = {0};
    byte_level_append(&b, s, n);
    fprintf(f, "%s", id ? ", " : "");
    json_write_string(f, b.data, b.len);
    fprintf(f, ": %d", id);
    buf_free(&b);
}

int demo_write_tokenizer(const char *dir) {
    DemoVocab v = {MERGED_WORDS, N_MERGED_WORDS, NULL, 0, NULL};
    return demo_write_vocab(dir, &v);
}

int demo_write_vocab(const char *dir, const DemoVocab *v) {
    dir_create(dir);
    int n_merges = 0;
    for (size_t w = 0; w < v->n_words; w++) n_merges += (int)strlen(v->words[w]) - 1;
    int first_special = 256 + n_merges;

    char *path = path_join(dir, "tokenizer.json");
    FILE *f = fopen(path, "w");
    if (!f) die("cannot open %s for writing", path);
    fprintf(f, "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [");
    for (size_t i = 0; i < N_SPECIALS + v->n_added; i++) {  // the special tokens, then the added ones
        const char *content = i < N_SPECIALS ? SPECIALS[i] : v->added[i - N_SPECIALS];
        fprintf(f, "%s\n    {\"id\": %d, \"content\": ", i ? "," : "", first_special + (int)i);
        json_write_string(f, content, strlen(content));
        fprintf(f, ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, "
                "\"special\": %s}", i < N_SPECIALS ? "true" : "false");
    }
    fprintf(f, "\n  ],\n  \"normalizer\": {\"type\": \"NFC\"},\n  \"pre_tokenizer\": {\"type\": \"Sequence\", "
            "\"pretokenizers\": [\n    {\"type\": \"Split\", \"pattern\": {\"Regex\": ");
    json_write_string(f, QWEN2_SPLIT, strlen(QWEN2_SPLIT));
    fprintf(f, "}, \"behavior\": \"Isolated\", \"invert\": false},\n"
            "    {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": false, "
            "\"use_regex\": false}]},\n"
            "  \"post_processor\": null,\n"
            "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": false, "
            "\"use_regex\": false},\n"
            "  \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, "
            "\"continuing_subword_prefix\": \"\", \"end_of_word_suffix\": \"\", \"fuse_unk\": false, "
            "\"byte_fallback\": false, \"ignore_merges\": false,\n"
            "    \"vocab\": {");
    int id = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int b = 0; b < 256; b++) {
            char byte = (char)b;
            if (byte_printable(b) == (pass == 0)) vocab_entry(f, &byte, 1, id++);
        }
    // Then each word's prefixes of two or more bytes: merge k joins prefix k+1 with the next byte.
    for (size_t w = 0; w < v->n_words; w++)
        for (size_t k = 2; k <= strlen(v->words[w]); k++) vocab_entry(f, v->words[w], k, id++);
    fprintf(f, "},\n    \"merges\": [");
    int m = 0;
    for (size_t w = 0; w < v->n_words; w++)
        for (size_t k = 2; k <= strlen(v->words[w]); k++) {
            Buf left = {0}, right = {0};
            byte_level_append(&left, v->words[w], k - 1);
            byte_level_append(&right, v->words[w] + k - 1, 1);
            fprintf(f, "%s[", m++ ? ", " : "");
            json_write_string(f, left.data, left.len);
            fprintf(f, ", ");
            json_write_string(f, right.data, right.len);
            fprintf(f, "]");
            buf_free(&left);
            buf_free(&right);
        }
    fprintf(f, "]\n  }\n}\n");
    if (fclose(f) != 0) die("cannot write %s", path);
    free(path);

    path = path_join(dir, "tokenizer_config.json");
    if (!(f = fopen(path, "w"))) die("cannot open %s for writing", path);
    fprintf(f, "{\n  \"eos_token\": \"%s\",\n  \"pad_token\": \"%s\",\n  \"model_max_length\": 64,\n"
            "  \"tokenizer_class\": \"Qwen2Tokenizer\"", DEMO_EOS, DEMO_EOS);
    if (v->chat_template) {
        fprintf(f, ",\n  \"chat_template\": ");
        json_write_string(f, v->chat_template, strlen(v->chat_template));
    }
    fprintf(f, "\n}\n");
    if (fclose(f) != 0) die("cannot write %s", path);
    free(path);
    return first_special + (int)(N_SPECIALS + v->n_added);
}

void demo_model_config(DecoderConfig *c, int n_ids, DecoderFamily family) {
    *c = (DecoderConfig){.vocab = (n_ids + 63) / 64 * 64, .hidden = 128, .inter = 384, .layers = 4, .heads = 4,
                       .kv_heads = 2, .head_dim = 32, .max_pos = 64, .rope = {.theta = 10000.0}, .eps = 1e-6f,
                         .tied = 1, .bos_id = -1, .eos_id = -1, .init_std = 0.02};
    decoder_config_family(c, family);
    if (family == ARCH_LLAMA)  // Llama 3's rescaling, of a 16-token original context: all three bands of D = 32
        c->rope = (RopeFreqs){10000.0, ROPE_LLAMA3, 8.0, 1.0, 4.0, 16};
}

void demo_write_model(const char *dir, uint64_t seed, DecoderFamily family, const DemoVocab *v, int64_t max_pos) {
    int n_ids = v ? demo_write_vocab(dir, v) : demo_write_tokenizer(dir);
    Tokenizer tok;
    tokenizer_load(&tok, dir);
    DecoderConfig c;
    demo_model_config(&c, n_ids, family);
    if (max_pos) c.max_pos = max_pos;
    c.bos_id = c.eos_id = tok.eos_id;  // generation stops at config.json's eos_token_id
    tokenizer_free(&tok);
    Decoder m;
    decoder_build(&m, &c, DTYPE_F32);
    decoder_init_random(&m, seed);
    decoder_save(&m, dir, DTYPE_F32, NULL);
    decoder_free(&m);
}

// ---------------------------------------------------------------------------------------------
// data

void demo_prompt(char *buf, const int *d, int n) {
    int k = snprintf(buf, 32, "Sort ");
    for (int i = 0; i < n && k < 31; i++) buf[k++] = (char)('0' + d[i]);
    buf[k] = '\0';
}

void demo_answer(char *buf, const int *d, int n, int careless) {
    int k = 0;
    for (int digit = 0; digit < 10; digit++)
        for (int i = 0; i < n && k < 31; i++)
            if (d[i] == digit && !(careless && digit == 0)) buf[k++] = (char)('0' + digit);
    buf[k] = '\0';
}

// n distinct digits in random order (a partial Fisher-Yates shuffle); returns their set as a bitmask.
static unsigned draw_list(Rng *r, const DemoTask *t, int *d, int *n) {
    int all[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    *n = t->len_min + (int)(rng_next_u64(r) % (uint64_t)(t->len_max - t->len_min + 1));
    unsigned set = 0;
    for (int i = 0; i < *n; i++) {
        int j = i + (int)(rng_next_u64(r) % (uint64_t)(10 - i)), x = all[j];
        all[j] = all[i], all[i] = x;
        d[i] = x, set |= 1u << x;
    }
    return set;
}

static void write_pair(FILE *f, const char *k1, const char *v1, const char *k2, const char *v2) {
    fprintf(f, "{\"%s\": ", k1);
    json_write_string(f, v1, strlen(v1));
    fprintf(f, ", \"%s\": ", k2);
    json_write_string(f, v2, strlen(v2));
    fprintf(f, "}\n");
}

void demo_write_splits(const char *dir, uint64_t seed, const int64_t counts[3], DemoLineFn line, void *ctx) {
    dir_create(dir);
    Rng r;
    rng_init(&r, seed);
    const char *names[3] = {"val.jsonl", "train.jsonl", "sft.jsonl"};
    for (int k = 0; k < 3; k++) {
        char *path = path_join(dir, names[k]);
        FILE *f = fopen(path, "w");
        if (!f) die("cannot open %s for writing", path);
        for (int64_t i = 0; i < counts[k];) i += line(ctx, k, &r, f);
        if (fclose(f) != 0) die("cannot write %s", path);
        free(path);
    }
}

typedef struct {
    const DemoTask *t;
    unsigned char held[1024];  // digit sets (bitmasks) reserved for validation
} SortData;

static int sort_line(void *ctx, int split, Rng *r, FILE *f) {
    SortData *sd = ctx;
    int d[10], n;
    unsigned set = draw_list(r, sd->t, d, &n);
    if (sd->held[set]) return 0;  // val: one line per set; train, sft: never a held-out set
    if (split == 0) sd->held[set] = 1;
    char prompt[32], answer[32];
    demo_prompt(prompt, d, n);
    demo_answer(answer, d, n, split == 2 && rng_next_float(r) < sd->t->careless);
    write_pair(f, "prompt", prompt, split == 2 ? "completion" : "answer", answer);
    return 1;
}

void demo_write_data(const char *dir, uint64_t seed, const DemoTask *t) {
    if (t->len_min < 1 || t->len_max > 10 || t->len_min > t->len_max) die("demo: list lengths must be within 1..10");
    int64_t n_sets = 0;  // digit sets of an allowed size: sum of C(10, k)
    for (int k = t->len_min; k <= t->len_max; k++) {
        int64_t c = 1;
        for (int i = 0; i < k; i++) c = c * (10 - i) / (i + 1);
        n_sets += c;
    }
    if (t->n_val >= n_sets)
        die("demo: %lld held-out sets leave none of the %lld for training", (long long)t->n_val, (long long)n_sets);
    SortData sd = {t, {0}};
    demo_write_splits(dir, seed, (int64_t[3]){t->n_val, t->n_train, t->n_sft}, sort_line, &sd);
}

// ---------------------------------------------------------------------------------------------
// evaluation and the whole run

double demo_accuracy(const char *model_dir, const char *adapter, const char *data_file, int64_t max_new_tokens,
                     const char *tools_file, double *call_rate) {
    Decoder m;
    decoder_load_vl(&m, model_dir, DTYPE_F32);  // the VL demo's model too
    VlModel vm;
    if (m.cfg.vl) vl_model_load(&vm, model_dir, &m.cfg);
    Lora lora = {0};
    if (adapter) {
        lora_load(&lora, &m.cfg, adapter);
        lora_attach(&m, &lora);
    }
    Tokenizer tok;
    tokenizer_load(&tok, model_dir);
    ToolSet ts = {0};
    if (tools_file) toolset_load(&ts, tools_file, "the demo's tools", 4, 10.0, 0);
    PromptData d;
    PromptDataOptions po = {.prompt_key = "prompt", .answer_key = "answer", .tok = &tok, .chat_template = tools_file != NULL,
                            .tools = tools_file ? ts.schemas : NULL, .max_prompt_length = m.cfg.max_pos,
                            .image_key = "images"};
    if (m.cfg.vl) po.vl = &vm.proc, po.image_pad = (int32_t)m.cfg.image_pad_id;
    prompt_data_load(&d, &data_file, 1, "the demo's data", &po);
    RolloutPrompt *p = xcalloc((size_t)d.n, sizeof *p);
    float **feats = xcalloc((size_t)d.n, sizeof *feats);
    DecoderVlInputs *in = xcalloc((size_t)d.n, sizeof *in);
    int64_t longest = 1;
    for (int64_t i = 0; i < d.n; i++) {
        const PromptSample *x = &d.s[i];
        p[i] = (RolloutPrompt){.ids = x->ids, .n = x->len, .max_new_tokens = (int)max_new_tokens};
        longest = x->len > longest ? x->len : longest;
        if (!m.cfg.vl || !x->n_images) continue;
        feats[i] = vl_prompt_features(&vm, x->images, x->n_images, data_file);
        p[i].vl = vl_prompt_inputs(&m, x->ids, x->len, x->images, x->n_images, feats[i], vm.proc.merge, &in[i]);
    }
    int32_t stop = tok.eos_id;
    ToolHook hook = {.tools = &ts, .tok = &tok};
    RolloutConfig rc = {.sampler = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f}, .stop_ids = &stop,
                        .n_stop_ids = stop >= 0, .share_prefill = 1, .prefill_tokens = 2048};
    if (tools_file) rc.max_turns = 1, rc.tool_fn = tools_rollout_turns, rc.tool_user = &hook;
    rc.kv_budget_bytes = decoder_kv_bytes_per_token(&m.cfg) * (size_t)(longest + max_new_tokens) * (size_t)d.n;
    RolloutSample *out = xcalloc((size_t)d.n, sizeof *out);
    RolloutStats st;
    rollout_generate(&m, &tok, &rc, p, (int)d.n, 1, out, &st, NULL, NULL);
    int64_t correct = 0, called = 0;
    for (int64_t i = 0; i < d.n; i++) {
        char *text = rollout_sample_final_text(&out[i]);  // the model's last turn (all of it without tools)
        correct += reward_exact_match(text, d.s[i].answer);
        called += out[i].turns > 0;
        free(text);
        rollout_sample_free(&out[i]);
    }
    if (call_rate) *call_rate = (double)called / (double)d.n;
    double acc = (double)correct / (double)d.n;
    for (int64_t i = 0; i < d.n; i++) {
        decoder_vl_inputs_free(&in[i]);
        free(feats[i]);
    }
    free(in);
    free(feats);
    if (m.cfg.vl) vl_model_free(&vm);
    free(out);
    free(p);
    prompt_data_free(&d);
    if (tools_file) toolset_free(&ts);
    tokenizer_free(&tok);
    decoder_free(&m);
    lora_free(&lora);
    return acc;
}

void demo_sft(const char *init, const char *data, const char *out, int64_t steps, uint64_t seed) {
    SftConfig sc = {.model_dir = init, .data_path = data, .out_dir = out, .steps = steps, .batch_size = 64,
                    .micro_batch_size = 64, .warmup = 20, .keep = 1, .max_length = 0, .max_skips = 5,
                    .adam = {1e-3, 0.9, 0.999, 1e-8, 0.0}, .clip = 1.0, .schedule = LR_COSINE, .seed = seed,
                    .save_dtype = DTYPE_F32, .precision = DTYPE_F32, .loss_scale = 1024.0, .loss_scale_window = 1000,
                    .shuffle = 1, .force = 1};
    sft_run(&sc);
}

void demo_grpo(GrpoConfig *c, char **ov, int n, char **overrides, int n_overrides) {
    grpo_config_defaults(c);
    grpo_config_load(c, NULL, ov, n);
    if (n_overrides > 0) grpo_config_load(c, NULL, overrides, n_overrides);
    GrpoSettings s;
    grpo_settings_resolve(&s, c);
    grpo_run(&s);
}

int demo_grpo_overrides(char **ov, const DemoGrpo *g) {
    int n = 0;
#define OV(...) ov[n++] = xprintf(__VA_ARGS__)
    OV("model.path=%s", g->sft);
    OV("data.train_file=%s", g->train_file);
    OV("data.val_file=%s", g->val_file);
    OV("data.chat_template=%s", g->chat_template ? "true" : "false");
    OV("data.max_prompt_length=%d", g->max_prompt);
    OV("data.max_response_length=%d", g->max_response);
    OV("data.train_batch_size=16");
    OV("rollout.n=8");
    OV("rollout.temperature=1.0");
    OV("reward.gsm8k.weight=0");
    OV("reward.exact.weight=1");
    OV("actor.use_kl_loss=false");  // beta = 0: no reference model is kept or scored
    OV("actor.lr=1e-4");
    OV("trainer.steps=%d", g->steps);
    OV("trainer.val_every=%d", g->val_every);
    OV("trainer.val_before_train=false");  // the demos measure it themselves
    OV("trainer.seed=%llu", (unsigned long long)g->seed);
    OV("trainer.out_dir=%s", g->out_dir);
    OV("trainer.overwrite=true");  // a demo makes its run directory anew each time
#undef OV
    return n;
}

void demo_grpo_eval(char **ov, int n, char **overrides, int n_overrides, const char *sft, const char *val_file,
                    int64_t max_new_tokens, DemoResult *R) {
    GrpoConfig c;
    double t = time_now();
    demo_grpo(&c, ov, n, overrides, n_overrides);
    R->t_grpo = time_now() - t;
    t = time_now();
    GrpoSettings s;
    grpo_settings_resolve(&s, &c);
    const char *model = grpo_has_lora(&s) ? sft : c.trainer.out_dir;  // LoRA: the base and the adapter
    const char *adapter = grpo_has_lora(&s) ? c.trainer.out_dir : NULL;
    R->acc_after = demo_accuracy(model, adapter, val_file, max_new_tokens, NULL, NULL);
    R->t_eval += time_now() - t;
    grpo_config_free(&c);
    for (int i = 0; i < n; i++) free(ov[i]);
}

void demo_finish(const char *dir, int smoke, int64_t n_val, const char *what, const DemoResult *r) {
    if (r->has_calls)
        fprintf(stderr, "grpo demo: tool calls (greedy, held out): after SFT %.1f%%, after GRPO %.1f%%\n",
                100.0 * r->calls_before, 100.0 * r->calls_after);
    fprintf(stderr, "grpo demo: held-out accuracy (greedy, %lld %s never trained on): random init %.1f%%, "
            "after SFT %.1f%%, after GRPO %.1f%% (%+.1f points)\n", (long long)n_val, what, 100.0 * r->acc_init,
            100.0 * r->acc_before, 100.0 * r->acc_after, 100.0 * (r->acc_after - r->acc_before));
    fprintf(stderr, "grpo demo: time: setup %.1f s, SFT %.1f s, GRPO %.1f s, evaluation %.1f s, total %.1f s\n",
            r->t_setup, r->t_sft, r->t_grpo, r->t_eval, r->t_total);
    char *rp = path_join(dir, "demo_result.json");
    FILE *f = fopen(rp, "w");
    if (!f) die("cannot open %s for writing", rp);
    fprintf(f, "{\"smoke\": %s, \"n_val\": %lld, \"accuracy_init\": %.6f, \"accuracy_before_grpo\": %.6f, "
            "\"accuracy_after_grpo\": %.6f, ", smoke ? "true" : "false", (long long)n_val, r->acc_init,
            r->acc_before, r->acc_after);
    if (r->has_calls)
        fprintf(f, "\"tool_calls_before_grpo\": %.6f, \"tool_calls_after_grpo\": %.6f, ", r->calls_before,
                r->calls_after);
    fprintf(f, "\"time_setup_s\": %.3f, \"time_sft_s\": %.3f, \"time_grpo_s\": %.3f, \"time_eval_s\": %.3f, "
            "\"time_total_s\": %.3f}\n", r->t_setup, r->t_sft, r->t_grpo, r->t_eval, r->t_total);
    if (fclose(f) != 0) die("cannot write %s", rp);
    free(rp);
}

void demo_warmup(const DemoWarmup *w, DemoResult *R) {
    double t = time_now(), calls;
    R->acc_init = demo_accuracy(w->init, NULL, w->val_file, w->max_response, w->tools, &calls);
    R->t_eval += time_now() - t;
    fprintf(stderr, "grpo demo: SFT warm-up on %lld demonstrations from a careless teacher (%.0f%% of its answers "
            "%s)\n", (long long)w->n_sft, 100.0 * w->careless, w->errs);
    t = time_now();
    demo_sft(w->init, w->sft_file, w->sft, w->steps, w->seed);
    R->t_sft = time_now() - t;
    t = time_now();
    R->has_calls = w->tools != NULL;
    R->acc_before = demo_accuracy(w->sft, NULL, w->val_file, w->max_response, w->tools, &R->calls_before);
    R->t_eval += time_now() - t;
    fprintf(stderr, "grpo demo: held-out accuracy after SFT: %.1f%%", 100.0 * R->acc_before);
    if (w->tools) fprintf(stderr, " (greedy calls the tool in %.1f%%)", 100.0 * R->calls_before);
    fprintf(stderr, "; now GRPO\n");
}

void demo_run(const char *dir, uint64_t seed, int smoke, DecoderFamily family, char **overrides, int n_overrides,
              DemoResult *res) {
    // Its ranks would write the same files, and SFT then GRPO would initialise MPI twice.
    if (comm_launched()) die("the built-in demo runs in one process: start it without mpirun");
    DemoResult R = {0};
    double t0 = time_now();
    DemoTask task;
    demo_task_defaults(&task);
    char *init = path_join(dir, "init"), *data = path_join(dir, "data"), *sft = path_join(dir, "sft");
    char *grpo = path_join(dir, "grpo"), *sft_file = path_join(data, "sft.jsonl");
    char *train_file = path_join(data, "train.jsonl"), *val_file = path_join(data, "val.jsonl");
    fprintf(stderr, "grpo demo: sort 4-7 distinct digits (\"Sort 3140\" -> \"0134\"), reward = exact match; "
            "a tiny %s and a byte-level BPE tokenizer generated in %s\n",
            family == ARCH_QWEN3 ? "Qwen3" : family == ARCH_LLAMA ? "Llama" : "Qwen2", dir);
    demo_write_model(init, seed, family, NULL, 0);
    demo_write_data(data, seed, &task);
    R.t_setup = time_now() - t0;

    DemoWarmup w = {.init = init, .sft_file = sft_file, .sft = sft, .val_file = val_file, .errs = "drop the 0",
                    .max_response = DEMO_MAX_RESPONSE, .steps = smoke ? 300 : 400, .n_sft = task.n_sft,
                    .careless = task.careless, .seed = seed};
    demo_warmup(&w, &R);

    // The demo's GRPO settings, as `grpo train` keys; the caller's overrides go on top.
    char *ov[24];
    DemoGrpo g = {.sft = sft, .train_file = train_file, .val_file = val_file, .out_dir = grpo,
                  .max_prompt = DEMO_MAX_PROMPT, .max_response = DEMO_MAX_RESPONSE, .steps = smoke ? 40 : 200,
                  .val_every = smoke ? 20 : 40, .seed = seed};
    int n = demo_grpo_overrides(ov, &g);
    demo_grpo_eval(ov, n, overrides, n_overrides, sft, val_file, DEMO_MAX_RESPONSE, &R);
    R.t_total = time_now() - t0;
    demo_finish(dir, smoke, task.n_val, "digit sets", &R);
    free(init), free(data), free(sft), free(grpo), free(sft_file), free(train_file), free(val_file);
    if (res) *res = R;
}
