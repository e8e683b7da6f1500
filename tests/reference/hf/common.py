"""Pieces shared by the numpy ports of Hugging Face decoder models (tests/reference/hf).

Everything is float64 numpy, written from the transformers modeling code (modeling_*.py and
modeling_rope_utils.py), not from llama.cpp or arbor, so that it is a second, independent
reference for `arbor convert hf` and for arbor's forward.

Shapes: T tokens, H hidden size, Nq / Nkv heads, D head_dim, V vocabulary.
"""
import json
import math
import os
import struct

import numpy as np

_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64}


def read_safetensors(path):
    """{name: float64 array} of a .safetensors file (F32, F16, BF16)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        raw = data[base + b:base + e]
        if t["dtype"] == "BF16":
            u = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=_DTYPES[t["dtype"]])
        out[name] = arr.astype(np.float64).reshape(t["shape"])
    return out


def load_checkpoint(model_dir):
    """(config dict with text_config merged over the root, {normalised name: array})."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    if isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg, **cfg["text_config"]}
    weights = {}
    for fn in sorted(os.listdir(model_dir)):
        if fn.endswith(".safetensors"):
            weights.update(read_safetensors(os.path.join(model_dir, fn)))
    text = {}
    for name, w in weights.items():
        # multimodal checkpoints: language_model.model.* or model.language_model.*
        if name.startswith(("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                            "model.multi_modal_projector.")):
            continue
        text[name.replace("model.language_model.", "model.")
             .replace("language_model.model.", "model.")
             .replace("language_model.lm_head.", "lm_head.")] = w
    return cfg, text


# ---------------------------------------------------------------------------------------------
# RoPE (modeling_rope_utils.py)

def rope_params(cfg, layer_type="full_attention"):
    """The rope parameter dict for a layer: transformers v5 `rope_parameters` (optionally split
    by layer type) or the older `rope_scaling` + `rope_theta`."""
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if "full_attention" in rp or "sliding_attention" in rp:
        rp = dict(rp.get(layer_type, {}))
    else:
        rp = dict(rp)
    rp.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    rp["rope_type"] = rp.get("rope_type", rp.get("type", "default"))
    return rp


def rope_inv_freq(cfg, rp, dim, seq_len):
    """(inv_freq [dim/2], attention_scaling) for `rp` at a sequence of `seq_len` tokens."""
    base = rp["rope_theta"]
    kind = rp["rope_type"]
    exponents = np.arange(0, dim, 2, dtype=np.float64) / dim
    inv = 1.0 / base ** exponents
    max_pos = cfg["max_position_embeddings"]
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return inv / rp["factor"], 1.0
    if kind == "llama3":
        factor, low, high = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
        old = rp["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        out = np.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        mid = ~(wavelen < old / high) & ~(wavelen > old / low)
        return np.where(mid, (1 - smooth) * out / factor + smooth * out, out), 1.0
    if kind == "yarn":
        return _yarn(rp, dim, base, max_pos)
    if kind in ("longrope", "su"):
        orig = rp.get("original_max_position_embeddings") or cfg.get(
            "original_max_position_embeddings")
        factor = max_pos / orig
        attn = rp.get("attention_factor")
        if attn is None:
            attn = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
        ext = np.array(rp["long_factor"] if seq_len > orig else rp["short_factor"], np.float64)
        return 1.0 / (ext * base ** exponents), attn
    raise NotImplementedError(f"rope_type {kind}")


def _yarn(rp, dim, base, max_pos):
    factor = rp["factor"]
    orig = rp.get("original_max_position_embeddings")
    if orig is not None:
        factor = max_pos / orig  # transformers: the ratio of the context lengths
    else:
        orig = max_pos

    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = rp.get("attention_factor")
    if attn is None:
        ms, msad = rp.get("mscale"), rp.get("mscale_all_dim")
        attn = get_mscale(factor, ms) / get_mscale(factor, msad) if ms and msad \
            else get_mscale(factor)
    beta_fast = rp.get("beta_fast") or 32
    beta_slow = rp.get("beta_slow") or 1

    def corr_dim(rot):
        return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if rp.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrap = 1 - ramp
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    inv = (1 / (factor * pos_freqs)) * (1 - extrap) + (1 / pos_freqs) * extrap
    return inv, attn


def rope_cos_sin(inv_freq, attn_scaling, positions):
    """cos, sin [T, rot] in rotate-half layout (freqs concatenated twice)."""
    freqs = np.outer(positions.astype(np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb) * attn_scaling, np.sin(emb) * attn_scaling


def apply_rope(x, cos, sin):
    """x [heads, T, D]; rotates the first cos.shape[-1] dims by rotate_half, passes the rest."""
    rot = cos.shape[-1]
    xr, xp = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotated = np.concatenate([-xr[..., half:], xr[..., :half]], axis=-1)
    return np.concatenate([xr * cos + rotated * sin, xp], axis=-1)


# ---------------------------------------------------------------------------------------------
# Layers

def rms_norm(x, w, eps, offset=0.0):
    """Llama RMSNorm (offset 0) or Gemma's, which multiplies by (1 + w) (offset 1)."""
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y * (offset + w)


def linear(x, w, b=None):
    y = x @ w.T
    return y if b is None else y + b


def silu(x):
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


ACT = {"silu": silu, "gelu_pytorch_tanh": gelu_tanh}


def gated_mlp(x, w, prefix, act):
    g = linear(x, w[prefix + "mlp.gate_proj.weight"])
    u = linear(x, w[prefix + "mlp.up_proj.weight"])
    return linear(act(g) * u, w[prefix + "mlp.down_proj.weight"])


def attention(q, k, v, scaling, sliding_window=None, softcap=None):
    """q [Nq, T, D], k/v [Nkv, T, D] -> [T, Nq * D]; causal, optionally sliding (a key j is seen
    from i iff 0 <= i - j < window) and soft-capped (Gemma 2)."""
    n_q, t, d = q.shape
    rep = n_q // k.shape[0]
    k = np.repeat(k, rep, axis=0)
    v = np.repeat(v, rep, axis=0)
    s = np.einsum("htd,hsd->hts", q, k) * scaling
    if softcap:
        s = np.tanh(s / softcap) * softcap
    i = np.arange(t)[:, None]
    j = np.arange(t)[None, :]
    allowed = j <= i
    if sliding_window:
        allowed &= (i - j) < sliding_window
    s = np.where(allowed[None], s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    o = np.einsum("hts,hsd->htd", p, v)
    return o.transpose(1, 0, 2).reshape(t, n_q * d)


def split_heads(x, n_heads):
    """[T, n*D] -> [n, T, D]."""
    t = x.shape[0]
    return x.reshape(t, n_heads, -1).transpose(1, 0, 2)


def head_dim(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def lm_head(cfg, w, x):
    head = w.get("lm_head.weight")
    if head is None or cfg.get("tie_word_embeddings", False):
        head = w["model.embed_tokens.weight"]
    return linear(x, head)


def project_qkv(x, w, p, n_q, n_kv):
    """q [Nq, T, D], k, v [Nkv, T, D] from separate q/k/v projections (biases if stored)."""
    a = p + "self_attn."
    q = linear(x, w[a + "q_proj.weight"], w.get(a + "q_proj.bias"))
    k = linear(x, w[a + "k_proj.weight"], w.get(a + "k_proj.bias"))
    v = linear(x, w[a + "v_proj.weight"], w.get(a + "v_proj.bias"))
    return split_heads(q, n_q), split_heads(k, n_kv), split_heads(v, n_kv)


def dims(cfg):
    """(layers, Nq, Nkv, D)."""
    n_q = cfg["num_attention_heads"]
    return (cfg["num_hidden_layers"], n_q, cfg.get("num_key_value_heads") or n_q, head_dim(cfg))
