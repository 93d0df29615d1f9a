#!/usr/bin/env bash
# llamacpp-sys's system-library mode, end to end:
#
# 1. shared, with backend modules: the pinned llama.cpp (vendor/llama.cpp,
#    which a workspace build fetches) configured, built and installed by its
#    own CMake into target/system-llama/prefix with shared libraries and
#    GGML_BACKEND_DL (its CPU backend a module, bin/libggml-cpu.so, for
#    x86-64-v3: DL builds cannot be GGML_NATIVE); then the real-model tests
#    built against it through pkg-config (LLAMA_SYS_USE_PKG_CONFIG=1 and the
#    llama.pc it installed), run with LD_LIBRARY_PATH pointing at it,
#    checked to load its libllama.so and no CPU backend at link time: they
#    pass only if `llamacpp::init` loads the module from the install;
# 2. static: the pinned llama.cpp configured, built and installed by its own
#    CMake as static archives with its default CPU tuning (GGML_NATIVE, AMX
#    left out as every build here does), into target/system-llama/static,
#    linked through LLAMA_SYS_LIB_DIR, and checked to load no libllama.so;
# 3. bindgen: bindings generated from those installed headers (one folder,
#    no src/) equal the checked-in ones.
#
# Usage: scripts/system-llama.sh   (after a workspace build, e.g. cargo test,
# which fetches the pinned tree)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/pinned-llama.sh
source "$ROOT/scripts/pinned-llama.sh"
OUT="$ROOT/target/system-llama"
SRC="$ROOT/vendor/llama.cpp"
JOBS="${JOBS:-2}"
# The real-model tests that need no llama.cpp test data (SOURCE_DIR is
# empty for an installed llama.cpp). plan compares llama.cpp's memory
# breakdown byte for byte, through the shim's own declaration of it.
# The suite's `it` binary, filtered (libtest's filters) to every path
# through libllama: generation, the engine's batched decode, the grammar
# sampler, embeddings, memory plans. One engine and one embedding test:
# their others are the same calls at greater length (the native stage
# runs them all).
TESTS=(--test it)
FILTERS=(generate::real:: engine::real::sixteen_copy_tasks_at_once_are_all_right json_schema::real::
    embed::batched_equals_one_at_a_time plan::)
# The workspace's default features without `rpc`: these installs have no
# RPC backend (a backend feature the install lacks is a build error).
# `native` stays: tests/it/plan.rs expects the CPU_REPACK buffer that a native
# llama.cpp (CMake's default, GGML_NATIVE=ON) has.
FEATURES=(--no-default-features --features native)

say() { printf 'system-llama: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }
cd "$ROOT"
[[ -f "$SRC/include/llama.h" ]] || die "no $SRC: build the workspace first (it fetches the pinned tree)"
cmake_bin="$(installed_cmake "$ROOT")" || die "no cmake"
unset LLAMA_CPP_DIR LLAMA_SYS_LIB_DIR LLAMA_SYS_INCLUDE_DIR LLAMA_SYS_USE_PKG_CONFIG LLAMA_SYS_STATIC

# The first test executable cargo builds for TESTS (building them all).
first_test_binary() {
    local all
    all="$(test_binaries)" || die "cargo could not build the tests: rerun \`cargo test -p llama-suite ${FEATURES[*]} ${TESTS[*]} --no-run\`"
    echo "${all%%$'\n'*}"
}

# The test executables cargo builds for TESTS, one per line.
test_binaries() {
    cargo test -p llama-suite "${FEATURES[@]}" "${TESTS[@]}" --no-run --message-format=json 2>/dev/null \
        | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])
'
}

# 1. Shared libraries through pkg-config.
prefix="$OUT/prefix"
if [[ ! -f "$prefix/lib/pkgconfig/llama.pc" || ! -f "$prefix/bin/libggml-cpu.so" ]]; then
    rm -rf "$OUT/build" "$prefix"
    start=$(date +%s)
    # Outside git: llama.cpp's CMake would take this repository's commit.
    GIT_CEILING_DIRECTORIES="$ROOT" "$cmake_bin" -S "$SRC" -B "$OUT/build" -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_COMMIT="${PINNED_COMMIT:0:7}" \
        -DGGML_BACKEND_DL=ON -DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
        -DGGML_F16C=ON -DGGML_BMI2=ON \
        -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR=lib >/dev/null
    "$cmake_bin" --build "$OUT/build" -j "$JOBS" >/dev/null
    "$cmake_bin" --install "$OUT/build" >/dev/null
    say "llama.cpp built and installed by its CMake into $prefix in $(( $(date +%s) - start )) s"
fi
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
export LLAMA_SYS_USE_PKG_CONFIG=1
export LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bin="$(first_test_binary)"
[[ -n "$bin" ]] || die "cargo built no test binary"
# ldd's output is read whole first: `ldd | grep -q` under pipefail fails
# whenever grep exits before ldd has written everything (SIGPIPE).
libs="$(ldd "$bin")"
grep -q "libllama.so.* => $prefix/lib/" <<<"$libs" \
    || die "$bin does not load $prefix/lib/libllama.so: $(grep -E 'llama|ggml' <<<"$libs")"
if grep -q "libggml-cpu" <<<"$libs"; then die "$bin links a CPU backend; it must load the module: $libs"; fi
say "shared: $(basename "$bin") loads $(sed -n 's/.*\(libllama[^ ]*\) => \([^ ]*\).*/\1 from \2/p' <<<"$libs")"
cargo test -p llama-suite "${FEATURES[@]}" "${TESTS[@]}" -- "${FILTERS[@]}"
unset PKG_CONFIG_PATH LLAMA_SYS_USE_PKG_CONFIG

# 2. Static archives through LLAMA_SYS_LIB_DIR: the link line read off the
#    install's ggml-config.cmake, checked on the greedy-output and memory
#    tests (the shared run above has the whole set; CI time is finite).
#    The position-independent code a Rust executable (PIE) links, and no
#    AMX kernels (they crash at the pin: docs/building.md).
FILTERS=(generate::real:: plan::)
static_lib="$OUT/static"
if [[ ! -f "$static_lib/lib/cmake/ggml/ggml-config.cmake" ]]; then
    rm -rf "$OUT/static-build" "$static_lib"
    start=$(date +%s)
    no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    GIT_CEILING_DIRECTORIES="$ROOT" "$cmake_bin" -S "$SRC" -B "$OUT/static-build" -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_COMMON=OFF \
        -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_COMMIT="${PINNED_COMMIT:0:7}" \
        -DCMAKE_C_FLAGS="$no_amx" -DCMAKE_CXX_FLAGS="$no_amx" \
        -DCMAKE_INSTALL_PREFIX="$static_lib" -DCMAKE_INSTALL_LIBDIR=lib >/dev/null
    "$cmake_bin" --build "$OUT/static-build" -j "$JOBS" >/dev/null
    "$cmake_bin" --install "$OUT/static-build" >/dev/null
    say "llama.cpp built and installed static by its CMake into $static_lib in $(( $(date +%s) - start )) s"
fi
grep -q 'set(GGML_NATIVE "ON")' "$static_lib/lib/cmake/ggml/ggml-config.cmake" \
    || die "the static install in $static_lib is not llama.cpp's default (native) build"
export LLAMA_SYS_LIB_DIR="$static_lib/lib"
bin="$(first_test_binary)"
libs="$(ldd "$bin")"
if grep -q 'libllama' <<<"$libs"; then die "$bin loads a shared libllama: $(grep llama <<<"$libs")"; fi
say "static: $(basename "$bin") links the archives in $static_lib (no libllama.so)"
cargo test -p llama-suite "${FEATURES[@]}" "${TESTS[@]}" -- "${FILTERS[@]}"

# 3. The `bindgen` feature on installed headers (one folder, no src/):
#    bindings generated from them equal the checked-in ones.
cargo test -p llamacpp-sys --features bindgen --test bindings_fresh
say "ok"
