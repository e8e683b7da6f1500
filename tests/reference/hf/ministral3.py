"""Ministral3ForCausalLM / the text model of Mistral3ForConditionalGeneration (transformers
models/ministral3/modeling_ministral3.py): Llama with YaRN RoPE (rope_parameters) and Llama 4
attention temperature: after RoPE, q is scaled by 1 + beta * log(1 + floor(pos / orig_ctx))."""
import numpy as np

from common import (apply_rope, attention, dims, gated_mlp, lm_head, linear, project_qkv,
                    rms_norm, rope_cos_sin, rope_inv_freq, rope_params, silu)


def forward(cfg, w, tokens):
    n_layers, n_q, n_kv, d = dims(cfg)
    eps = cfg.get("rms_norm_eps", 1e-5)
    rp = rope_params(cfg)
    pos = np.arange(len(tokens))
    cos, sin = rope_cos_sin(*rope_inv_freq(cfg, rp, d, len(tokens)), pos)
    beta = rp.get("llama_4_scaling_beta")
    temp = np.ones(len(tokens))
    if beta is not None:
        temp = 1 + beta * np.log(1 + np.floor(pos / rp["original_max_position_embeddings"]))
    h = w["model.embed_tokens.weight"][tokens]
    for il in range(n_layers):
        p = f"model.layers.{il}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        q, k, v = project_qkv(x, w, p, n_q, n_kv)
        q = apply_rope(q, cos, sin) * temp[None, :, None]
        k = apply_rope(k, cos, sin)
        h = h + linear(attention(q, k, v, d ** -0.5), w[p + "self_attn.o_proj.weight"])
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        h = h + gated_mlp(x, w, p, silu)
    return lm_head(cfg, w, rms_norm(h, w["model.norm.weight"], eps))
