"""SmolLM3ForCausalLM (transformers models/smollm3/modeling_smollm3.py): Llama where layers
with no_rope_layers[il] == 0 (by default every 4th) apply no rotary embedding (NoPE)."""
import numpy as np

from common import (apply_rope, attention, dims, gated_mlp, lm_head, linear, project_qkv,
                    rms_norm, rope_cos_sin, rope_inv_freq, rope_params, silu)


def forward(cfg, w, tokens):
    n_layers, n_q, n_kv, d = dims(cfg)
    eps = cfg.get("rms_norm_eps", 1e-6)
    interval = cfg.get("no_rope_layer_interval", 4)
    use_rope = cfg.get("no_rope_layers") or [int((i + 1) % interval != 0)
                                             for i in range(n_layers)]
    cos, sin = rope_cos_sin(*rope_inv_freq(cfg, rope_params(cfg), d, len(tokens)),
                            np.arange(len(tokens)))
    h = w["model.embed_tokens.weight"][tokens]
    for il in range(n_layers):
        p = f"model.layers.{il}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        q, k, v = project_qkv(x, w, p, n_q, n_kv)
        if use_rope[il]:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        h = h + linear(attention(q, k, v, d ** -0.5), w[p + "self_attn.o_proj.weight"])
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        h = h + gated_mlp(x, w, p, silu)
    return lm_head(cfg, w, rms_norm(h, w["model.norm.weight"], eps))
