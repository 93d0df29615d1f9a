"""Per-token cost of each chat API on llama-serve: the same greedy request
(128 tokens, streamed) through /v1/chat/completions, /v1/messages and
/v1/responses, interleaved over rounds; tokens/s from the first streamed
text to the last, and each API's median ratio to Chat Completions.

Usage: python scripts/api_token_cost.py target/release/llama-serve MODEL.gguf [ROUNDS]
"""
import json
import statistics
import subprocess
import sys
import time
import urllib.request

exe, model = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
server = subprocess.Popen([exe, "--model", model, "--threads", "2", "--ctx", "4096", "--parallel", "1", "--port", "0"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
base = server.stdout.readline().strip().removeprefix("listening on ")
ASK = "Write a long story about a lighthouse keeper."
MESSAGES = [{"role": "user", "content": ASK}]


def piece_and_count(d):
    """The text a stream event carries and the output token count, if it says."""
    if "choices" in d:
        text = "".join((c.get("delta") or {}).get("content") or "" for c in d["choices"])
        return text, (d.get("usage") or {}).get("completion_tokens")
    kind = d.get("type")
    if kind == "content_block_delta":
        return d["delta"].get("text", ""), None
    if kind == "message_delta":
        return "", d["usage"]["output_tokens"]
    if kind == "response.output_text.delta":
        return d["delta"], None
    if kind in ("response.completed", "response.incomplete"):
        return "", d["response"]["usage"]["output_tokens"]
    return "", None


def run(path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    first = last = None
    n, text = 0, ""
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            piece, count = piece_and_count(json.loads(line[6:]))
            n = count or n
            if piece:
                text += piece
                now = time.perf_counter()
                first, last = first or now, now
    if n < 2 or last == first:
        raise SystemExit(f"{path}: {n} tokens, too few to time")
    return (n - 1) / (last - first), n, text


APIS = {
    "chat": lambda: run("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 128, "temperature": 0, "stream": True,
                                                 "stream_options": {"include_usage": True}}),
    "messages": lambda: run("/v1/messages", {"messages": MESSAGES, "max_tokens": 128, "temperature": 0, "stream": True}),
    "responses": lambda: run("/v1/responses", {"input": ASK, "max_output_tokens": 128, "temperature": 0, "stream": True}),
}

try:
    if not base.startswith("http://127.0.0.1:"):
        raise SystemExit(f"the server did not say where it listens: {base!r}")
    for _ in range(300):
        try:
            urllib.request.urlopen(base + "/health", timeout=1)
            break
        except OSError:
            time.sleep(0.2)
    else:
        raise SystemExit("the server never became ready")
    texts = {name: f()[2] for name, f in APIS.items()}  # warm up
    if len(set(texts.values())) != 1:
        raise SystemExit(f"the APIs answered differently: {texts}")
    print("the same text through every API")
    tps = {name: [] for name in APIS}
    order = list(APIS)
    for r in range(rounds):
        for name in order[r % 3:] + order[:r % 3]:
            rate, n, _ = APIS[name]()
            tps[name].append(rate)
            print(r, name, f"{rate:.1f} tok/s", n, flush=True)
    for name in ("messages", "responses"):
        ratios = [b / a for a, b in zip(tps["chat"], tps[name])]
        print(f"{name}/chat: median {statistics.median(ratios):.3f}, rounds {[round(x, 3) for x in ratios]}")
    print({name: round(statistics.median(v), 1) for name, v in tps.items()})
finally:
    server.terminate()
    server.wait()
