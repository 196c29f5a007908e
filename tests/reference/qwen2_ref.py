#!/usr/bin/python3
"""Independent reference Qwen2 (Qwen2ForCausalLM) in plain torch ops.

Used to check grpo.c numerically: it has its own safetensors reader/writer,
a HF-style model-directory loader, a random tiny-model generator and a
scorer that returns per-token log-probabilities.  Only torch + numpy.
Optional LoRA (PEFT's lora.Linear: y = x W^T + b + (alpha/r) (x A^T) B^T on the targeted projections;
adapter dirs in PEFT's adapter_config.json + adapter_model.safetensors form): see "LoRA" below.

CLI:
  qwen2_ref.py make-model --out DIR --seed S --hidden C --layers L --heads H
        --kv-heads KVH --intermediate I --vocab V [--tied] [--dtype f32|bf16|f16]
        [--shards N] [--rope-theta X] [--eps X] [--max-pos N]
  qwen2_ref.py score --model DIR [--dtype float64|float32] [--adapter LORA_DIR]
        stdin: JSONL {"tokens": [...]}   stdout: JSONL {"logprobs": [...]}
  qwen2_ref.py self-check
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

# safetensors dtype tag <-> torch dtype
ST_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
ST_TAGS = {v: k for k, v in ST_DTYPES.items()}
SHORT_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
HF_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


# ----------------------------------------------------------------- safetensors

def byte_unicode():
    """GPT-2's (and Qwen's) byte-level BPE alphabet: byte -> the character that stands for it."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def save_safetensors(path, tensors, metadata=None):
    """Write {name: tensor} in the safetensors layout (tensors kept in their own dtype)."""
    header, blobs, off = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        # viewing as uint8 gives the raw little-endian bytes for every dtype,
        # including bf16 which numpy cannot represent.
        b = t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": ST_TAGS[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)  # pad so the data buffer starts 8-aligned
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    """Read a safetensors file -> {name: tensor in stored dtype}. Validates layout strictly
    (sizes, bounds, contiguous coverage) so that a broken writer is caught."""
    size = os.path.getsize(path)
    out = {}
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n + 8 > size:
            raise ValueError(f"{path}: header length {n} exceeds file size {size}")
        header = json.loads(f.read(n).decode("utf-8"))
        data_start, data_len = 8 + n, size - 8 - n
        spans = []
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dt = ST_DTYPES.get(info["dtype"])
            if dt is None:
                raise ValueError(f"{path}: {name}: unsupported dtype {info['dtype']}")
            shape = [int(s) for s in info["shape"]]
            b, e = info["data_offsets"]
            numel = math.prod(shape)
            if e - b != numel * torch.empty(0, dtype=dt).element_size() or not 0 <= b <= e <= data_len:
                raise ValueError(f"{path}: {name}: bad data_offsets {b, e} for {info['dtype']}{shape}")
            spans.append((b, e))
            if numel == 0:
                out[name] = torch.empty(shape, dtype=dt)
                continue
            # one bytearray per tensor: writable (no torch warning) and malloc-aligned
            buf = bytearray(e - b)
            f.seek(data_start + b)
            if f.readinto(buf) != e - b:
                raise ValueError(f"{path}: {name}: short read")
            out[name] = torch.frombuffer(buf, dtype=dt).reshape(shape)
        spans.sort()
        pos = 0
        for b, e in spans:  # the format requires a gap-free, non-overlapping buffer
            if b != pos:
                raise ValueError(f"{path}: data buffer not contiguous at offset {pos} (next tensor at {b})")
            pos = e
        if pos != data_len:
            raise ValueError(f"{path}: data buffer is {data_len} bytes but tensors cover {pos}")
    return out


def load_weights(model_dir):
    """All tensors of a HF model dir, single file or index + shards."""
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(single):
        return load_safetensors(single)
    with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
        wmap = json.load(f)["weight_map"]
    out = {}
    for shard in sorted(set(wmap.values())):
        for name, t in load_safetensors(os.path.join(model_dir, shard)).items():
            if wmap.get(name) != shard:
                raise ValueError(f"{shard}: tensor {name} not mapped to this shard in index")
            out[name] = t
    missing = set(wmap) - set(out)
    if missing:
        raise ValueError(f"index lists tensors missing from shards: {sorted(missing)[:5]}")
    return out


# ----------------------------------------------------------------- model files

def is_qwen3(cfg):
    return cfg.get("model_type") == "qwen3"


def is_gemma(cfg):
    """Gemma 3's text model (modeling_gemma3.py, Gemma3ForCausalLM): RMSNorms scaling by (1 + w), embeddings times
    sqrt(hidden), q/k norms, the attention's and the MLP's outputs normed before their residual adds, a GELU-tanh
    gated MLP, local (sliding-window, own RoPE base) and global layers, scores scaled by query_pre_attn_scalar."""
    return cfg.get("model_type") == "gemma3_text"


def is_reward_model(cfg):
    """Qwen2ForSequenceClassification / Qwen3ForSequenceClassification: a score head where lm_head would be."""
    return any(a.endswith("ForSequenceClassification") for a in cfg.get("architectures", []))


def num_labels(cfg):
    """transformers' num_labels: the size of id2label (PretrainedConfig's default: 2)."""
    return len(cfg["id2label"]) if cfg.get("id2label") else cfg.get("num_labels", 2)


QWEN2_TYPES = ("qwen2", "qwen2_vl", "qwen2_5_vl")


def head_dim(cfg):
    """Qwen3, Llama and Mistral state head_dim (transformers: getattr(config, "head_dim", None) or
    hidden_size // num_attention_heads); Qwen2's is hidden_size / num_attention_heads."""
    if cfg.get("model_type") not in QWEN2_TYPES:
        return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return cfg["hidden_size"] // cfg["num_attention_heads"]


def sliding_window(cfg):
    """Mistral's sliding_window (modeling_mistral.py: every layer's mask keeps key j for query i when
    i - j < sliding_window, masking_utils.sliding_window_overlay); 0 for full attention (null, or a family whose
    key means nothing without use_sliding_window)."""
    return (cfg.get("sliding_window") or 0) if cfg.get("model_type") == "mistral" else 0


def layer_slides(cfg, li):
    """Whether layer li attends through a sliding window: Gemma's local layers (layer_types, or all but every
    sliding_window_pattern-th), Mistral's every layer when sliding_window is set."""
    if is_gemma(cfg):
        if cfg.get("layer_types"):
            return cfg["layer_types"][li] == "sliding_attention"
        return (li + 1) % cfg.get("sliding_window_pattern", 6) != 0
    return bool(sliding_window(cfg))


def layer_window(cfg, li):
    return (cfg.get("sliding_window") or 0) if layer_slides(cfg, li) else 0


def layer_inv_freq(cfg, li, D):
    """Layer li's RoPE frequencies: Gemma's local layers use rope_local_base_freq without rescaling."""
    if is_gemma(cfg) and layer_slides(cfg, li):
        return rope_inv_freq({"rope_theta": cfg.get("rope_local_base_freq", 10000.0)}, D)
    return rope_inv_freq(cfg, D)


def attn_scale(cfg, D):
    return cfg.get("query_pre_attn_scalar", 256) ** -0.5 if is_gemma(cfg) else 1.0 / math.sqrt(D)


def embed_scale(cfg, bf16=False):
    """Gemma3TextScaledWordEmbedding's sqrt(hidden): a float32 tensor cast to the weights' dtype (bf16: rounded)."""
    if not is_gemma(cfg):
        return 1.0
    s = torch.tensor(cfg["hidden_size"] ** 0.5, dtype=torch.float32)
    return float(s.to(torch.bfloat16) if bf16 else s)


def causal_mask(T, window):
    """(T, T) bool, True where query i may not see key j: the future, and with a window keys i - j >= window."""
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    if window:
        mask |= torch.ones(T, T, dtype=torch.bool).tril(-window)
    return mask


def has_bias(cfg):
    """Qwen2's q/k/v projections have biases; Qwen3's, Llama's and Mistral's only with attention_bias."""
    return cfg.get("model_type") in QWEN2_TYPES or cfg.get("attention_bias", False)


def rope_inv_freq(cfg, D):
    """transformers' inv_freq (modeling_rope_utils.py: _compute_default_rope_parameters, the linear and the
    llama3 ones), in float64: rope_scaling (transformers 4) or rope_parameters (5)."""
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    theta = rs.get("rope_theta", cfg.get("rope_theta", 10000.0))
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "linear":
        return inv / rs["factor"]
    if kind != "llama3":
        assert kind in ("default", "mrope"), kind
        return inv
    factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / lo, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / hi) * ~(wavelen > old / lo)
    return torch.where(medium, smoothed, scaled)


def tied(cfg):
    """tie_word_embeddings, or its config class's default: true for Gemma 3, false for the rest."""
    return cfg.get("tie_word_embeddings", is_gemma(cfg))


def expected_shapes(cfg):
    C, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    H, KVH = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = head_dim(cfg)
    s = {"model.embed_tokens.weight": (V, C)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        s[p + "input_layernorm.weight"] = (C,)
        for n, rows in (("q", H * D), ("k", KVH * D), ("v", KVH * D)):
            s[p + f"self_attn.{n}_proj.weight"] = (rows, C)
            if has_bias(cfg):
                s[p + f"self_attn.{n}_proj.bias"] = (rows,)
        s[p + "self_attn.o_proj.weight"] = (C, H * D)
        if is_qwen3(cfg) or is_gemma(cfg):  # RMSNorm over each head's query and key
            s[p + "self_attn.q_norm.weight"] = (D,)
            s[p + "self_attn.k_norm.weight"] = (D,)
        s.update({
            p + "post_attention_layernorm.weight": (C,),
            p + "mlp.gate_proj.weight": (I, C), p + "mlp.up_proj.weight": (I, C),
            p + "mlp.down_proj.weight": (C, I),
        })
        if is_gemma(cfg):
            s[p + "pre_feedforward_layernorm.weight"] = (C,)
            s[p + "post_feedforward_layernorm.weight"] = (C,)
    s["model.norm.weight"] = (C,)
    if is_reward_model(cfg):
        s["score.weight"] = (num_labels(cfg), C)
    elif not tied(cfg):
        s["lm_head.weight"] = (V, C)
    return s


def make_model(out_dir, seed, hidden, layers, heads, kv_heads, intermediate, vocab, tied,
               dtype="f32", shards=1, rope_theta=10000.0, eps=1e-6, max_pos=512, arch="qwen2", head_dim=None,
               rope_scaling=None, sliding_window=None, pattern=None, query_scalar=None):
    """Write a random Qwen2 (arch "qwen2"), Qwen3 ("qwen3"), Llama ("llama") or Mistral ("mistral") model dir
    (all but Qwen2: head_dim its own, default hidden/heads; rope_scaling: Llama's, e.g. llama3's;
    sliding_window: Mistral's, None for null; Gemma 3 ("gemma3"): sliding_window and pattern (every pattern-th
    layer global), query_scalar; its norm weights near 0, as its (1 + w) norms start); returns
    {name: tensor as stored} for round-trip checks."""
    D = head_dim or hidden // heads
    assert heads % kv_heads == 0 and D % 2 == 0 and (arch != "qwen2" or D * heads == hidden)
    sdt = SHORT_DTYPES[dtype]
    names = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM",
             "mistral": "MistralForCausalLM", "gemma3": "Gemma3ForCausalLM"}
    cfg = {
        "architectures": [names[arch]], "model_type": "gemma3_text" if arch == "gemma3" else arch,
        "hidden_act": "silu",
        "hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "rms_norm_eps": eps,
        "rope_theta": rope_theta, "vocab_size": vocab, "tie_word_embeddings": bool(tied),
        "max_position_embeddings": max_pos, "torch_dtype": HF_DTYPE_NAMES[sdt],
        "use_sliding_window": False, "sliding_window": max_pos, "max_window_layers": layers,
        "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
        "bos_token_id": vocab - 1, "eos_token_id": vocab - 1,
    }
    if arch != "qwen2":
        cfg.update({"head_dim": D, "attention_bias": False})
        del cfg["use_sliding_window"], cfg["max_window_layers"]
    if arch == "llama":
        cfg.update({"mlp_bias": False, "rope_scaling": rope_scaling})
        del cfg["sliding_window"]
    if arch == "mistral":
        cfg["sliding_window"] = sliding_window
    if arch == "gemma3":
        del cfg["hidden_act"]
        cfg.update({"hidden_activation": "gelu_pytorch_tanh", "sliding_window": sliding_window,
                    "sliding_window_pattern": pattern, "rope_local_base_freq": 10000.0,
                    "query_pre_attn_scalar": query_scalar, "final_logit_softcapping": None,
                    "attn_logit_softcapping": None, "rope_scaling": rope_scaling,
                    "bos_token_id": 2, "eos_token_id": 1})
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in expected_shapes(cfg).items():
        if name.endswith("norm.weight"):
            t = (0 if arch == "gemma3" else 1) + 0.1 * torch.randn(shape, generator=g)  # non-trivial gains
        elif name.endswith(".bias"):
            t = 0.1 * torch.randn(shape, generator=g)           # non-zero so bias bugs show
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            # logits = normed(x) . row, so std 2/sqrt(C) gives logits of std ~2:
            # peaked enough to matter, far from one-hot.
            t = (2 / math.sqrt(hidden)) * torch.randn(shape, generator=g)
        else:
            # q/k get gain 1 so attention is visibly non-uniform (RoPE/mask bugs show);
            # the rest 0.5 keeps the residual stream O(1) across layers.
            gain = 1.0 if ("q_proj" in name or "k_proj" in name) else 0.5
            t = (gain / math.sqrt(shape[1])) * torch.randn(shape, generator=g)
        tensors[name] = t.to(sdt)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    meta = {"format": "pt"}
    if shards == 1:
        save_safetensors(os.path.join(out_dir, "model.safetensors"), tensors, meta)
    else:
        names = list(tensors)
        assert len(names) >= shards
        files = [f"model-{k + 1:05d}-of-{shards:05d}.safetensors" for k in range(shards)]
        # round-robin: tensors of one layer land in different files, which is
        # harder on a loader than HF's contiguous split.
        wmap = {n: files[i % shards] for i, n in enumerate(names)}
        for fn in files:
            save_safetensors(os.path.join(out_dir, fn), {n: tensors[n] for n in names if wmap[n] == fn}, meta)
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f, indent=2)
    return tensors


class Model:
    pass


def _dtype(d):
    return {"float64": torch.float64, "float32": torch.float32}.get(d, d)


def load_model(model_dir, compute_dtype=torch.float64, bf16=False, adapter=None, q8=False):
    """Load config + weights, converting all weights to compute_dtype. bf16: a bf16 model as grpo.c's
    `--dtype bf16` computes it: weights rounded to bf16, every projection's operands too (see linear).
    adapter: a PEFT LoRA dir applied on top (its A, B in compute_dtype, never rounded; see attach_lora).
    q8: grpo.c's `--dtype int8` (implies bf16): every projection and lm_head also has a Q8_0 copy of its bf16
    weights, which linear() applies to Q8_0 inputs from row m.q8_from on (0: every row; lm_head always)."""
    bf16 = bf16 or q8
    dt = _dtype(compute_dtype)
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    cfg.setdefault("tie_word_embeddings", tied(cfg))
    raw = load_weights(model_dir)
    shapes = expected_shapes(cfg)
    for name, shape in shapes.items():
        if name not in raw:
            raise ValueError(f"missing tensor {name}")
        if tuple(raw[name].shape) != shape:
            raise ValueError(f"{name}: shape {tuple(raw[name].shape)} != expected {shape}")
    w = {n: raw.pop(n) for n in shapes}  # pop: free each raw tensor as we go
    w = {n: (t.to(torch.bfloat16) if bf16 else t).to(dt) for n, t in w.items()}
    if is_gemma(cfg):  # Gemma3RMSNorm: x / rms(x) * (1 + w), the 1 added to the stored (rounded) weight
        w = {n: (1 + t if n.endswith("norm.weight") else t) for n, t in w.items()}
    m = Model()
    m.cfg, m.dtype, m.bf16 = cfg, dt, bf16
    m.C, m.H, m.KVH = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    m.D, m.eps, m.theta = head_dim(cfg), cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)
    m.V = cfg["vocab_size"]
    m.inv_freq = rope_inv_freq(cfg, m.D)
    m.window = sliding_window(cfg)
    m.layer_window = [layer_window(cfg, li) for li in range(cfg["num_hidden_layers"])]
    m.layer_inv = [layer_inv_freq(cfg, li, m.D) for li in range(cfg["num_hidden_layers"])]
    m.scale, m.embed_scale, m.gemma = attn_scale(cfg, m.D), embed_scale(cfg, bf16), is_gemma(cfg)
    m.gelu = lambda g: F.gelu(g, approximate="tanh")  # Gemma's MLP activation (a peer's own may replace it)
    m.embed = w["model.embed_tokens.weight"]
    m.norm = w["model.norm.weight"]
    m.lm_head = m.embed if cfg["tie_word_embeddings"] else w.get("lm_head.weight")
    if is_reward_model(cfg):  # the score head (num_labels, C), read at the last token (reward_scores)
        m.lm_head = w["score.weight"]
    m.layers = layer_dicts(cfg, w)
    if adapter is not None:
        acfg, tensors = load_lora(adapter, cfg)
        attach_lora(m, tensors, acfg["lora_alpha"] / acfg["r"])
    if q8:
        m.q8_from = 0
        m.q8w = {id(L[k]): (q8_0(L[k]), False) for L in m.layers for k in ("wq", "wk", "wv", "wo", "wg", "wu", "wd")}
        m.lm_head = m.lm_head.clone()  # a tied head's copy: the embedding lookup reads the bf16 table
        m.q8w[id(m.lm_head)] = (q8_0(m.lm_head), True)
    return m


def q8_0(t):
    """t's rows in blocks of 32 values through llama.cpp's Q8_0 (quantize_row_q8_0_ref, in fp32 as grpo.c
    computes it): d = max|x| / 127, stored rounded to fp16; q = roundf(x * (1/d)); back to values d16 * q."""
    x = t.float().reshape(-1, 32)
    d = x.abs().amax(-1, keepdim=True) / 127
    v = x * torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = (torch.sign(v) * torch.floor(v.abs() + 0.5)).clamp(-127, 127)  # roundf: halves away from zero
    return (q * d.half().float()).reshape(t.shape).to(t.dtype)


def layer_dicts(cfg, w):
    """Per layer, its tensors under short keys from w (HF name -> tensor); None for a bias or q/k norm the
    model has not."""
    layers = []
    gemma = is_gemma(cfg)  # its pre-MLP norm is pre_feedforward_layernorm; post_attention_layernorm norms o_proj's
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        layers.append({k: w.get(p + n) for k, n in [
            ("ln1", "input_layernorm.weight"),
            ("ln2", "pre_feedforward_layernorm.weight" if gemma else "post_attention_layernorm.weight"),
            ("pa", "post_attention_layernorm.weight" if gemma else "-"),
            ("pf", "post_feedforward_layernorm.weight" if gemma else "-"),
            ("wq", "self_attn.q_proj.weight"), ("bq", "self_attn.q_proj.bias"),
            ("wk", "self_attn.k_proj.weight"), ("bk", "self_attn.k_proj.bias"),
            ("wv", "self_attn.v_proj.weight"), ("bv", "self_attn.v_proj.bias"),
            ("wo", "self_attn.o_proj.weight"), ("qn", "self_attn.q_norm.weight"), ("kn", "self_attn.k_norm.weight"),
            ("wg", "mlp.gate_proj.weight"), ("wu", "mlp.up_proj.weight"), ("wd", "mlp.down_proj.weight")]})
    return layers


# ----------------------------------------------------------------- LoRA (PEFT)

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_MLP = ("gate_proj", "up_proj", "down_proj")


def lora_targets(spec):
    """PEFT module names, in LORA_TARGETS order, from "all-linear", a comma list or a list of PEFT or
    short names (q, k, v, o, gate, up, down)."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out = set()
    for t in (x.strip() for x in items):
        if t == "all-linear":
            out.update(LORA_TARGETS)
        elif t in LORA_TARGETS or t + "_proj" in LORA_TARGETS:
            out.add(t if t in LORA_TARGETS else t + "_proj")
        else:
            raise ValueError(f"unknown LoRA target module {t!r}")
    return [t for t in LORA_TARGETS if t in out]


def lora_module(layer, target):
    """The PEFT-saved name of layer `layer`'s projection `target` (without .lora_A.weight)."""
    return f"base_model.model.model.layers.{layer}.{'mlp' if target in LORA_MLP else 'self_attn'}.{target}"


def lora_dims(cfg, target):
    """(out, in) of a projection's weight."""
    C, I, D = cfg["hidden_size"], cfg["intermediate_size"], head_dim(cfg)
    H, KVH = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    return {"q_proj": (H * D, C), "k_proj": (KVH * D, C), "v_proj": (KVH * D, C), "o_proj": (C, H * D),
            "gate_proj": (I, C), "up_proj": (I, C), "down_proj": (C, I)}[target]


def lora_shapes(cfg, r, targets):
    """{PEFT tensor name: shape}: A (r, in) and B (out, r) for every layer and target."""
    s = {}
    for layer in range(cfg["num_hidden_layers"]):
        for t in lora_targets(targets):
            o, i = lora_dims(cfg, t)
            s[lora_module(layer, t) + ".lora_A.weight"] = (r, i)
            s[lora_module(layer, t) + ".lora_B.weight"] = (o, r)
    return s


def make_lora(cfg, r, targets, seed, b_std=0.05):
    """Random float32 adapter tensors: A as PEFT inits it (kaiming_uniform_ with a=sqrt(5), i.e.
    U(-1/sqrt(in), 1/sqrt(in))); B ~ b_std * N(0, 1) instead of PEFT's zeros, so that every gradient is
    non-trivial (with B = 0 the gradient of A is zero)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in lora_shapes(cfg, r, targets).items():
        if name.endswith("lora_A.weight"):
            out[name] = (2 * torch.rand(shape, generator=g, dtype=torch.float64) - 1) / math.sqrt(shape[1])
        else:
            out[name] = b_std * torch.randn(shape, generator=g, dtype=torch.float64)
        out[name] = out[name].float()
    return out


def lora_config(r, alpha, targets, base=""):
    """adapter_config.json as PEFT's LoraConfig.save_pretrained writes it (the fields that matter)."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base, "r": r,
            "lora_alpha": alpha, "lora_dropout": 0.0, "target_modules": lora_targets(targets), "bias": "none",
            "fan_in_fan_out": False, "use_rslora": False, "use_dora": False, "modules_to_save": None,
            "init_lora_weights": True, "inference_mode": True}


def save_lora(d, tensors, r, alpha, targets, base="", config=None):
    """Write a PEFT adapter dir: adapter_config.json (config overrides the fields of lora_config) and
    adapter_model.safetensors."""
    os.makedirs(d, exist_ok=True)
    cfg = lora_config(r, alpha, targets, base)
    cfg.update(config or {})
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    save_safetensors(os.path.join(d, "adapter_model.safetensors"), tensors, {"format": "pt"})


def load_lora(d, cfg=None):
    """(adapter_config dict, {PEFT name: tensor as stored}) of a PEFT adapter dir; with the model's cfg the
    names and shapes must be exactly the targeted ones."""
    with open(os.path.join(d, "adapter_config.json")) as f:
        acfg = json.load(f)
    if acfg.get("peft_type") != "LORA" or acfg.get("use_dora") or acfg.get("use_rslora"):
        raise ValueError(f"{d}: not a plain LoRA adapter")
    tensors = load_safetensors(os.path.join(d, "adapter_model.safetensors"))
    if cfg is not None:
        want = lora_shapes(cfg, acfg["r"], acfg["target_modules"])
        got = {n: tuple(t.shape) for n, t in tensors.items()}
        if got != want:
            raise ValueError(f"{d}: adapter tensors differ from {len(want)} expected: "
                             f"{sorted(set(got.items()) ^ set(want.items()))[:4]}")
    return acfg, tensors


def lora_pairs(names):
    """{(layer, target): (A name, B name)} of a set of PEFT tensor names."""
    out = {}
    for n in names:
        if n.endswith(".lora_A.weight"):
            mod = n[:-len(".lora_A.weight")]
            layer = int(mod.split(".layers.")[1].split(".")[0])
            out[(layer, mod.rsplit(".", 1)[1])] = (n, mod + ".lora_B.weight")
    return out


def attach_lora(m, tensors, scale):
    """Give model m the adapter {PEFT name: tensor}: A and B cast to m's compute dtype (a tensor already
    in it, e.g. an nn.Parameter being trained, is used as it is)."""
    m.lora = {k: (tensors[a].to(m.dtype), tensors[b].to(m.dtype)) for k, (a, b) in lora_pairs(tensors).items()}
    m.lora_scale = scale
    return m


def merge_lora(weights, tensors, scale):
    """HF weights {name: tensor} with W + scale * B @ A (computed in float64, returned float64) for each
    adapted projection; the other tensors are returned as they are."""
    out = dict(weights)
    for (layer, t), (a, b) in lora_pairs(tensors).items():
        w = f"model.layers.{layer}.{'mlp' if t in LORA_MLP else 'self_attn'}.{t}.weight"
        out[w] = weights[w].double() + scale * (tensors[b].double() @ tensors[a].double())
    return out


# ----------------------------------------------------------------- forward

def round_bf16(t):
    """t rounded to the nearest bf16 (ties to even), kept in t's dtype."""
    return t.to(torch.bfloat16).to(t.dtype)


class _Bf16Linear(torch.autograd.Function):
    """x @ w^T + b as a bf16 GEMM with fp32 accumulation computes it: x is rounded to bf16 in the forward
    and d(loss)/d(output) in the backward, so every product sees bf16 operands (w is bf16 already);
    the bias gradient sums the rounded output gradient."""

    @staticmethod
    def forward(ctx, x, w, b):
        xr = round_bf16(x)
        ctx.save_for_backward(xr, w)
        ctx.has_bias = b is not None
        y = xr @ w.t()
        return y + b if b is not None else y

    @staticmethod
    def backward(ctx, dy):
        xr, w = ctx.saved_tensors
        d = round_bf16(dy)
        return d @ w, d.t() @ xr, d.sum(0) if ctx.has_bias else None


def linear(m, x, w, b=None):
    """A projection of model m: F.linear, or its bf16-operand form when m computes in bf16; with Q8_0 copies
    (load_model's q8), theirs on Q8_0 inputs from row m.q8_from on, or on every row for lm_head."""
    wq, every_row = getattr(m, "q8w", {}).get(id(w), (None, False))
    if wq is not None and (every_row or m.q8_from == 0):
        return F.linear(q8_0(x), wq, b)
    y = _Bf16Linear.apply(x, w, b) if getattr(m, "bf16", False) else F.linear(x, w, b)
    if wq is not None:  # the rows before q8_from as a prefill reads the bf16 weights, the rest as decode
        y = torch.cat([y[:m.q8_from], F.linear(q8_0(x[m.q8_from:]), wq, b)])
    return y


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope_cos_sin(T, D, theta, dtype, inv_freq=None):
    # angles in float64 (exact-math reference; HF uses float32 here, a <1e-5 rad difference)
    if inv_freq is None:
        inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], -1)  # (T, D)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


def proj(m, li, target, x, w, b=None):
    """Projection `target` (a PEFT module name, e.g. "q_proj") of layer li: linear(), plus the LoRA branch
    when m carries an adapter for it (m.lora[(li, target)] = (A, B), m.lora_scale). The branch is PEFT's
    lora_B(lora_A(x)) * scaling, in m's compute dtype from the unrounded input x (a bf16 model rounds only
    the base product's operands)."""
    y = linear(m, x, w, b)
    ab = getattr(m, "lora", None) and m.lora.get((li, target))
    if ab:
        A, B = ab
        y = y + ((x @ A.t()) @ B.t()) * m.lora_scale
    return y


def hidden_states(m, ids, kv_bf16_from=None):
    """Final-normed hidden states (T, C) for one sequence of token ids (LongTensor (T,)). kv_bf16_from: the rows
    from it on attend to keys and values rounded to bf16, as the decode steps of a bf16 KV cache do (the rows
    before, a prompt prefilled whole, to its exact ones)."""
    T, H, KVH, D = ids.numel(), m.H, m.KVH, m.D
    x = m.embed[ids] * m.embed_scale
    for li, L in enumerate(m.layers):
        cos, sin = rope_cos_sin(T, D, m.theta, m.dtype, m.layer_inv[li])
        mask = causal_mask(T, m.layer_window[li])
        h = rms_norm(x, L["ln1"], m.eps)
        q = proj(m, li, "q_proj", h, L["wq"], L["bq"]).view(T, H, D)
        k = proj(m, li, "k_proj", h, L["wk"], L["bk"]).view(T, KVH, D)
        if L["qn"] is not None:  # Qwen3: each head's query and key normed over D, before RoPE
            q, k = rms_norm(q, L["qn"], m.eps), rms_norm(k, L["kn"], m.eps)
        q, k = q.transpose(0, 1), k.transpose(0, 1)                          # (H, T, D), (KVH, T, D)
        v = proj(m, li, "v_proj", h, L["wv"], L["bv"]).view(T, KVH, D).transpose(0, 1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # GQA: q head h uses kv head h // (H/KVH), i.e. each kv head repeated consecutively
        k = k.repeat_interleave(H // KVH, 0)
        v = v.repeat_interleave(H // KVH, 0)
        s = (q @ k.transpose(1, 2)) * m.scale
        s = s.masked_fill(mask, float("-inf"))
        a = torch.softmax(s, -1) @ v                                        # (H, T, D)
        if kv_bf16_from is not None:
            s = ((q @ round_bf16(k).transpose(1, 2)) * m.scale).masked_fill(mask, float("-inf"))
            a = torch.cat([a[:, :kv_bf16_from], (torch.softmax(s, -1) @ round_bf16(v))[:, kv_bf16_from:]], 1)
        o = proj(m, li, "o_proj", a.transpose(0, 1).reshape(T, H * D), L["wo"])
        x = x + (rms_norm(o, L["pa"], m.eps) if m.gemma else o)
        h = rms_norm(x, L["ln2"], m.eps)
        g, u = proj(m, li, "gate_proj", h, L["wg"]), proj(m, li, "up_proj", h, L["wu"])
        d = proj(m, li, "down_proj", (m.gelu(g) if m.gemma else F.silu(g)) * u, L["wd"])
        x = x + (rms_norm(d, L["pf"], m.eps) if m.gemma else d)
    return rms_norm(x, m.norm, m.eps)


def logits(m, tokens):
    with torch.no_grad():
        return linear(m, hidden_states(m, torch.tensor(tokens, dtype=torch.long)), m.lm_head)


def reward_scores(m, seqs):
    """A reward model's scores: transformers' Qwen2ForSequenceClassification.forward (modeling_qwen2.py) runs the
    decoder, applies score (a Linear without bias) to every position's final-normed hidden state and pools the
    logits at each row's last non-pad token; a sequence without padding is pooled at its last token. Returns
    [[one value per label] per sequence]."""
    with torch.no_grad():
        return [linear(m, hidden_states(m, torch.tensor(t, dtype=torch.long)), m.lm_head)[-1].tolist() for t in seqs]


def score(m, seqs):
    """For each token list: [log p(tokens[i] | tokens[:i]) for i in 1..n-1]."""
    out = []
    with torch.no_grad():
        for toks in seqs:
            if len(toks) < 2:
                out.append([])
                continue
            if min(toks) < 0 or max(toks) >= m.V:
                raise ValueError(f"token id out of range [0, {m.V})")
            # the last token is only a target, so it never needs to be run
            z = logits(m, toks[:-1])                                   # (n-1, V), the only big tensor
            tgt = torch.tensor(toks[1:], dtype=torch.long)
            lp = z.gather(1, tgt[:, None])[:, 0] - torch.logsumexp(z, -1)  # = log_softmax, no 2nd (T,V)
            out.append(lp.tolist())
    return out


# ----------------------------------------------------------------- self-check

def naive_score(m, toks):
    """Deliberately different formulation: token-by-token with a KV cache, python loops over
    heads/positions, RoPE as explicit 2-D rotations of pairs (i, i+D/2), scalar softmax."""
    H, KVH, D, half = m.H, m.KVH, m.D, m.D // 2
    group = H // KVH

    def norm(x, w):
        return w * x / math.sqrt(float((x * x).sum()) / x.numel() + m.eps)

    def rope(vec, pos):
        out = vec.clone()
        for i in range(half):
            ang = pos * float(m.inv_freq[i])
            c, s = math.cos(ang), math.sin(ang)
            a, b = float(vec[i]), float(vec[i + half])
            out[i], out[i + half] = a * c - b * s, b * c + a * s
        return out

    cache = [([], []) for _ in m.layers]  # per layer: list of k (KVH,D), list of v (KVH,D)
    res = []
    for pos, tok in enumerate(toks[:-1]):
        x = m.embed[tok].clone()
        for L, (kc, vc) in zip(m.layers, cache):
            h = norm(x, L["ln1"])
            q = (L["wq"] @ h + L["bq"]).view(H, D)
            k = (L["wk"] @ h + L["bk"]).view(KVH, D)
            v = (L["wv"] @ h + L["bv"]).view(KVH, D)
            kc.append(torch.stack([rope(k[j], pos) for j in range(KVH)]))
            vc.append(v)
            att = []
            for hh in range(H):
                qh, kv = rope(q[hh], pos), hh // group
                sc = [float(qh @ kc[j][kv]) / math.sqrt(D) for j in range(pos + 1)]
                mx = max(sc)
                e = [math.exp(s - mx) for s in sc]
                att.append(sum(e[j] / sum(e) * vc[j][kv] for j in range(pos + 1)))
            x = x + L["wo"] @ torch.cat(att)
            h = norm(x, L["ln2"])
            g = L["wg"] @ h
            x = x + L["wd"] @ (g / (1 + torch.exp(-g)) * (L["wu"] @ h))
        z = m.lm_head @ norm(x, m.norm)
        mx = float(z.max())
        res.append(float(z[toks[pos + 1]]) - mx - math.log(float(torch.exp(z - mx).sum())))
    return res


def self_check(tmp=None, verbose=True):
    import random
    import tempfile
    tmp = tmp or tempfile.mkdtemp(prefix="qwen2_ref_")
    os.makedirs(tmp, exist_ok=True)
    ok = True

    def check(cond, msg):
        nonlocal ok
        if verbose or not cond:
            print(("ok    " if cond else "FAIL  ") + msg)
        ok = ok and bool(cond)

    # 1. byte-exact format: known encodings of [1.0, -2.0]
    p = os.path.join(tmp, "bytes.safetensors")
    for tag, dt, want in [("F32", torch.float32, b"\x00\x00\x80\x3f\x00\x00\x00\xc0"),
                          ("BF16", torch.bfloat16, b"\x80\x3f\x00\xc0"),
                          ("F16", torch.float16, b"\x00\x3c\x00\xc0")]:
        save_safetensors(p, {"t": torch.tensor([1.0, -2.0], dtype=dt)}, {"format": "pt"})
        raw = open(p, "rb").read()
        n = int.from_bytes(raw[:8], "little")
        hdr = json.loads(raw[8:8 + n])
        check(n % 8 == 0 and raw[8 + n:] == want and hdr["t"] == {"dtype": tag, "shape": [2], "data_offsets": [0, len(want)]}
              and torch.equal(load_safetensors(p)["t"], torch.tensor([1.0, -2.0], dtype=dt)),
              f"safetensors {tag} bytes/header")

    # 2. make_model -> load round trip exact, for every dtype and sharding
    common = dict(seed=5, hidden=32, layers=2, heads=4, kv_heads=2, intermediate=48, vocab=97)
    for dtype in ("f32", "bf16", "f16"):
        for shards in (1, 3):
            d = os.path.join(tmp, f"rt_{dtype}_{shards}")
            t = make_model(d, tied=(shards == 1), dtype=dtype, shards=shards, **common)
            r = load_weights(d)
            check(set(t) == set(r) and all(torch.equal(t[n], r[n]) and r[n].dtype == t[n].dtype for n in t),
                  f"round trip {dtype} shards={shards} ({len(t)} tensors)")
    a = load_model(os.path.join(tmp, "rt_bf16_1"))
    b = load_model(os.path.join(tmp, "rt_bf16_3"))
    check(torch.equal(a.embed, b.embed) and a.lm_head is a.embed and b.lm_head is not b.embed,
          "tied model uses embed_tokens as lm_head; sharded untied has its own")

    # 3. reference vs naive per-token loop (float64)
    rng = random.Random(0)
    for name, kw in [("gqa2 untied", dict(heads=4, kv_heads=2, tied=False)),
                     ("mha tied theta1e6 eps1e-5", dict(heads=4, kv_heads=4, tied=True, rope_theta=1e6, eps=1e-5)),
                     ("mqa", dict(heads=4, kv_heads=1, tied=False))]:
        d = os.path.join(tmp, "naive_" + name.split()[0])
        make_model(d, seed=7, hidden=32, layers=2, intermediate=48, vocab=97, **kw)
        m = load_model(d)
        seqs = [[rng.randrange(97) for _ in range(n)] for n in (2, 5, 13)]
        ref = score(m, seqs)
        diff = max(abs(x - y) for s, r in zip(seqs, ref) for x, y in zip(naive_score(m, s), r))
        check(diff < 1e-10, f"batched vs naive per-token loop [{name}]: max diff {diff:.2e}")

    # 4. properties of score() on one model
    m = load_model(os.path.join(tmp, "naive_gqa2"))
    prefix = [rng.randrange(97) for _ in range(9)]
    lp_all = score(m, [prefix + [v] for v in range(97)])
    tot = sum(math.exp(lp[-1]) for lp in lp_all)
    check(abs(tot - 1) < 1e-12, f"sum over vocab of p(v | prefix) = {tot:.15f}")
    long = prefix + [rng.randrange(97) for _ in range(20)]
    s_long, s_pre, s_one = score(m, [long, prefix, [5]])
    check(max(abs(x - y) for x, y in zip(s_long, s_pre)) < 1e-12 and s_one == [] and len(s_long) == len(long) - 1,
          "causal: prefix scores equal leading scores of a longer sequence; n=1 -> []")
    lo = min(s_long)
    check(-40 < lo and sum(s_long) / len(s_long) > -math.log(97) - 3,
          f"logprobs non-degenerate: mean {sum(s_long) / len(s_long):.3f}, min {lo:.3f}, uniform {-math.log(97):.3f}")
    m32 = load_model(os.path.join(tmp, "naive_gqa2"), "float32")
    d32 = max(abs(x - y) for x, y in zip(score(m32, [long])[0], s_long))
    check(d32 < 1e-5, f"float32 compute vs float64: max diff {d32:.2e}")
    if verbose:
        print("self-check " + ("PASSED" if ok else "FAILED") + f" (files in {tmp})")
    return ok


# ----------------------------------------------------------------- CLI

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make-model")
    mk.add_argument("--out", required=True)
    mk.add_argument("--seed", type=int, default=0)
    for a in ("hidden", "layers", "heads", "kv-heads", "intermediate", "vocab"):
        mk.add_argument("--" + a, type=int, required=True)
    mk.add_argument("--tied", action="store_true")
    mk.add_argument("--dtype", choices=list(SHORT_DTYPES), default="f32")
    mk.add_argument("--shards", type=int, default=1)
    mk.add_argument("--rope-theta", type=float, default=10000.0)
    mk.add_argument("--eps", type=float, default=1e-6)
    mk.add_argument("--max-pos", type=int, default=512)
    sc = sub.add_parser("score")
    sc.add_argument("--model", required=True)
    sc.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    sc.add_argument("--adapter", help="a PEFT LoRA adapter dir applied on top of the model")
    sub.add_parser("self-check")
    a = ap.parse_args(argv)

    if a.cmd == "make-model":
        make_model(a.out, a.seed, a.hidden, a.layers, a.heads, a.kv_heads, a.intermediate, a.vocab,
                   a.tied, a.dtype, a.shards, a.rope_theta, a.eps, a.max_pos)
    elif a.cmd == "score":
        m = load_model(a.model, a.dtype, adapter=a.adapter)
        for line in sys.stdin:
            if line.strip():
                lp = score(m, [json.loads(line)["tokens"]])[0]
                sys.stdout.write(json.dumps({"logprobs": lp}) + "\n")  # json floats are repr: round-trip exact
                sys.stdout.flush()
    else:
        return 0 if self_check() else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
