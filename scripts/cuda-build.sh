#!/usr/bin/env bash
# Compiles and links the `cuda` feature on a machine without a GPU or a
# system CUDA install (docs/gpu.md, "CUDA"): NVIDIA's toolkit from PyPI
# (scripts/cuda-toolkit.sh), then llamacpp-sys, llamacpp and the suite's test
# binaries with `cuda` (and the default CPU dispatch), for
# LLAMA_CUDA_ARCHITECTURES (default 90: H100/H200). Prints the build time
# and the sizes of the CUDA archive and the test binary. Running them
# needs a GPU and NVIDIA's driver.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
eval "$(bash scripts/cuda-toolkit.sh)"
start=$(date +%s)
cargo test -p llama-suite --no-default-features --features cuda --no-run
echo "cuda-build: built in $(($(date +%s) - start)) s (architectures $LLAMA_CUDA_ARCHITECTURES)" >&2
for archive in target/llamacpp-sys/build-*/lib/libggml-cuda.a; do
    [[ -f $archive ]] && du -h "$archive" >&2
done
ls -la target/debug/deps/it-* 2>/dev/null | grep -v '\.d$' >&2 || true
