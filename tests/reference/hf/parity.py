#!/usr/bin/python3
"""Converter parity: random HF checkpoint -> `arbor convert hf` (F32) -> GGUF, whose logits at
every position of a 64-token prompt, computed by llama.cpp (`llama_ref logits`) and by any
further engines, must agree with the numpy port of the Hugging Face model (reference.py).

  parity.py CASE --arbor BUILD/arbor --llama-ref tests/reference/.llama/llama_ref \
            --tokenizer TOKENIZER_JSON --workdir DIR [--engine NAME=COMMAND]...

An engine is any command run as `COMMAND MODEL.gguf TOKENS OUT.bin` that writes float32
[tokens, vocab] logits (llama_ref's interface: `llama_ref logits` is the built-in column). This is
the hook for arbor's own forward: `--engine arbor="build/arbor <its logits command>"`.

Agreement: max |engine - numpy| / max |numpy| over all positions and the whole vocabulary must
stay under the case's tolerance (TOLERANCE; GELU models are looser: ggml's GELU goes through a
float16 table). Exits 1 on disagreement or a missing tool (llama_ref missing is a failure, not a
skip), printing the numbers either way.
"""
import argparse
import os
import shlex
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_checkpoint  # noqa: E402
import reference  # noqa: E402

# Relative tolerance per case (max abs error / max |logit|). Measured errors are ~10x smaller.
TOLERANCE = {"qwen3": 1e-4, "gemma2": 2e-3, "gemma3": 2e-3, "gemma3_mm": 2e-3, "mistral3": 1e-4, "phi3": 1e-4,
             "smollm3": 1e-4, "olmo2": 1e-4, "granite": 1e-4}
NUM_TOKENS = 64


def prompt(case):
    rng = np.random.default_rng(1000 + sorted(make_checkpoint.ALL_CASES).index(case))
    return [1] + [int(t) for t in rng.integers(3, 2048, NUM_TOKENS - 1)]


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        print(f"FAILED ({r.returncode}): {' '.join(map(shlex.quote, cmd))}\n{r.stdout}")
        sys.exit(1)
    return r.stdout


def compare(name, got, want, tol):
    """Prints the error of `got` against `want` ([T, V]); returns whether it is within `tol`."""
    if got.shape != want.shape:
        print(f"{name}: logits shape {got.shape}, numpy {want.shape}")
        return False
    err = np.abs(got.astype(np.float64) - want)
    rel = err.max() / np.abs(want).max()
    worst = np.unravel_index(err.argmax(), err.shape)
    same_top = np.mean(got.argmax(-1) == want.argmax(-1))
    ok = rel <= tol
    print(f"{name}: max abs err {err.max():.3g} at position {worst[0]} token {worst[1]}, "
          f"relative {rel:.3g} (tolerance {tol:g}), argmax agrees at {same_top:.0%} of positions"
          f" -> {'ok' if ok else 'FAIL'}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("case", choices=sorted(make_checkpoint.ALL_CASES))
    ap.add_argument("--arbor", required=True)
    ap.add_argument("--llama-ref", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--engine", action="append", default=[], metavar="NAME=COMMAND")
    a = ap.parse_args()
    for tool, what in ((a.llama_ref, "llama_ref (scripts/install_reference.sh builds it)"),
                       (a.arbor, "arbor")):
        if not os.access(tool, os.X_OK):
            print(f"missing {what}: {tool}")
            return 1
    if not os.path.isfile(a.tokenizer):
        print(f"missing tokenizer: {a.tokenizer}")
        return 1
    hf_dir = os.path.join(a.workdir, "hf")
    gguf = os.path.join(a.workdir, "model.gguf")
    make_checkpoint.write_checkpoint(a.case, hf_dir, a.tokenizer)
    run([a.arbor, "convert", "hf", hf_dir, "-o", gguf, "--type", "f32"])
    tokens = prompt(a.case)
    want = reference.logits(hf_dir, tokens)
    ids = ",".join(map(str, tokens))
    engines = [("llama.cpp", [a.llama_ref, "logits"])]
    engines += [(e.split("=", 1)[0], shlex.split(e.split("=", 1)[1])) for e in a.engine]
    ok = True
    for name, cmd in engines:
        out = os.path.join(a.workdir, f"logits_{name}.bin")
        run(cmd + [gguf, ids, out])
        got = np.fromfile(out, dtype=np.float32)
        got = got.reshape(len(tokens), -1) if got.size % len(tokens) == 0 else got
        ok = compare(f"{a.case} {name} vs numpy HF", got, want, TOLERANCE[a.case]) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
