#!/usr/bin/env bash
# Regenerates llamacpp-sys/src/bindings.rs from the headers of the llama.cpp
# source the build uses (needs libclang: `apt-get install libclang-dev`),
# and llamacpp-sys/src/bindings.headers.sha256, the sha256 of those headers
# that every build without the `bindgen` feature compares with the headers
# it builds against (build/abi.rs). The test `bindings_are_fresh` (feature
# `bindgen`) fails until this is run after a header or bindgen change;
# without `bindgen` the build itself fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
# From a source tree (the pinned one unless LLAMA_CPP_DIR says otherwise):
# an installed llama.cpp has no src/llama-ext.h, and the header list
# written from one would refuse every tree build.
unset LLAMA_SYS_LIB_DIR LLAMA_SYS_INCLUDE_DIR LLAMA_SYS_USE_PKG_CONFIG LLAMA_SYS_STATIC
out=$(cargo build -p llamacpp-sys --features bindgen --message-format=json \
  | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "build-script-executed" and m["package_id"].find("llamacpp-sys") >= 0:
        print(m["out_dir"])
' | tail -n 1)
if [ -z "$out" ] || [ ! -f "$out/bindings.rs" ] || [ ! -f "$out/bindings.headers.sha256" ]; then
  echo "regen-bindings: the bindgen build wrote no bindings (out dir: '${out}')" >&2
  exit 1
fi
cp "$out/bindings.rs" llamacpp-sys/src/bindings.rs
cp "$out/bindings.headers.sha256" llamacpp-sys/src/bindings.headers.sha256
echo "updated llamacpp-sys/src/bindings.rs and llamacpp-sys/src/bindings.headers.sha256 from $out"
