#!/usr/bin/env bash
# Per-token cost of constrained decoding on the default model, side by side:
# `generate --json-schema` (llguidance, exact masked distribution; the
# example's tight options) against the same prompt unconstrained for the
# same number of tokens, greedy and sampled, interleaved over ROUNDS, for
# the schemas in benches/schemas (flat, nested, recursive); and the GBNF
# path (`--json-gbnf`: pick-then-check, and `--grammar-first`: masked).
#
#   scripts/constraint-bench.sh            # ROUNDS=3
#
# Prints one row per run (schema, mode, tokens, ms/token) and a table of
# medians of the ratio constrained ÷ unconstrained (ms per token).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
ROUNDS="${ROUNDS:-3}"
THREADS="${THREADS:-2}"
PROMPT="${PROMPT:-A record in JSON:}"
cargo build --release --example generate
G=target/release/examples/generate
OUT="${OUT:-target/constraint-bench/$(date -u +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
ROWS="$OUT/rows.tsv"
: >"$ROWS"
# run NAME MODE ARGS...: one generation; appends "schema mode tokens ms/token".
run() {
  local schema="$1" mode="$2"; shift 2
  local stats
  # A document cut at -n is an error exit; its statistics line still counts.
  stats=$("$G" --threads "$THREADS" --prompt "$PROMPT" "$@" 2>&1 >/dev/null | grep '^prompt' | tail -1 || true)
  local n ms
  n=$(sed -E 's/.*generated ([0-9]+) tokens.*/\1/' <<<"$stats")
  ms=$(sed -E 's/.* ([0-9.]+) ms\/token.*/\1/' <<<"$stats")
  printf '%s\t%s\t%s\t%s\n' "$schema" "$mode" "$n" "$ms" | tee -a "$ROWS"
}
for round in $(seq "$ROUNDS"); do
  for schema in flat nested recursive; do
    S=benches/schemas/$schema.json
    for pick in greedy sampled; do
      if [ "$pick" = greedy ]; then P=(--greedy); else P=(--temp 0.8 --seed "$round"); fi
      # The constrained run decides the length; the others generate as many.
      run "$schema" "$pick/llguidance" --json-schema "$S" -n 400 "${P[@]}"
      n=$(tail -1 "$ROWS" | cut -f3)
      run "$schema" "$pick/none" -n "$n" "${P[@]}"
      run "$schema" "$pick/gbnf-checked" --json-schema "$S" --json-gbnf -n "$n" "${P[@]}"
      run "$schema" "$pick/gbnf-masked" --json-schema "$S" --json-gbnf --grammar-first -n "$n" "${P[@]}"
    done
  done
done
python3 - "$ROWS" <<'PY'
import sys, statistics, collections
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
ms = collections.defaultdict(list)
for schema, mode, n, t in rows:
    try: ms[(schema, mode)].append((int(n), float(t)))
    except ValueError: pass
print("\nschema     mode                 tokens  ms/token (median)  ratio to none")
for (schema, mode), v in sorted(ms.items()):
    pick = mode.split("/")[0]
    base = statistics.median(t for _, t in ms.get((schema, pick + "/none"), [(0, float("nan"))]))
    med = statistics.median(t for _, t in v)
    print(f"{schema:<10} {mode:<20} {statistics.median(n for n, _ in v):>6}  {med:>8.2f}           {med / base:.2f}x")
PY
