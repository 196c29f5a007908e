// The built-in demo behind `grpo train` with no arguments: everything generated from a seed, no
// download; about 1.5 minutes on two idle CPU cores, under 3 on one.
//
//   task       sort 4-7 distinct digits: "Sort 3140" -> "0134"; the reward is an exact match.
//   tokenizer  a small byte-level BPE tokenizer.json (256 byte tokens, merges for "Sort", three
//              special tokens) in Qwen2's layout, read by the same loader as Qwen's own.
//   model      a tiny Qwen2 (0.8M parameters), Hugging Face's random initialisation.
//   warm-up    SFT on demonstrations from a careless teacher: in DEMO_CARELESS of its answers it
//              leaves the 0 out ("Sort 3140" -> "134"). Imitating it, the model learns to sort but
//              greedily drops the 0 too, so held-out accuracy is about the share of lists without one.
//   GRPO       the reward only says whether the whole answer is right; the policy finds out that
//              the answers keeping the 0 are the ones rewarded and stops dropping it.
// Accuracy is greedy pass@1 on held-out digit sets: no list with the same digits, in any order,
// is in the SFT or GRPO data, so the answers themselves were never seen in training.
#pragma once
#include <stdint.h>

#include <stdio.h>

#include "base/rng.h"
#include "model/decoder.h"
#include "train/grpo/config.h"

#define DEMO_CARELESS 0.6

typedef struct {
    int len_min, len_max;           // digits per list
    int64_t n_train, n_val, n_sft;  // GRPO prompts, held-out prompts, SFT demonstrations
    double careless;                // share of SFT demonstrations that drop the 0
} DemoTask;

void demo_task_defaults(DemoTask *t);

// DIR/tokenizer.json + DIR/tokenizer_config.json (eos <|endoftext|>, no chat template, so prompts
// are used raw). Returns the number of token ids.
int demo_write_tokenizer(const char *dir);
// The same layout with other words: each of words merged left to right into one token (a word as Qwen2's
// pre-tokenizer cuts it), the special tokens, then `added` as added tokens (matched in text before BPE),
// and a chat_template in tokenizer_config.json (NULL: none). Returns the number of token ids.
typedef struct DemoVocab {
    const char *const *words;
    size_t n_words;
    const char *const *added;
    size_t n_added;
    const char *chat_template;
} DemoVocab;
int demo_write_vocab(const char *dir, const DemoVocab *v);
// The demo model's shape for a tokenizer of n_ids ids (vocab rounded up to a multiple of 64), of the family's
// parts (ARCH_QWEN2, ARCH_QWEN3: q/k norms and no q/k/v biases; ARCH_LLAMA: no biases, Llama 3's RoPE rescaling).
void demo_model_config(DecoderConfig *c, int n_ids, DecoderFamily family);
// A complete model directory: tokenizer files (v's, or NULL: demo_write_tokenizer's), config.json (max_pos
// positions, 0: the demo's 64) and initialised f32 weights.
void demo_write_model(const char *dir, uint64_t seed, DecoderFamily family, const DemoVocab *v, int64_t max_pos);

// "Sort 3140" and its answer "0134" for the n digits d; careless: the teacher's answer ("134").
// buf must hold 32 bytes.
void demo_prompt(char *buf, const int *d, int n);
void demo_answer(char *buf, const int *d, int n, int careless);

// DIR/val.jsonl, DIR/train.jsonl and DIR/sft.jsonl (splits 0, 1, 2), counts[k] lines each: line() writes one
// line of split k to f from r, or returns 0 to be asked again (a draw that split must not have).
typedef int (*DemoLineFn)(void *ctx, int split, Rng *r, FILE *f);
void demo_write_splits(const char *dir, uint64_t seed, const int64_t counts[3], DemoLineFn line, void *ctx);
// DIR/val.jsonl and DIR/train.jsonl {"prompt", "answer"}, DIR/sft.jsonl {"prompt", "completion"}.
// Every val line has its own digit set, and no train or sft line uses one of those sets.
void demo_write_data(const char *dir, uint64_t seed, const DemoTask *t);

// Greedy pass@1 (exact match) of the model in model_dir (with a PEFT LoRA adapter, or NULL) on a
// {"prompt", "answer"} file. tools_file (or NULL): prompts through the chat template listing those tools, one
// tool turn allowed, the model's last turn judged, and *call_rate (may be NULL) the share that called a tool.
double demo_accuracy(const char *model_dir, const char *adapter, const char *data_file, int64_t max_new_tokens,
                     const char *tools_file, double *call_rate);

typedef struct {
    double acc_init, acc_before, acc_after;  // held-out accuracy: random model, after SFT, after GRPO
    double t_setup, t_sft, t_grpo, t_eval, t_total;  // seconds
    int has_calls;                           // the tool-use demo: greedy tool-call rates after SFT and GRPO
    double calls_before, calls_after;
} DemoResult;

// The demos' pieces: the SFT warm-up (AdamW 1e-3, cosine, 64 per step) of init into out; GRPO with the demo's
// settings ov[0..n) and the caller's overrides on top (c: the resolved config, the caller frees it).
void demo_sft(const char *init, const char *data, const char *out, int64_t steps, uint64_t seed);
// A demo's warm-up: the initial model's held-out accuracy, `steps` of SFT on sft_file from a careless teacher
// (its answers `errs` in `careless` of n_sft demonstrations) into sft, then the SFT model's accuracy, each timed
// into R. tools: as demo_accuracy's (R->calls_before then gets the SFT model's tool-call rate).
typedef struct {
    const char *init, *sft_file, *sft, *val_file, *tools, *errs;
    int64_t max_response, steps, n_sft;
    double careless;
    uint64_t seed;
} DemoWarmup;
void demo_warmup(const DemoWarmup *w, DemoResult *R);
void demo_grpo(GrpoConfig *c, char **ov, int n, char **overrides, int n_overrides);
// The demos' common GRPO settings as `grpo train` keys into ov (malloc'd strings; returns how many, at most
// 20): from model `sft` on train/val files, 16 prompts x 8 samples at temperature 1, the exact-match reward,
// no KL, lr 1e-4, `steps` steps validated every val_every, into out_dir.
typedef struct {
    const char *sft, *train_file, *val_file, *out_dir;
    int chat_template, max_prompt, max_response, steps, val_every;
    uint64_t seed;
} DemoGrpo;
int demo_grpo_overrides(char **ov, const DemoGrpo *g);
// demo_grpo with ov (freed here) and the caller's overrides, then the result's held-out greedy accuracy on
// val_file (the SFT base and the adapter when the overrides turned LoRA on) into R (acc_after, t_grpo, t_eval).
void demo_grpo_eval(char **ov, int n, char **overrides, int n_overrides, const char *sft, const char *val_file,
                    int64_t max_new_tokens, DemoResult *R);
// The end of a demo: the summary lines on stderr (held-out accuracy on n_val `what`, the tool calls, the times)
// and DIR/demo_result.json.
void demo_finish(const char *dir, int smoke, int64_t n_val, const char *what, const DemoResult *r);

// The whole demo in DIR, generated from `seed` (created; its subdirectories init/, data/, sft/, grpo/ are overwritten):
// tokenizer + model + data, SFT, held-out accuracy, GRPO, held-out accuracy, and a summary on
// stderr. smoke: the same pipeline shortened to seconds (for tests). family: the model's (demo_model_config).
// overrides: `grpo train` dotted keys applied on top of the demo's
// GRPO settings.
void demo_run(const char *dir, uint64_t seed, int smoke, DecoderFamily family, char **overrides, int n_overrides,
              DemoResult *res);
