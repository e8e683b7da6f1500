"""Qwen3ForCausalLM (transformers models/qwen3/modeling_qwen3.py): Llama with an RMSNorm over
each head of q and k before RoPE (rotate-half), optional q/k/v biases."""
import numpy as np

from common import (apply_rope, attention, dims, gated_mlp, lm_head, linear, project_qkv,
                    rms_norm, rope_cos_sin, rope_inv_freq, rope_params, silu)


def forward(cfg, w, tokens):
    n_layers, n_q, n_kv, d = dims(cfg)
    eps = cfg.get("rms_norm_eps", 1e-6)
    cos, sin = rope_cos_sin(*rope_inv_freq(cfg, rope_params(cfg), d, len(tokens)),
                            np.arange(len(tokens)))
    h = w["model.embed_tokens.weight"][tokens]
    for il in range(n_layers):
        p = f"model.layers.{il}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        q, k, v = project_qkv(x, w, p, n_q, n_kv)
        q = apply_rope(rms_norm(q, w[p + "self_attn.q_norm.weight"], eps), cos, sin)
        k = apply_rope(rms_norm(k, w[p + "self_attn.k_norm.weight"], eps), cos, sin)
        h = h + linear(attention(q, k, v, d ** -0.5), w[p + "self_attn.o_proj.weight"])
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        h = h + gated_mlp(x, w, p, silu)
    return lm_head(cfg, w, rms_norm(h, w["model.norm.weight"], eps))
