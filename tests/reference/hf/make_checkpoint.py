#!/usr/bin/python3
"""Writes a small random Hugging Face checkpoint of one architecture, with the conventions of
the real family (head_dim != hidden / heads where the family has it, GQA, sliding windows
shorter than the 64-token test prompt, ties, the family's RoPE scaling), for the converter
parity tests (parity.py).

  make_checkpoint.py CASE OUT_DIR --tokenizer TOKENIZER_JSON [--seed N]

CASE: one of CASES below. OUT_DIR gets config.json, model.safetensors (F32) and tokenizer.json
(a copy of TOKENIZER_JSON; tinystories-656K's 2048-token one keeps files small).
"""
import argparse
import json
import os
import shutil
import struct

import numpy as np

BASE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 2048,
        "max_position_embeddings": 256, "bos_token_id": 1, "eos_token_id": 2}

CASES = {
    # Qwen3: head_dim 24 (4 heads x 24 = 96 != 64), per-head q/k norms, tied (0.6B-4B are).
    "qwen3": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=24,
                  hidden_act="silu", rms_norm_eps=1e-6, rope_theta=1e6, rope_scaling=None,
                  tie_word_embeddings=True, attention_bias=False, use_sliding_window=False),
    # Gemma 2: sliding window 16 on even layers, soft caps small enough to bite.
    "gemma2": dict(architectures=["Gemma2ForCausalLM"], model_type="gemma2", head_dim=24,
                   hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, rope_theta=10000.0,
                   query_pre_attn_scalar=24, sliding_window=16, attn_logit_softcapping=2.0,
                   final_logit_softcapping=5.0, tie_word_embeddings=True,
                   layer_types=["sliding_attention", "full_attention"] * 2),
    # Gemma 3 (text): 7 layers so a global layer (5) has sliding ones after it; local RoPE base
    # 10000 unscaled, global 1e6 with linear scaling 8 (the 4B-27B models).
    "gemma3": dict(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", head_dim=24,
                   num_hidden_layers=7, hidden_activation="gelu_pytorch_tanh",
                   rms_norm_eps=1e-6, rope_theta=1e6, rope_local_base_freq=10000.0,
                   rope_scaling={"rope_type": "linear", "factor": 8.0},
                   query_pre_attn_scalar=24, sliding_window=16, final_logit_softcapping=None,
                   attn_logit_softcapping=None, tie_word_embeddings=True,
                   layer_types=["sliding_attention"] * 5 + ["full_attention", "sliding_attention"]),
    # Ministral 3: head_dim 24 != 16, YaRN factor 4 over an original context of 32 tokens, so
    # the Llama 4 attention temperature changes inside the 64-token prompt.
    "mistral3": dict(architectures=["Ministral3ForCausalLM"], model_type="ministral3",
                     head_dim=24, hidden_act="silu", rms_norm_eps=1e-5,
                     max_position_embeddings=128, tie_word_embeddings=False,
                     sliding_window=None,
                     rope_parameters={"rope_type": "yarn", "type": "yarn", "rope_theta": 1e6,
                                      "factor": 4.0, "original_max_position_embeddings": 32,
                                      "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                                      "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1}),
    # Phi-3.5 / Phi-4-mini: fused qkv / gate_up, partial rotary 0.75, LongRoPE with an original
    # context of 32 < 64 tokens so the long factors and the attention factor are in play.
    "phi3": dict(architectures=["Phi3ForCausalLM"], model_type="phi3", hidden_act="silu",
                 rms_norm_eps=1e-5, rope_theta=10000.0, partial_rotary_factor=0.75,
                 max_position_embeddings=128, original_max_position_embeddings=32,
                 sliding_window=128, tie_word_embeddings=False),
    # SmolLM3: NoPE in every 4th layer, YaRN factor 2 (its long-context recipe), tied.
    "smollm3": dict(architectures=["SmolLM3ForCausalLM"], model_type="smollm3",
                    hidden_act="silu", rms_norm_eps=1e-6, rope_theta=5e6,
                    max_position_embeddings=128, no_rope_layer_interval=4,
                    no_rope_layers=[1, 1, 1, 0], use_sliding_window=False,
                    rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                  "original_max_position_embeddings": 64},
                    tie_word_embeddings=True),
    # OLMo 2: post-norms, q/k norms over the whole projection, untied.
    "olmo2": dict(architectures=["Olmo2ForCausalLM"], model_type="olmo2", hidden_act="silu",
                  rms_norm_eps=1e-6, rope_theta=500000.0, rope_scaling=None,
                  tie_word_embeddings=False, attention_bias=False),
    # Granite 3.x: the four multipliers at values of the shape of the real ones.
    "granite": dict(architectures=["GraniteForCausalLM"], model_type="granite",
                    hidden_act="silu", rms_norm_eps=1e-5, rope_theta=10000.0,
                    embedding_multiplier=12.0, attention_multiplier=0.015625,
                    residual_multiplier=0.22, logits_scaling=8.0, tie_word_embeddings=True),
}


# Multimodal wrappers: the text model of the case named after "_mm" inside a
# *ForConditionalGeneration checkpoint (text_config; language-model tensors under
# "model.language_model.", lm_head at the root; a vision tensor the converter must skip).
MULTIMODAL = {"gemma3_mm": ("gemma3", "Gemma3ForConditionalGeneration")}


def config_of(case):
    if case in MULTIMODAL:
        text_case, arch = MULTIMODAL[case]
        text = config_of(text_case)
        del text["architectures"]
        return {"architectures": [arch], "model_type": "gemma3", "text_config": text,
                "vision_config": {"hidden_size": 8}}
    cfg = {**BASE, **CASES[case]}
    if case == "phi3":
        rot = int(cfg["hidden_size"] // cfg["num_attention_heads"] * cfg["partial_rotary_factor"])
        rng = np.random.default_rng(7)
        cfg["rope_scaling"] = {
            "type": "longrope",
            "long_factor": [round(float(x), 4) for x in rng.uniform(1.0, 6.0, rot // 2)],
            "short_factor": [round(float(x), 4) for x in rng.uniform(1.0, 1.5, rot // 2)]}
    return cfg


ALL_CASES = {**CASES, **MULTIMODAL}


def tensors_of(cfg, rng):
    """{HF name: float32 array} for `cfg`."""
    if "text_config" in cfg:
        text = {**cfg["text_config"], "architectures": [cfg["architectures"][0]]}
        t = tensors_of(text, rng)
        out = {("lm_head." + k[8:] if k.startswith("lm_head.") else
                "model.language_model." + k[len("model."):]): v for k, v in t.items()}
        out["model.vision_tower.patch_embedding.weight"] = np.ones((8, 3), np.float32)
        return out
    h, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // nq
    arch = cfg["architectures"][0]
    gemma = arch.startswith("Gemma")
    arch = "Gemma3ForCausalLM" if arch == "Gemma3ForConditionalGeneration" else arch

    def mat(rows, cols):
        return rng.normal(0.0, 1.0 / np.sqrt(cols), (rows, cols))

    def norm(n):  # Gemma stores w with the model computing (1 + w)
        return rng.normal(0.0, 0.1, n) + (0.0 if gemma else 1.0)

    t = {"model.embed_tokens.weight": rng.normal(0.0, 1.0, (v, h)),
         "model.norm.weight": norm(h)}
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = mat(v, h)
    for il in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{il}."
        if arch == "Phi3ForCausalLM":
            t[p + "self_attn.qkv_proj.weight"] = mat((nq + 2 * nkv) * d, h)
            t[p + "mlp.gate_up_proj.weight"] = mat(2 * f, h)
        else:
            t[p + "self_attn.q_proj.weight"] = mat(nq * d, h)
            t[p + "self_attn.k_proj.weight"] = mat(nkv * d, h)
            t[p + "self_attn.v_proj.weight"] = mat(nkv * d, h)
            t[p + "mlp.gate_proj.weight"] = mat(f, h)
            t[p + "mlp.up_proj.weight"] = mat(f, h)
        t[p + "self_attn.o_proj.weight"] = mat(h, nq * d)
        t[p + "mlp.down_proj.weight"] = mat(h, f)
        if arch != "Olmo2ForCausalLM":
            t[p + "input_layernorm.weight"] = norm(h)
        t[p + "post_attention_layernorm.weight"] = norm(h)
        if gemma:
            t[p + "pre_feedforward_layernorm.weight"] = norm(h)
        if gemma or arch == "Olmo2ForCausalLM":
            t[p + "post_feedforward_layernorm.weight"] = norm(h)
        if arch in ("Qwen3ForCausalLM", "Gemma3ForCausalLM"):
            t[p + "self_attn.q_norm.weight"] = norm(d)
            t[p + "self_attn.k_norm.weight"] = norm(d)
        if arch == "Olmo2ForCausalLM":
            t[p + "self_attn.q_norm.weight"] = norm(nq * d)
            t[p + "self_attn.k_norm.weight"] = norm(nkv * d)
    return {k: np.asarray(a, np.float32) for k, a in t.items()}


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        b = np.ascontiguousarray(tensors[name]).tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_checkpoint(case, out_dir, tokenizer, seed=0):
    cfg = config_of(case)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    rng = np.random.default_rng(seed + sorted(ALL_CASES).index(case))
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors_of(cfg, rng))
    shutil.copyfile(tokenizer, os.path.join(out_dir, "tokenizer.json"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("case", choices=sorted(ALL_CASES))
    ap.add_argument("out_dir")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    write_checkpoint(a.case, a.out_dir, a.tokenizer, a.seed)


if __name__ == "__main__":
    main()
