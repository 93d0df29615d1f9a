#!/usr/bin/env python3
"""Medians over rounds of llama-serve/examples/loadgen's JSON rows, ours beside
llama-server's, with the ratio. Usage: loadgen-summary.py rows.jsonl"""
import json
import statistics
import sys
from collections import defaultdict

rows = defaultdict(list)  # (row, label) -> [json]
order = []
with open(sys.argv[1]) as f:
    for line in f:
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        key = (r["row"], r["label"])
        if r["row"] not in order:
            order.append(r["row"])
        rows[key].append(r)


def med(key, path):
    vals = []
    for r in rows.get(key, []):
        v = r
        for p in path.split("."):
            v = v.get(p) if isinstance(v, dict) else None
        if v is not None:
            vals.append(v)
    return statistics.median(vals) if vals else None


def fmt(v, digits=1):
    return "-" if v is None else f"{v:.{digits}f}"


def ratio(a, b):
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"


METRICS = [("tok_s", "tok/s"), ("ttft_p50_ms", "TTFT p50"), ("ttft_p99_ms", "TTFT p99"),
           ("itl_p50_ms", "ITL p50"), ("itl_p99_ms", "ITL p99"),
           ("e2e_p50_ms", "e2e p50"), ("e2e_p99_ms", "e2e p99")]
print("row | metric | ours | llama-server | ours/llama-server | rounds | errors+incomplete (ours, llama-server)")
for row in order:
    groups = [""]
    if row == "long-short":
        groups = ["", "long.", "short."]
    ours, theirs = (row, "ours"), (row, "llama-server")
    fails = [sum(r["errors"] + r["incomplete"] for r in rows.get(k, [])) for k in (ours, theirs)]
    n = min(len(rows.get(ours, [])), len(rows.get(theirs, [])))
    for g in groups:
        for m, name in METRICS:
            if g == "" and row == "long-short" and m != "tok_s":
                continue
            a, b = med(ours, g + m), med(theirs, g + m)
            print(f"{row} | {g}{name} | {fmt(a)} | {fmt(b)} | {ratio(a, b)} | {n} | {fails[0]}, {fails[1]}")
    if row.startswith("shared-prefix"):
        a, b = med(ours, "cached_tokens_p50"), med(theirs, "cached_tokens_p50")
        print(f"{row} | cached prompt tokens p50 | {fmt(a, 0)} | {fmt(b, 0)} | - | {n} | {fails[0]}, {fails[1]}")
