"""Gemma3ForCausalLM / the text model of Gemma3ForConditionalGeneration (transformers
models/gemma3/modeling_gemma3.py): Gemma 2's layout without attention soft-capping, plus an
RMSNorm (1 + w) over each head of q and k; sliding layers use their own RoPE base
(rope_local_base_freq, unscaled), global layers rope_theta with rope_scaling (e.g. linear);
five sliding layers for each global one."""
import math

import numpy as np

from common import (apply_rope, attention, dims, gelu_tanh, gated_mlp, lm_head, linear,
                    project_qkv, rms_norm, rope_cos_sin, rope_inv_freq, rope_params)


def layer_types(cfg):
    if cfg.get("layer_types"):
        return cfg["layer_types"]
    pattern = cfg.get("sliding_window_pattern", 6)
    return ["sliding_attention" if (i + 1) % pattern else "full_attention"
            for i in range(cfg["num_hidden_layers"])]


def local_rope(cfg):
    rp = cfg.get("rope_parameters") or {}
    if "sliding_attention" in rp:
        return rope_params(cfg, "sliding_attention")
    return {"rope_type": "default", "rope_theta": cfg.get("rope_local_base_freq", 10000.0)}


def forward(cfg, w, tokens):
    n_layers, n_q, n_kv, d = dims(cfg)
    eps = cfg.get("rms_norm_eps", 1e-6)
    scaling = cfg.get("query_pre_attn_scalar", 256) ** -0.5
    window = cfg.get("sliding_window", 4096)
    pos = np.arange(len(tokens))
    rope = {"full_attention": rope_cos_sin(*rope_inv_freq(cfg, rope_params(cfg), d, len(tokens)),
                                           pos),
            "sliding_attention": rope_cos_sin(*rope_inv_freq(cfg, local_rope(cfg), d,
                                                             len(tokens)), pos)}
    h = w["model.embed_tokens.weight"][tokens] * math.sqrt(cfg["hidden_size"])
    types = layer_types(cfg)
    for il in range(n_layers):
        p = f"model.layers.{il}."
        cos, sin = rope[types[il]]
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps, 1.0)
        q, k, v = project_qkv(x, w, p, n_q, n_kv)
        q = apply_rope(rms_norm(q, w[p + "self_attn.q_norm.weight"], eps, 1.0), cos, sin)
        k = apply_rope(rms_norm(k, w[p + "self_attn.k_norm.weight"], eps, 1.0), cos, sin)
        sw = window if types[il] == "sliding_attention" else None
        a = linear(attention(q, k, v, scaling, sw), w[p + "self_attn.o_proj.weight"])
        h = h + rms_norm(a, w[p + "post_attention_layernorm.weight"], eps, 1.0)
        x = rms_norm(h, w[p + "pre_feedforward_layernorm.weight"], eps, 1.0)
        m = gated_mlp(x, w, p, gelu_tanh)
        h = h + rms_norm(m, w[p + "post_feedforward_layernorm.weight"], eps, 1.0)
    logits = lm_head(cfg, w, rms_norm(h, w["model.norm.weight"], eps, 1.0))
    cap = cfg.get("final_logit_softcapping")
    if cap:
        logits = np.tanh(logits / cap) * cap
    return logits
