#!/usr/bin/env python3
"""Speculation against no speculation on ONE running server, paired (scripts/bench_spec_moe.sh).

Every request is sent twice: once with `"speculation": {"mode": "off"}` (the engine treats it
as plain decoding: no drafts proposed or verified) and once with the server's own speculation.
Separate servers started minutes apart see the shared machine's drift (10-20 % on a VM); here
both halves run interleaved on the same server, so the drift cancels out of the ratio.

  --concurrency 1: the prompts one after another, each as an off/on pair, alternating which of
                   the two goes first.
  --concurrency C: phases of C * 2 requests with C in flight at a time, all off or all on, in the
                   order off, on, on, off (ABBA), repeated --rounds times.

Prints "OFF_TPS ON_TPS" (output tokens per second of each half, wall time of its requests or
phases) and, with --texts / --off-texts, writes the texts of either half of a --concurrency 1
run (greedy: they must be equal).
Greedy (temperature 0), ignore_eos, --tokens tokens per request."""
import argparse
import concurrent.futures
import json
import time
import urllib.request


def complete(url, prompt, tokens, mode):
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    if mode == "off":
        body["speculation"] = {"mode": "off"}
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    r = json.load(urllib.request.urlopen(req, timeout=3600))
    return r["usage"]["completion_tokens"], r["choices"][0]["text"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("prompts", help="JSON lines with a \"prompt\" field")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--requests", type=int, default=8,
                    help="prompts of a --concurrency 1 run (default 8)")
    ap.add_argument("--rounds", type=int, default=1, help="ABBA rounds with --concurrency > 1")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--texts", help="write the speculative texts here (--concurrency 1)")
    ap.add_argument("--off-texts", help="write the non-speculative texts here (--concurrency 1)")
    a = ap.parse_args()
    prompts = [json.loads(line)["prompt"] for line in open(a.prompts) if line.strip()]
    made = {"off": 0, "on": 0}
    spent = {"off": 0.0, "on": 0.0}
    if a.concurrency <= 1:
        texts = {"off": [], "on": []}
        for i, prompt in enumerate(prompts[:a.requests]):
            for mode in (("off", "on") if i % 2 == 0 else ("on", "off")):
                t0 = time.time()
                n, text = complete(a.url, prompt, a.tokens, mode)
                spent[mode] += time.time() - t0
                made[mode] += n
                texts[mode].append(json.dumps(text))
        for path, mode in ((a.texts, "on"), (a.off_texts, "off")):
            if path:
                with open(path, "w") as f:
                    f.write("\n".join(texts[mode]) + "\n")
    else:
        n = 2 * a.concurrency
        with concurrent.futures.ThreadPoolExecutor(a.concurrency) as pool:
            for _ in range(a.rounds):
                for mode in ("off", "on", "on", "off"):
                    batch = [prompts[i % len(prompts)] for i in range(n)]
                    t0 = time.time()
                    done = pool.map(lambda p, m=mode: complete(a.url, p, a.tokens, m)[0], batch)
                    made[mode] += sum(done)
                    spent[mode] += time.time() - t0
    print(made["off"] / spent["off"], made["on"] / spent["on"])


if __name__ == "__main__":
    main()
