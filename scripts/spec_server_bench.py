#!/usr/bin/env python3
"""Speculative decoding through the servers, one client over loopback HTTP.

Starts each server configuration in turn on 127.0.0.1 (llama.cpp's
llama-server of the same source, built by scripts/build-llama-server.sh,
without speculation and with each draftless --spec-type; llama-serve without
and with --spec), streams /v1/completions of --tokens tokens for each prompt
(benches/prompts: copy and code greedy, story sampled at temperature 0.8),
and measures decode tokens/s from the first streamed text to the last.
Configurations are interleaved per round; each server gets one warm-up
request first (a whole copy task: the first long request after a start
runs slower on every server, as memory is touched for the first time). Prints a Markdown table of medians. Standard library only;
every server is stopped when the script ends.

    python3 scripts/spec_server_bench.py --rounds 3 --tokens 256 --threads 2
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA_SERVER = os.environ.get("LLAMA_SERVER") or os.path.join(ROOT, "target/llama-tools/build/bin/llama-server")
LLAMA_SERVE = os.environ.get("LLAMA_SERVE") or os.path.join(ROOT, "target/release/llama-serve")
MODEL = os.environ.get("LLAMA_MODEL") or os.path.expanduser("~/.cache/llama-rs/gemma-3-270m-q4_k_m.gguf")
# SPEC_TYPES="ngram-simple ngram-mod" measures those only.
SPEC_TYPES = os.environ.get("SPEC_TYPES", "ngram-simple ngram-map-k ngram-map-k4v ngram-mod ngram-cache").split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def configs(threads):
    # Both sides keep the whole sliding window (the engine always does).
    base = [LLAMA_SERVER, "-m", MODEL, "-t", str(threads), "-c", "4096", "-np", "1", "--swa-full"]
    out = [("llama-server", base)]
    out += [(f"llama-server --spec-type {t}", base + ["--spec-type", t]) for t in SPEC_TYPES]
    serve = [LLAMA_SERVE, "--model", MODEL, "--threads", str(threads), "--ctx", "4096", "--parallel", "1"]
    out += [("llama-serve", serve), ("llama-serve --spec", serve + ["--spec"])]
    # DRAFT_MAX="16 64" adds llama-serve --spec --draft-max N for each N.
    for n in os.environ.get("DRAFT_MAX", "").split():
        out.append((f"llama-serve --spec --draft-max {n}", serve + ["--spec", "--draft-max", n]))
    return out


def start(cmd):
    port = free_port()
    proc = subprocess.Popen(
        cmd + ["--host", "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{cmd[0]} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc, port
        except OSError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise SystemExit(f"{cmd[0]} did not become ready")


def stream(port, prompt, tokens, sampled):
    body = {
        "prompt": prompt,
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.8 if sampled else 0.0,
        "seed": 7,
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    first = last = None
    pieces = 0
    usage = timings = None
    text = ""
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            timings = chunk.get("timings") or timings
            piece = "".join(c.get("text") or "" for c in chunk.get("choices", []))
            if piece:
                text += piece
                now = time.perf_counter()
                first = first or now
                last = now
                pieces += 1
    n = (usage or {}).get("completion_tokens") or pieces
    # Draft tokens: llama-server's timings, or llama-serve's usage details.
    details = (usage or {}).get("completion_tokens_details") or {}
    if timings and "draft_n" in timings:
        drafted, accepted = timings["draft_n"], timings.get("draft_n_accepted", 0)
    else:
        accepted = details.get("accepted_prediction_tokens", 0)
        drafted = accepted + details.get("rejected_prediction_tokens", 0)
    tps = (n - 1) / (last - first) if last and last > first else 0.0
    return tps, n, drafted, accepted, text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    for exe in (LLAMA_SERVER, LLAMA_SERVE):
        if not os.path.exists(exe):
            raise SystemExit(f"{exe} is missing: scripts/build-llama-server.sh, cargo build --release -p llama-serve")
    prompts = {}
    for name in ("copy", "code", "story"):
        with open(os.path.join(ROOT, "benches/prompts", f"{name}.txt")) as f:
            prompts[name] = f.read()
    cases = [("copy", "copy", False), ("code", "code", False), ("story (sampled)", "story", True)]
    results, drafts, texts = {}, {}, {}
    for rnd in range(args.rounds):
        for label, cmd in configs(args.threads):
            proc, port = start(cmd)
            try:
                stream(port, prompts["copy"], args.tokens, False)
                for case, prompt, sampled in cases:
                    tps, n, drafted, accepted, text = stream(port, prompts[prompt], args.tokens, sampled)
                    results.setdefault((label, case), []).append(tps)
                    # Each step decodes one sampled token and its draft.
                    steps = n - accepted
                    drafts[(label, case)] = (drafted, accepted, steps)
                    texts[(label, case)] = text
                    print(
                        f"round {rnd + 1}\t{label}\t{case}\t{tps:.1f} tok/s\t{n} tokens\t{steps} steps"
                        f"\tdrafted {drafted}, accepted {accepted}",
                        file=sys.stderr,
                        flush=True,
                    )
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    labels = [label for label, _ in configs(args.threads)]
    print(f"\n| server | " + " | ".join(c for c, _, _ in cases) + " |")
    print("|---|" + "---|" * len(cases))
    for label in labels:
        cells = [f"{statistics.median(results[(label, c)]):.1f}" for c, _, _ in cases]
        print(f"| {label} | " + " | ".join(cells) + " |")
    # Steps and drafts of the last round; whether greedy text equals the
    # same server's without speculation up to the first difference.
    print("\n| server | case | steps | drafted | accepted | draft per step | same text as without (chars) |")
    print("|---|---|---:|---:|---:|---:|---|")
    for label in labels:
        base = "llama-server" if label.startswith("llama-server") else "llama-serve"
        for c, _, sampled in cases:
            drafted, accepted, steps = drafts[(label, c)]
            a, b = texts[(base, c)], texts[(label, c)]
            same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            verdict = "sampled" if sampled else ("identical" if a == b else f"first {same} of {len(a)}")
            print(f"| {label} | {c} | {steps} | {drafted} | {accepted} | {drafted / max(steps, 1):.1f} | {verdict} |")


if __name__ == "__main__":
    main()
