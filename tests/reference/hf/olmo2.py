"""Olmo2ForCausalLM (transformers models/olmo2/modeling_olmo2.py): no pre-norms; an RMSNorm over
the whole q projection and the whole k projection (not per head) before RoPE; the attention and
MLP outputs are normalised (post_attention_layernorm, post_feedforward_layernorm) before they
are added to the residual stream."""
import numpy as np

from common import (apply_rope, attention, dims, gated_mlp, lm_head, linear, rms_norm,
                    rope_cos_sin, rope_inv_freq, rope_params, silu, split_heads)


def forward(cfg, w, tokens):
    n_layers, n_q, n_kv, d = dims(cfg)
    eps = cfg.get("rms_norm_eps", 1e-5)
    cos, sin = rope_cos_sin(*rope_inv_freq(cfg, rope_params(cfg), d, len(tokens)),
                            np.arange(len(tokens)))
    h = w["model.embed_tokens.weight"][tokens]
    for il in range(n_layers):
        p = f"model.layers.{il}."
        a = p + "self_attn."
        q = rms_norm(linear(h, w[a + "q_proj.weight"]), w[a + "q_norm.weight"], eps)
        k = rms_norm(linear(h, w[a + "k_proj.weight"]), w[a + "k_norm.weight"], eps)
        v = linear(h, w[a + "v_proj.weight"])
        q = apply_rope(split_heads(q, n_q), cos, sin)
        k = apply_rope(split_heads(k, n_kv), cos, sin)
        o = linear(attention(q, k, split_heads(v, n_kv), d ** -0.5), w[a + "o_proj.weight"])
        h = h + rms_norm(o, w[p + "post_attention_layernorm.weight"], eps)
        m = gated_mlp(h, w, p, silu)
        h = h + rms_norm(m, w[p + "post_feedforward_layernorm.weight"], eps)
    return lm_head(cfg, w, rms_norm(h, w["model.norm.weight"], eps))
