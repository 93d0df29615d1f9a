#!/usr/bin/env bash
# pp512 and tg128 through llama.cpp's RPC backend on loopback: this crate
# (examples/bench --rpc, workers: examples/rpc_server) beside llama.cpp's own
# llama-bench --rpc (workers: its ggml-rpc-server), both built from the same
# pinned source, in interleaved rounds:
#
#   local        the whole model in the client process
#   local+rpc    9 of the 18 layers on one worker (-ngl 9), the rest local
#   rpc+rpc      every layer and the output on two workers (-ngl 99)
#
# Workers run with 1 thread each, the client with 2 (THREADS); on the 2-core
# development machine they share the cores, as in the issue's reference run.
# Everything is loopback (127.0.0.1); the workers are stopped on exit.
#
# Usage: scripts/rpc-bench.sh [ROUNDS]   (default 3; builds what it needs)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROUNDS="${1:-3}"
THREADS="${THREADS:-2}"
MODEL="${LLAMA_MODEL:-${LLAMA_CACHE_DIR:-$HOME/.cache/llama-rs}/gemma-3-270m-q4_k_m.gguf}"
OUT="$ROOT/target/rpc-bench"
mkdir -p "$OUT"
cd "$ROOT"
say() { printf 'rpc-bench: %s\n' "$*" >&2; }
[[ -f "$MODEL" ]] || { say "no model at $MODEL; run the tests once or set LLAMA_MODEL"; exit 1; }

cargo build --release --quiet --features rpc --example bench --example rpc_server
tools="$(GGML_RPC=ON bash scripts/build-llama-server.sh 2>"$OUT/build-tools.log" | tail -n 3)"
LLAMA_BENCH="$(sed -n 2p <<<"$tools")"
LLAMA_WORKER="$(sed -n 3p <<<"$tools")"
BENCH="$ROOT/target/release/examples/bench"
WORKER="$ROOT/target/release/examples/rpc_server"

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
ours=()
for port in 50071 50072; do
    "$WORKER" --host 127.0.0.1 --port "$port" --threads 1 >"$OUT/worker-$port.log" 2>&1 &
    pids+=($!)
    ours+=("127.0.0.1:$port")
done
theirs=()
for port in 50081 50082; do
    "$LLAMA_WORKER" -H 127.0.0.1 -p "$port" -t 1 >"$OUT/worker-$port.log" 2>&1 &
    pids+=($!)
    theirs+=("127.0.0.1:$port")
done
for port in 50071 50072; do
    for _ in $(seq 300); do grep -q "listening on" "$OUT/worker-$port.log" && break; sleep 0.1; done
done
sleep 1

# crate CONFIG NGL [RPC]: one run of our bench, "ROUND crate-CONFIG TEST T/S" lines.
crate() {
    local config="$1" ngl="$2" rpc="${3:-}"
    "$BENCH" -m "$MODEL" -p 512 -n 128 -r 3 -t "$THREADS" --gpu-layers "$ngl" ${rpc:+--rpc "$rpc"} \
        | sed -n 's/^|.*| \(pp512\|tg128\) | \([0-9.]*\).*$/\1 \2/p' \
        | while read -r test tps; do echo "$round crate-$config $test $tps"; done
}
# cpp CONFIG NGL [RPC]: the same with llama-bench.
cpp() {
    local config="$1" ngl="$2" rpc="${3:-}"
    "$LLAMA_BENCH" -m "$MODEL" -p 512 -n 128 -r 3 -t "$THREADS" -ngl "$ngl" ${rpc:+--rpc "$rpc"} -o csv 2>/dev/null \
        | python3 -c '
import csv, sys
for row in csv.DictReader(sys.stdin):
    test = ("pp%s" % row["n_prompt"]) if int(row["n_prompt"]) else ("tg%s" % row["n_gen"])
    print(sys.argv[1], "llama-bench-" + sys.argv[2], test, row["avg_ts"])
' "$round" "$config"
}

for round in $(seq 1 "$ROUNDS"); do
    crate local 0
    cpp local 0
    crate local+rpc 9 "${ours[0]}"
    cpp local+rpc 9 "${theirs[0]}"
    crate rpc+rpc 99 "${ours[0]},${ours[1]}"
    cpp rpc+rpc 99 "${theirs[0]},${theirs[1]}"
done | tee "$OUT/bench.txt"

python3 - "$OUT/bench.txt" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    if line.strip():
        _, name, test, tps = line.split()
        runs[(name, test)].append(float(tps))
med = lambda name, test: statistics.median(runs[(name, test)])
print("| configuration | crate pp512 | llama-bench pp512 | ratio | crate tg128 | llama-bench tg128 | ratio | crate ms/token over local |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for config in ["local", "local+rpc", "rpc+rpc"]:
    c, l = "crate-" + config, "llama-bench-" + config
    hop = 1000 / med(c, "tg128") - 1000 / med("crate-local", "tg128")
    print(f"| {config} | {med(c, 'pp512'):.1f} | {med(l, 'pp512'):.1f} | {med(c, 'pp512') / med(l, 'pp512'):.3f} "
          f"| {med(c, 'tg128'):.1f} | {med(l, 'tg128'):.1f} | {med(c, 'tg128') / med(l, 'tg128'):.3f} | {hop:+.2f} |")
PY
