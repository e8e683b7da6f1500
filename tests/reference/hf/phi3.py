"""Phi3ForCausalLM (transformers models/phi3/modeling_phi3.py): fused qkv_proj (q rows, then k,
then v) and gate_up_proj (gate rows, then up); partial rotary embedding (partial_rotary_factor);
LongRoPE: long_factor when the sequence is longer than original_max_position_embeddings, else
short_factor, with cos/sin scaled by sqrt(1 + ln(max_pos / orig) / ln(orig))."""
import numpy as np

from common import (apply_rope, attention, dims, lm_head, linear, rms_norm, rope_cos_sin,
                    rope_inv_freq, rope_params, silu, split_heads)


def forward(cfg, w, tokens):
    n_layers, n_q, n_kv, d = dims(cfg)
    eps = cfg.get("rms_norm_eps", 1e-5)
    rot = int(d * cfg.get("partial_rotary_factor", 1.0))
    cos, sin = rope_cos_sin(*rope_inv_freq(cfg, rope_params(cfg), rot, len(tokens)),
                            np.arange(len(tokens)))
    window = cfg.get("sliding_window")
    h = w["model.embed_tokens.weight"][tokens]
    for il in range(n_layers):
        p = f"model.layers.{il}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        qkv = linear(x, w[p + "self_attn.qkv_proj.weight"])
        q = split_heads(qkv[:, :n_q * d], n_q)
        k = split_heads(qkv[:, n_q * d:(n_q + n_kv) * d], n_kv)
        v = split_heads(qkv[:, (n_q + n_kv) * d:], n_kv)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        a = attention(q, k, v, d ** -0.5, window)
        h = h + linear(a, w[p + "self_attn.o_proj.weight"])
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = np.split(linear(x, w[p + "mlp.gate_up_proj.weight"]), 2, axis=-1)
        h = h + linear(up * silu(gate), w[p + "mlp.down_proj.weight"])
    return lm_head(cfg, w, rms_norm(h, w["model.norm.weight"], eps))
