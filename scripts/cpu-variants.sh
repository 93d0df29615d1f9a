#!/usr/bin/env bash
# How the CPU-tuning choices of llamacpp-sys compare on this machine: the
# build time of llama.cpp and pp512/tg128 for
#
#   native    the `native` feature (GGML_NATIVE: -march=native)
#   portable  no `native`, no -C target-cpu: baseline x86-64 (SSE2 only)
#   v3        no `native`, RUSTFLAGS=-C target-cpu=x86-64-v3 (AVX2, FMA, F16C)
#   rustnat   no `native`, RUSTFLAGS=-C target-cpu=native (rustc's features
#             mapped to GGML_AVX512 etc.)
#   dispatch  llama.cpp's runtime CPU dispatch (GGML_BACKEND_DL +
#             GGML_CPU_ALL_VARIANTS, shared libraries): llama-bench only,
#             beside llama-bench built native
#
# Step `build` compiles everything (heavy; run it alone), step `bench`
# runs the benchmarks in interleaved rounds (run it on an idle machine).
# Everything lives in target/cpu-variants/ (gitignored).
#
# Usage: scripts/cpu-variants.sh build | bench [ROUNDS]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/pinned-llama.sh
source "$ROOT/scripts/pinned-llama.sh"
OUT="$ROOT/target/cpu-variants"
JOBS="${JOBS:-2}"
THREADS="${THREADS:-2}"
MODEL="${LLAMA_MODEL:-${LLAMA_CACHE_DIR:-$HOME/.cache/llama-rs}/gemma-3-270m-q4_k_m.gguf}"
mkdir -p "$OUT"
cd "$ROOT"

say() { printf 'cpu-variants: %s\n' "$*" >&2; }

# The llama.cpp tree with its tools (for llama-bench), extracted once.
tools_tree() {
    local src="$OUT/src"
    if [[ ! -f "$src/tools/llama-bench/llama-bench.cpp" ]]; then
        local tarball staging="$OUT/.src-partial-$$"
        tarball="$(pinned_sdist "$ROOT")"
        rm -rf "$staging" && mkdir -p "$staging"
        tar -xzf "$tarball" -C "$staging" --strip-components=3 "$SDIST_PREFIX/"
        rm -rf "$staging/.git" "$src"
        mv "$staging" "$src"
    fi
    echo "$src"
}

# cmake_build NAME DEFINES... : configures a fresh build of llama.cpp with
# llamacpp-sys's library defines plus DEFINES, builds the `llama` target and
# then llama-bench, and records the library's build time.
cmake_build() {
    local name="$1"; shift
    local cmake src dir start
    cmake="$(installed_cmake "$ROOT")"; src="$(tools_tree)"; dir="$OUT/cmake-$name"
    rm -rf "$dir"
    export GIT_CEILING_DIRECTORIES="$OUT"
    "$cmake" -S "$src" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_NUMBER=0 -DLLAMA_BUILD_COMMIT="${PINNED_COMMIT:0:7}" -DGGML_CCACHE=OFF \
        -DGGML_OPENMP=ON -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON "$@" >/dev/null
    start=$(date +%s)
    # `all` of the library part: libllama and, with GGML_BACKEND_DL, every
    # CPU variant module (they are not dependencies of libllama).
    "$cmake" --build "$dir" -j "$JOBS" --target llama $( [[ "$*" == *GGML_BACKEND_DL=ON* ]] && \
        "$cmake" --build "$dir" --target help | sed -n 's/^\.\.\. \(ggml-cpu-[a-z0-9_-]*\)$/\1/p' | tr '\n' ' ') >/dev/null
    echo "$(( $(date +%s) - start ))" > "$OUT/build-seconds-$name"
    "$cmake" --build "$dir" -j "$JOBS" --target llama-bench >/dev/null
    say "$name: llama.cpp library built in $(cat "$OUT/build-seconds-$name") s"
}

# cargo_build NAME RUSTFLAGS CARGO-ARGS... : the bench example in a target
# folder of its own, and the cold build time of llamacpp-sys's build script.
cargo_build() {
    local name="$1" flags="$2"; shift 2
    local target="$OUT/target-$name" start
    rm -rf "$target"
    start=$(date +%s)
    RUSTFLAGS="$flags" CARGO_TARGET_DIR="$target" cargo build --release --quiet --example bench "$@"
    echo "$(( $(date +%s) - start ))" > "$OUT/cargo-seconds-$name"
    say "$name: cold cargo build --release --example bench in $(cat "$OUT/cargo-seconds-$name") s"
}

build() {
    cmake_build native -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON -DGGML_BACKEND_DL=OFF
    cmake_build portable -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=OFF \
        -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF -DGGML_BMI2=OFF -DGGML_SSE42=OFF
    cmake_build dispatch -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON
    # The workspace's default without `rpc` (the other rows have none either).
    cargo_build native "" --no-default-features --features native
    cargo_build portable "" --no-default-features
    cargo_build v3 "-C target-cpu=x86-64-v3" --no-default-features
    cargo_build rustnat "-C target-cpu=native" --no-default-features
}

bench() {
    local rounds="${1:-4}" r name
    [[ -f "$MODEL" ]] || { say "no model at $MODEL; run the tests once or set LLAMA_MODEL"; exit 1; }
    for r in $(seq 1 "$rounds"); do
        for name in native portable v3 rustnat; do
            "$OUT/target-$name/release/examples/bench" -m "$MODEL" -p 512 -n 128 -r 3 -t "$THREADS" \
                | sed -n 's/^|.*| \(pp512\|tg128\) | \([0-9.]*\).*$/\1 \2/p' \
                | while read -r test tps; do echo "$r crate-$name $test $tps"; done
        done
        for name in native dispatch; do
            (cd "$OUT/cmake-$name/bin" && ./llama-bench -m "$MODEL" -p 512 -n 128 -r 3 -t "$THREADS" -o csv 2>/dev/null) \
                | python3 -c '
import csv, sys
for row in csv.DictReader(sys.stdin):
    test = ("pp%s" % row["n_prompt"]) if int(row["n_prompt"]) else ("tg%s" % row["n_gen"])
    print(sys.argv[1], "llama-bench-" + sys.argv[2], test, row["avg_ts"])
' "$r" "$name"
        done
    done | tee "$OUT/bench.txt"
    python3 - "$OUT" <<'PY'
import collections, statistics, sys, pathlib
out = pathlib.Path(sys.argv[1])
runs = collections.defaultdict(list)
for line in (out / "bench.txt").read_text().split("\n"):
    if line.strip():
        _, name, test, tps = line.split()
        runs[(name, test)].append(float(tps))
def med(name, test):
    return statistics.median(runs[(name, test)])
print("| variant | llama.cpp build (s) | pp512 t/s | tg128 t/s | pp512 / native | tg128 / native |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for name in ["crate-native", "crate-portable", "crate-v3", "crate-rustnat", "llama-bench-native", "llama-bench-dispatch"]:
    base = "llama-bench-native" if name.startswith("llama-bench") else "crate-native"
    variant = name.split("-")[-1]
    secs = out / f"build-seconds-{variant}"
    build = secs.read_text().strip() if secs.exists() and variant in ("native", "portable", "dispatch") else ""
    print(f"| {name} | {build} | {med(name, 'pp512'):.1f} | {med(name, 'tg128'):.1f} | "
          f"{med(name, 'pp512') / med(base, 'pp512'):.3f} | {med(name, 'tg128') / med(base, 'tg128'):.3f} |")
PY
}

case "${1:-}" in
    build) build ;;
    bench) bench "${2:-4}" ;;
    *) echo "usage: scripts/cpu-variants.sh build | bench [ROUNDS]" >&2; exit 2 ;;
esac
