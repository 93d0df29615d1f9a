#!/usr/bin/env bash
# Side by side over HTTP: this repository's OpenAI server (llama-serve)
# and llama.cpp's llama-server (built from the same pinned source by
# scripts/build-llama-server.sh), the same model, threads, slots, context
# and batch, each driven by llama-serve/examples/loadgen with the same prompts.
# Servers run one at a time, each started fresh for each scenario (empty
# caches), in interleaved rounds (ours, then llama-server, per scenario).
#
#   nice -n 19 scripts/build-llama-server.sh     # once
#   scripts/loadgen-compare.sh                   # ROUNDS=2 by default
#   SOAK_S=600 scripts/loadgen-compare.sh soak   # 10 minutes at 8 clients, ours only
#   scripts/loadgen-compare.sh quick             # the latency mixes once (shared prompt also at 8192 cells)
#
# Writes JSON rows to target/loadgen/<time>/rows.jsonl and a table of
# medians over the rounds (scripts/loadgen-summary.py). Loopback only;
# every server is killed on exit, every request has a timeout.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
ROUNDS="${ROUNDS:-2}"
THREADS="${THREADS:-2}"
PORT="${PORT:-18181}"
OUT="${OUT:-target/loadgen/$(date -u +%Y%m%d-%H%M%S)}"
LLAMA_SERVER=target/llama-tools/build/bin/llama-server
mkdir -p "$OUT"
cargo build --release -p llama-serve --features native --bin llama-serve --example loadgen
[ -x "$LLAMA_SERVER" ] || { echo "build llama-server first: scripts/build-llama-server.sh" >&2; exit 1; }
# The default model as llama-model-cache (model-cache/) caches it (the tests fetch it), or LLAMA_MODEL.
MODEL="${LLAMA_MODEL:-${LLAMA_CACHE_DIR:-$HOME/.cache/llama-rs}/gemma-3-270m-q4_k_m.gguf}"
[ -f "$MODEL" ] || { echo "no model at $MODEL; run the tests once (they fetch it) or set LLAMA_MODEL" >&2; exit 1; }
L=target/release/examples/loadgen
PID=""
stop_server() { if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; PID=""; fi; }
trap stop_server EXIT

start() { # backend, slots, context
  local backend="$1" np="$2" ctx="$3"
  case "$backend" in
    ours) target/release/llama-serve -m "$MODEL" --port "$PORT" --threads "$THREADS" \
            --parallel "$np" --ctx "$ctx" --batch 512 >"$OUT/$backend.log" 2>&1 & ;;
    llama-server) "$LLAMA_SERVER" -m "$MODEL" --port "$PORT" --host 127.0.0.1 -t "$THREADS" \
            -np "$np" -c "$ctx" -kvu -b 512 -ub 512 >"$OUT/$backend.log" 2>&1 & ;;
  esac
  PID=$!
}

run() { # backend, slots, context, loadgen arguments…
  local backend="$1" np="$2" ctx="$3"; shift 3
  start "$backend" "$np" "$ctx"
  echo "== $backend -np $np -c $ctx: $*" >&2
  # loadgen waits for /health; exit 1 (failed requests) is recorded, not fatal.
  timeout 1200 "$L" --url "http://127.0.0.1:$PORT" --json --label "$backend" --pid "$PID" "$@" \
    | tee -a "$OUT/${ROWS:-rows}.jsonl" || echo "loadgen exit $? ($backend $*)" >&2
  stop_server
}

if [ "${1:-}" = soak ]; then
  run ours 8 8192 --clients 8 --duration-s "${SOAK_S:-600}" --prompt-tokens 128 --max-tokens 128
  exit 0
fi

if [ "${1:-}" = quick ]; then # the two latency mixes only, one round
  for b in ours llama-server; do run "$b" 8 8192 --scenario long-short --shorts 7 --gap-ms 50; done
  for ctx in 16384 8192; do
    for b in ours llama-server; do
      ROWS="rows-$ctx" run "$b" 8 "$ctx" --scenario shared-prefix --clients 8 --requests 4 \
        --shared-tokens 1000 --prompt-tokens 32 --max-tokens 32
    done
  done
  for f in rows rows-16384 rows-8192; do
    echo "# $f"; python3 scripts/loadgen-summary.py "$OUT/$f.jsonl"
  done | tee "$OUT/summary.txt"
  exit 0
fi

for round in $(seq "$ROUNDS"); do
  echo "=== round $round" >&2
  for b in ours llama-server; do
    # N closed-loop clients × 3 requests, 128-token prompts, 128 new tokens each.
    run "$b" 16 8192 --seed "$round" --clients 1,4,8,16 --requests 3 --prompt-tokens 128 --max-tokens 128
  done
  for b in ours llama-server; do
    # One 4,000-token prompt, then 7 short requests (16 + 16 tokens) 50 ms apart.
    run "$b" 8 8192 --seed "$round" --scenario long-short --shorts 7 --gap-ms 50
  done
  for b in ours llama-server; do
    # 8 clients × 4 requests: one 1,000-token system prompt, then 32 own tokens; 32 new tokens.
    # 16,384 cells: 8 × 1,064 tokens exceed 8,192 when nothing is shared
    # (llama-server then fails every request: "failed to find free space in the KV cache").
    run "$b" 8 16384 --seed "$round" --scenario shared-prefix --clients 8 --requests 4 \
      --shared-tokens 1000 --prompt-tokens 32 --max-tokens 32
  done
done
python3 scripts/loadgen-summary.py "$OUT/rows.jsonl" | tee "$OUT/summary.txt"
