"""GraniteForCausalLM (transformers models/granite/modeling_granite.py): Llama with
embedding_multiplier on the embeddings, attention_multiplier as the attention scale,
residual_multiplier on each block output before the residual add, and logits divided by
logits_scaling."""
import numpy as np

from common import (apply_rope, attention, dims, gated_mlp, lm_head, linear, project_qkv,
                    rms_norm, rope_cos_sin, rope_inv_freq, rope_params, silu)


def forward(cfg, w, tokens):
    n_layers, n_q, n_kv, d = dims(cfg)
    eps = cfg.get("rms_norm_eps", 1e-6)
    res = cfg.get("residual_multiplier", 1.0)
    cos, sin = rope_cos_sin(*rope_inv_freq(cfg, rope_params(cfg), d, len(tokens)),
                            np.arange(len(tokens)))
    h = w["model.embed_tokens.weight"][tokens] * cfg.get("embedding_multiplier", 1.0)
    for il in range(n_layers):
        p = f"model.layers.{il}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        q, k, v = project_qkv(x, w, p, n_q, n_kv)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        a = attention(q, k, v, cfg.get("attention_multiplier", 1.0))
        h = h + linear(a, w[p + "self_attn.o_proj.weight"]) * res
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        h = h + gated_mlp(x, w, p, silu) * res
    return lm_head(cfg, w, rms_norm(h, w["model.norm.weight"], eps)) / cfg.get(
        "logits_scaling", 1.0)
