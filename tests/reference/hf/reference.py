#!/usr/bin/python3
"""Logits of a Hugging Face checkpoint at every position, from the numpy ports in this folder.

  reference.py MODEL_DIR TOKENS OUT.bin
      TOKENS: comma-separated ids, one sequence from position 0; OUT.bin: float32 [T, vocab]
      (the layout of `llama_ref logits`).

Needs only numpy. The architecture comes from config.json's "architectures"[0].
"""
import sys

import numpy as np

import common
import gemma2
import gemma3
import granite
import ministral3
import olmo2
import phi3
import qwen3
import smollm3

MODELS = {
    "Qwen3ForCausalLM": qwen3,
    "Gemma2ForCausalLM": gemma2,
    "Gemma3ForCausalLM": gemma3,
    "Gemma3ForConditionalGeneration": gemma3,
    "Ministral3ForCausalLM": ministral3,
    "Mistral3ForConditionalGeneration": ministral3,
    "Phi3ForCausalLM": phi3,
    "SmolLM3ForCausalLM": smollm3,
    "Olmo2ForCausalLM": olmo2,
    "GraniteForCausalLM": granite,
}


def logits(model_dir, tokens):
    """float64 [T, vocab]."""
    cfg, weights = common.load_checkpoint(model_dir)
    arch = cfg["architectures"][0]
    if arch not in MODELS:
        raise SystemExit(f"reference.py: no numpy port of {arch}")
    return MODELS[arch].forward(cfg, weights, np.asarray(tokens, dtype=np.int64))


def main(argv):
    if len(argv) != 4:
        raise SystemExit(__doc__)
    tokens = [int(t) for t in argv[2].split(",") if t]
    logits(argv[1], tokens).astype(np.float32).tofile(argv[3])


if __name__ == "__main__":
    main(sys.argv)
