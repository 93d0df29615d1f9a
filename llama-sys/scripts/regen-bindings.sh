#!/usr/bin/env bash
# Regenerates llama-sys/src/bindings.rs from the headers of the llama.cpp
# source the build uses (needs libclang: `apt-get install libclang-dev`).
# The test `bindings_are_fresh` (feature `bindgen`) fails until this is run
# after a header or bindgen change.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build -p llama-sys --features bindgen --message-format=json \
  | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "build-script-executed" and m["package_id"].find("llama-sys") >= 0:
        print(m["out_dir"])
' | tail -n 1 | { read -r out; cp "$out/bindings.rs" llama-sys/src/bindings.rs; echo "updated llama-sys/src/bindings.rs from $out"; }
