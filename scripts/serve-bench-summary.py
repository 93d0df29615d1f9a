#!/usr/bin/env python3
"""Medians over rounds of serve_bench JSON rows (scripts/serve-bench-compare.sh).

Usage: scripts/serve-bench-summary.py target/serve-bench/<time>/rows.jsonl
"""
import json
import statistics
import sys
from collections import defaultdict

KEYS = [
    "tok_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms",
    "short_ttft_p50_ms", "short_ttft_max_ms", "long_ttft_ms", "running_itl_p50_ms", "running_itl_max_ms",
    "ttft_a_ms", "ttft_b_ms", "ttft_c_ms", "cached_b",
]

def main(path):
    groups = defaultdict(list)
    order = []
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            key = (row["scenario"], row["level"], row["run"])
            if key not in groups:
                order.append(key)
            groups[key].append(row)
    order.sort(key=lambda k: (k[0], k[1], k[2]))
    for key in order:
        rows = groups[key]
        parts = []
        for k in KEYS:
            values = [r[k] for r in rows if isinstance(r.get(k), (int, float))]
            if values:
                parts.append(f"{k}={statistics.median(values):.1f}")
        print(f"{key[0]:<11} {key[1]:<18} {key[2]:<18} n={len(rows)} " + " ".join(parts))

if __name__ == "__main__":
    main(sys.argv[1])
