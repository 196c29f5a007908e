#!/usr/bin/python3
"""The architecture table against published checkpoints: the config.json of each model below (as published on
the Hugging Face Hub, kept here as data; Gemma-3-1B's tie_word_embeddings is its config class's default, true) read
by grpo's loader (tests/model/arch_tool.c), its layout's parameter
count equal to the count the Hub publishes for the checkpoint (its safetensors' total) and to the sum over the
tensors transformers' layout has (qwen2_ref.expected_shapes, written from modeling_llama.py / modeling_mistral.py /
modeling_qwen2.py / modeling_gemma3.py), RoPE's frequencies equal to transformers' (modeling_rope_utils.py: default and llama3, in
float64), grpo's own config.json for it read back the same, and `grpo init`'s presets of the same shapes.

usage: /usr/bin/python3 tests/model/arch_test.py --tool PATH_TO_ARCH_TOOL --tmp DIR
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import torch  # noqa: E402
import harness  # noqa: E402
import qwen2_ref as ref  # noqa: E402
from harness import check  # noqa: E402

LLAMA3_ROPE = {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
               "original_max_position_embeddings": 8192, "rope_type": "llama3"}
LLAMA = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
         "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "initializer_range": 0.02,
         "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama", "num_key_value_heads": 8,
         "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "torch_dtype": "bfloat16",
         "use_cache": True, "vocab_size": 128256}
# name: (config.json, the Hub's parameter count, the preset of that shape)
MODELS = {
    "meta-llama/Llama-3.2-1B": (dict(LLAMA, head_dim=64, hidden_size=2048, intermediate_size=8192,
                                     num_attention_heads=32, num_hidden_layers=16, rope_scaling=LLAMA3_ROPE,
                                     tie_word_embeddings=True), 1235814400, "llama-3.2-1b"),
    "meta-llama/Llama-3.2-3B": (dict(LLAMA, head_dim=128, hidden_size=3072, intermediate_size=8192,
                                     num_attention_heads=24, num_hidden_layers=28, rope_scaling=LLAMA3_ROPE,
                                     tie_word_embeddings=True), 3212749824, "llama-3.2-3b"),
    "meta-llama/Llama-3.1-8B": (dict(LLAMA, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                                     num_hidden_layers=32, rope_scaling=dict(LLAMA3_ROPE, factor=8.0),
                                     tie_word_embeddings=False), 8030261248, "llama-3.1-8b"),
    "deepseek-ai/DeepSeek-R1-Distill-Llama-8B": (dict(LLAMA, hidden_size=4096, intermediate_size=14336,
                                                      num_attention_heads=32, num_hidden_layers=32,
                                                      rope_scaling=dict(LLAMA3_ROPE, factor=8.0),
                                                      tie_word_embeddings=False, eos_token_id=128001),
                                                 8030261248, "llama-3.1-8b"),
    "mistralai/Mistral-7B-v0.3": ({"architectures": ["MistralForCausalLM"], "attention_dropout": 0.0,
                                   "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096,
                                   "initializer_range": 0.02, "intermediate_size": 14336,
                                   "max_position_embeddings": 32768, "model_type": "mistral",
                                   "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
                                   "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": None,
                                   "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
                                   "vocab_size": 32768}, 7248023552, "mistral-7b"),
    "Qwen/Qwen2.5-0.5B": ({"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
                           "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
                           "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
                           "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
                           "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
                           "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
                           "use_cache": True, "use_sliding_window": False, "vocab_size": 151936},
                          494032768, "qwen2.5-0.5b"),
    "google/gemma-3-1b-pt": ({"architectures": ["Gemma3ForCausalLM"], "attention_bias": False,
                              "attention_dropout": 0.0, "attn_logit_softcapping": None, "bos_token_id": 2,
                              "cache_implementation": "hybrid", "eos_token_id": 1, "final_logit_softcapping": None,
                              "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152,
                              "initializer_range": 0.02, "intermediate_size": 6912, "max_position_embeddings": 32768,
                              "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26,
                              "num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 256,
                              "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000, "rope_scaling": None,
                              "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
                              "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 262144},
                             999885952, "gemma-3-1b"),
}


def tool(a, *args):
    p = subprocess.run([a.tool, *args], capture_output=True, text=True, timeout=60)
    return p.returncode, (json.loads(p.stdout) if p.returncode == 0 else p.stderr.strip())


def write(d, cfg):
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)


def rel(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b)) if len(a) == len(b) else math.inf


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--tmp", required=True)
    a = ap.parse_args()
    os.makedirs(a.tmp, exist_ok=True)

    def models():
        for name, (cfg, published, preset) in MODELS.items():
            d = os.path.join(a.tmp, name.replace("/", "--"))
            write(d, cfg)
            rc, got = tool(a, d)
            check(f"{name}: the loader reads its config.json as {cfg['architectures'][0]}",
                  rc == 0 and got["architecture"] == cfg["architectures"][0], str(got)[:120])
            if rc:
                continue
            torch_count = sum(math.prod(s) for s in ref.expected_shapes(dict(cfg)).values())
            check(f"{name}: the layout has the Hub's {published:,} parameters (transformers' tensors: "
                  f"{torch_count:,})", got["params"] == published == torch_count, f"{got['params']:,}")
            want = ref.rope_inv_freq(cfg, ref.head_dim(cfg)).tolist()
            check(f"{name}: RoPE's frequencies are transformers' ({(cfg.get('rope_scaling') or {}).get('rope_type', 'default')}"
                  f", head_dim {ref.head_dim(cfg)})", rel(got["inv_freq"], want) < 1e-12,
                  f"max relative {rel(got['inv_freq'], want):.1e}")
            back = os.path.join(d, "written")
            write(back, got["config"])
            rc2, again = tool(a, back)
            check(f"{name}: grpo's config.json for it reads back the same (every key it writes)",
                  rc2 == 0 and again == got, f"{again['params'] if rc2 == 0 else again}")
            same = [k for k, v in got["config"].items() if k in cfg and cfg[k] != v]
            check(f"{name}: grpo writes its keys as the published config.json has them", not same,
                  ", ".join(f"{k}: {got['config'][k]!r} for {cfg[k]!r}" for k in same))
            rc3, pre = tool(a, "--preset", preset)
            check(f"{name}: grpo init --preset {preset} has its shape and RoPE", rc3 == 0 and pre["params"] == published
                  and pre["architecture"] == cfg["architectures"][0] and rel(pre["inv_freq"], want) < 1e-12,
                  f"{pre['params'] if rc3 == 0 else pre}")

    def windowed():
        # Mistral-7B-v0.1: v0.3's config but for a 4k sliding window over the 32k context, rope_theta 1e4 and a
        # 32000-token vocabulary; 7,241,732,096 parameters published (its safetensors' total_size / 2)
        cfg = dict(MODELS["mistralai/Mistral-7B-v0.3"][0], sliding_window=4096, rope_theta=10000.0, vocab_size=32000)
        d = os.path.join(a.tmp, "mistral-v0.1")
        write(d, cfg)
        rc, got = tool(a, d)
        check("Mistral-7B-v0.1: its 4096-key sliding window, and the published parameter count",
              rc == 0 and got["sliding_window"] == 4096 and got["params"] == 7241732096, f"{got}")
        check("Mistral-7B-v0.1: grpo writes sliding_window back", rc == 0 and got["config"]["sliding_window"] == 4096,
              f"{got['config'] if rc == 0 else got}")
        bad = os.path.join(a.tmp, "mistral-bad-window")
        write(bad, dict(cfg, sliding_window=-1))
        rc, err = tool(a, bad)
        check("a negative sliding_window: refused in one line naming it",
              rc == 1 and err.startswith("grpo: error:") and "sliding_window -1" in err and "\n" not in err, err)

    harness.group("published", models)
    harness.group("sliding window", windowed)
    return harness.summary()


if __name__ == "__main__":
    sys.exit(main())
