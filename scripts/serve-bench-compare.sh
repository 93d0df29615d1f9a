#!/usr/bin/env bash
# Side by side: llamacpp::engine in-process vs llama.cpp's llama-server over
# loopback HTTP, same pinned llama.cpp source, same model, same threads,
# `-b 512 -ub 512`, unified KV cache, interleaved rounds (the machine's noise
# is a few percent between runs, more under load: compare within a round).
#
#   nice -n 19 scripts/build-llama-server.sh     # once
#   scripts/serve-bench-compare.sh               # ROUNDS=2 by default
#
# Writes JSON lines per run to target/serve-bench/<time>/ and prints the
# medians over rounds per backend, scenario and level (scripts/serve-bench-summary.py).
# Everything talks to 127.0.0.1 only and every wait is bounded.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
ROUNDS="${ROUNDS:-2}"
THREADS="${THREADS:-2}"
OUT="${OUT:-target/serve-bench/$(date -u +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
cargo build --release -p llama-serve --features native --example serve_bench
B=target/release/examples/serve_bench
[ -x target/llama-tools/build/bin/llama-server ] || { echo "build llama-server first: scripts/build-llama-server.sh" >&2; exit 1; }

run() { # name, then serve_bench arguments
  local name="$1"; shift
  echo "== $name: $*" >&2
  timeout 900 "$B" -t "$THREADS" --json "$@" | sed "s/^{/{\"run\":\"$name\",/" >> "$OUT/rows.jsonl"
}

for round in $(seq "$ROUNDS"); do
  echo "=== round $round" >&2
  # (a) aggregate throughput at 1..16 streams (128-token prompts, 128 new tokens).
  run engine --backend engine --parallel 16 --scenario throughput --levels 1,2,4,8,16
  run llama-server --spawn --parallel 16 --scenario throughput --levels 1,2,4,8,16
  # (b) a 4,000-token prompt arrives while one stream decodes; a short request right after (-np 4).
  run engine --backend engine --parallel 4 --scenario long-short --gap-ms 20
  run engine-cap256 --backend engine --parallel 4 --prefill-cap 256 --scenario long-short --gap-ms 20
  run llama-server --spawn --parallel 4 --scenario long-short --gap-ms 20
  # (b') six short requests 50 ms apart after the long prompt (-np 8).
  run engine --backend engine --parallel 8 --scenario long-short --shorts 6 --gap-ms 50
  run engine-cap256 --backend engine --parallel 8 --prefill-cap 256 --scenario long-short --shorts 6 --gap-ms 50
  run llama-server --spawn --parallel 8 --scenario long-short --shorts 6 --gap-ms 50
  # (c) shared 1,000-token prefix: TTFT of B (shared) vs C (cold).
  run engine --backend engine --parallel 4 --scenario prefix
  run llama-server --spawn --parallel 4 --scenario prefix
  # KV f16 vs q8_0 at 8 streams.
  run engine-q8_0 --backend engine --parallel 8 --kv-type q8_0 --scenario throughput --levels 8
  run llama-server-q8_0 --spawn --parallel 8 --kv-type q8_0 --scenario throughput --levels 8
done
python3 scripts/serve-bench-summary.py "$OUT/rows.jsonl" | tee "$OUT/summary.txt"
