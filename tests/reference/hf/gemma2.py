"""Gemma2ForCausalLM (transformers models/gemma2/modeling_gemma2.py): embeddings scaled by
sqrt(hidden); RMSNorm multiplies by (1 + w); four norms per layer (input, post-attention,
pre- and post-feedforward); attention scaled by query_pre_attn_scalar^-0.5 with tanh soft-capping
of the scores; sliding-window attention on even layers; gelu-tanh gated MLP; soft-capped logits.
"""
import math

import numpy as np

from common import (apply_rope, attention, dims, gelu_tanh, gated_mlp, lm_head, linear,
                    project_qkv, rms_norm, rope_cos_sin, rope_inv_freq, rope_params)


def layer_types(cfg):
    return cfg.get("layer_types") or [
        "sliding_attention" if (i + 1) % 2 else "full_attention"
        for i in range(cfg["num_hidden_layers"])]


def forward(cfg, w, tokens):
    n_layers, n_q, n_kv, d = dims(cfg)
    eps = cfg.get("rms_norm_eps", 1e-6)
    scaling = cfg.get("query_pre_attn_scalar", 256) ** -0.5
    softcap = cfg.get("attn_logit_softcapping", 50.0)
    final_cap = cfg.get("final_logit_softcapping", 30.0)
    window = cfg.get("sliding_window", 4096)
    cos, sin = rope_cos_sin(*rope_inv_freq(cfg, rope_params(cfg), d, len(tokens)),
                            np.arange(len(tokens)))
    h = w["model.embed_tokens.weight"][tokens] * math.sqrt(cfg["hidden_size"])
    types = layer_types(cfg)
    for il in range(n_layers):
        p = f"model.layers.{il}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps, 1.0)
        q, k, v = project_qkv(x, w, p, n_q, n_kv)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        sw = window if types[il] == "sliding_attention" else None
        a = linear(attention(q, k, v, scaling, sw, softcap), w[p + "self_attn.o_proj.weight"])
        h = h + rms_norm(a, w[p + "post_attention_layernorm.weight"], eps, 1.0)
        x = rms_norm(h, w[p + "pre_feedforward_layernorm.weight"], eps, 1.0)
        m = gated_mlp(x, w, p, gelu_tanh)
        h = h + rms_norm(m, w[p + "post_feedforward_layernorm.weight"], eps, 1.0)
    logits = lm_head(cfg, w, rms_norm(h, w["model.norm.weight"], eps, 1.0))
    if final_cap:
        logits = np.tanh(logits / final_cap) * final_cap
    return logits
