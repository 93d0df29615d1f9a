#!/usr/bin/env bash
# Speculative decoding on the default model, side by side: `generate` with
# and without `--spec` on the same prompt and the same number of tokens,
# interleaved over ROUNDS, on benches/prompts (copy: repeat a passage;
# code: rewrite a function with a comment; story: free text, greedy, where
# the base model repeats itself, and sampled at temperature 0.8, where it
# does not).
#
#   scripts/spec-bench.sh                 # ROUNDS=3, N=256, THREADS=2
#   SERVERS=1 scripts/spec-bench.sh       # also the servers, below
#
# Then the engine under load (examples/spec_engine.rs: 16 requests through 8
# streams, half repeating their prompt and half free text, without and with
# speculation, interleaved over ROUNDS).
#
# With SERVERS=1 it also measures, over loopback HTTP with one client,
# llama.cpp's llama-server of the same source (scripts/build-llama-server.sh;
# without speculation and with each draftless --spec-type) and llama-serve
# (without and with --spec): decode tokens/s of /v1/completions streams of N
# tokens, timed from the first streamed token to the last
# (scripts/spec_server_bench.py).
#
# Prints one row per run and a table of medians (tokens/s and the ratio to
# the same prompt without speculation).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
ROUNDS="${ROUNDS:-3}"
THREADS="${THREADS:-2}"
N="${N:-256}"
cargo build --release --example generate --example spec_engine
G=target/release/examples/generate
OUT="${OUT:-target/spec-bench/$(date -u +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
ROWS="$OUT/rows.tsv"
: >"$ROWS"
# run CASE MODE ARGS...: one generation; appends "case mode tok/s accepted/drafted".
run() {
  local case="$1" mode="$2"; shift 2
  local stats tps draft
  stats=$("$G" --threads "$THREADS" -n "$N" "$@" 2>&1 >/dev/null | grep '^prompt' | tail -1)
  tps=$(sed -E 's/.*decode ([0-9.]+) tok\/s.*/\1/' <<<"$stats")
  draft=$(grep -oE 'draft [0-9]+/[0-9]+' <<<"$stats" | cut -d' ' -f2 || true)
  printf '%s\t%s\t%s\t%s\n' "$case" "$mode" "$tps" "${draft:--}" | tee -a "$ROWS"
}
for round in $(seq "$ROUNDS"); do
  for case in copy code story story-sampled; do
    case "$case" in
      story-sampled) A=(--file benches/prompts/story.txt --temp 0.8 --seed "$round") ;;
      *) A=(--file "benches/prompts/$case.txt" --greedy) ;;
    esac
    run "$case" off "${A[@]}"
    run "$case" spec "${A[@]}" --spec
  done
done
python3 - "$ROWS" <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
cases = list(dict.fromkeys(r[0] for r in rows))
print("\n| prompt | without (tok/s) | --spec (tok/s) | ratio (median of rounds) | accepted/drafted (last round) |")
print("|---|---|---|---|---|")
for c in cases:
    off = [float(r[2]) for r in rows if r[0] == c and r[1] == "off"]
    on = [float(r[2]) for r in rows if r[0] == c and r[1] == "spec"]
    ratios = [b / a for a, b in zip(off, on)]
    draft = [r[3] for r in rows if r[0] == c and r[1] == "spec"][-1]
    print(f"| {c} | {statistics.median(off):.1f} | {statistics.median(on):.1f} | {statistics.median(ratios):.2f}x | {draft} |")
PY
echo
target/release/examples/spec_engine --rounds "$ROUNDS" --threads "$THREADS" | tee "$OUT/engine.md"
if [ "${SERVERS:-0}" = 1 ]; then
  python3 scripts/spec_server_bench.py --rounds "$ROUNDS" --tokens "$N" --threads "$THREADS" | tee "$OUT/servers.md"
fi
echo "rows: $ROWS"
