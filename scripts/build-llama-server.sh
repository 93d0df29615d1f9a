#!/usr/bin/env bash
# Builds llama.cpp's own `llama-server` and `llama-bench` from the SAME pinned
# llama.cpp source that llamacpp-sys links (llama-cpp-python 0.3.36's sdist,
# upstream commit 0c1e570), with the same CMake defines as llamacpp-sys
# (llamacpp-sys/build/features.rs `cmake_defines`, default features native +
# openmp), except that the common library, tools and server are switched on.
# Used as the reference side of llama-serve/examples/serve_bench and loadgen.
#
# Everything lives under target/ (gitignored):
#   target/llamacpp-sys/download/llama_cpp_python-0.3.36.tar.gz  the sdist (shared with llamacpp-sys)
#   target/llama-tools/src     its vendor/llama.cpp/ subtree, in full
#   target/llama-tools/build   the CMake build; binaries in build/bin/
#   target/llama-tools/venv    a venv with pip's cmake, only if no cmake is found
#
# Usage (from anywhere; heavy, so nice it on a shared machine):
#   nice -n 19 scripts/build-llama-server.sh            # -j2
#   JOBS=8 scripts/build-llama-server.sh
# Environment: JOBS (parallel jobs, default 2), CMAKE (a cmake to use),
# EXTRA_TARGETS (more tools, e.g. llama-mtmd-cli),
# PYTHON (interpreter for pip, default python3), GGML_NATIVE (ON/OFF,
# default ON as with the workspace's default `native` feature), GGML_RPC
# (ON: the RPC backend too, as with the `rpc` feature, in
# target/llama-tools/build-rpc, with llama.cpp's worker ggml-rpc-server;
# its path is printed third).
#
# The web UI is not embedded: LLAMA_BUILD_UI=OFF (no npm build) and
# LLAMA_USE_PREBUILT_UI=OFF (no download of prebuilt assets from Hugging
# Face at build time); the server then serves its API only.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/pinned-llama.sh
source "$ROOT/scripts/pinned-llama.sh"

TOOLS_DIR="$ROOT/target/llama-tools"
SRC_DIR="$TOOLS_DIR/src"
BUILD_DIR="$TOOLS_DIR/build"
VENV_DIR="$TOOLS_DIR/venv"
JOBS="${JOBS:-2}"
PYTHON="${PYTHON:-python3}"
NATIVE="${GGML_NATIVE:-ON}"
RPC="${GGML_RPC:-OFF}"
TARGETS=(llama-server llama-bench)
# EXTRA_TARGETS: more of llama.cpp's tools, space-separated (llama-mtmd-cli
# for scripts/mtmd-parity.sh); their paths are printed after the others.
read -r -a EXTRA <<< "${EXTRA_TARGETS:-}"
TARGETS+=("${EXTRA[@]}")
if [[ "$RPC" == ON ]]; then
    BUILD_DIR="$TOOLS_DIR/build-rpc"
    TARGETS+=(ggml-rpc-server)
fi

# The sdist's tree carries a `.git` file (a stale submodule pointer of
# llama-cpp-python's); it is removed, and git is kept from walking up into
# this repository, so llama.cpp's CMake finds no git repository at all and
# uses the build number and commit given below.
export GIT_CEILING_DIRECTORIES="$TOOLS_DIR"

say() { printf 'build-llama-server: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

# 1. The sdist, verified.
TARBALL="$(pinned_sdist "$ROOT")" || die "cannot get the pinned sdist"

# 2. The vendor/llama.cpp/ subtree, extracted once (into a staging folder,
#    renamed into place, so an interrupted run leaves no half tree).
STAMP="$SRC_DIR/.sdist-sha256"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$SDIST_SHA256" ]]; then
    say "extracting $SDIST_PREFIX/ into $SRC_DIR"
    mkdir -p "$TOOLS_DIR"
    staging="$TOOLS_DIR/.src-partial-$$"
    rm -rf "$staging"
    mkdir -p "$staging"
    tar -xzf "$TARBALL" -C "$staging" --strip-components=3 "$SDIST_PREFIX/"
    [[ -f "$staging/include/llama.h" && -f "$staging/tools/server/CMakeLists.txt" ]] \
        || die "the extracted tree in $staging has no include/llama.h or tools/server"
    rm -rf "$staging/.git"
    echo "$PINNED_COMMIT" > "$staging/.pinned-commit"
    echo "$SDIST_SHA256" > "$staging/.sdist-sha256"
    rm -rf "$SRC_DIR"
    mv "$staging" "$SRC_DIR"
fi

rm -rf "$SRC_DIR/.git"  # trees extracted before the line above

# 3. cmake: $CMAKE, cmake on PATH, the cmake wheel llamacpp-sys's build
#    script already unpacked, else pip's cmake in a venv of our own.
if ! CMAKE_BIN="$(installed_cmake "$ROOT" 2>/dev/null)"; then
    if ! "$VENV_DIR/bin/cmake" --version >/dev/null 2>&1; then
        say "no cmake found; installing pip's cmake into $VENV_DIR"
        "$PYTHON" -m venv "$VENV_DIR"
        "$VENV_DIR/bin/pip" install --disable-pip-version-check -q cmake
    fi
    CMAKE_BIN="$VENV_DIR/bin/cmake"
fi
"$CMAKE_BIN" --version >/dev/null 2>&1 || die "cmake ($CMAKE_BIN) does not run"
say "using $("$CMAKE_BIN" --version | head -n1) ($CMAKE_BIN)"

# 4. Configure and build. The first block is llamacpp-sys's cmake_defines for
#    its default features (native, openmp) on Linux; the second what differs.
#    A native x86-64 build leaves AMX out, as llamacpp-sys's does
#    (features.rs `compile_flags`): ggml's AMX kernels crash on this
#    project's Xeon VM (docs/building.md, "AMX").
AMX_OFF=""
if [[ "$NATIVE" == ON && "$(uname -m)" == x86_64 ]]; then
    AMX_OFF="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
"$CMAKE_BIN" -S "$SRC_DIR" -B "$BUILD_DIR" \
    -DCMAKE_C_FLAGS="$AMX_OFF" \
    -DCMAKE_CXX_FLAGS="$AMX_OFF" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
    -DCMAKE_INSTALL_LIBDIR=lib \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_NUMBER=0 \
    -DLLAMA_BUILD_COMMIT="${PINNED_COMMIT:0:7}" \
    -DGGML_CCACHE=OFF \
    -DGGML_BACKEND_DL=OFF \
    -DGGML_OPENMP=ON \
    -DGGML_NATIVE="$NATIVE" \
    -DGGML_CUDA=OFF \
    -DGGML_METAL=OFF \
    -DGGML_VULKAN=OFF \
    -DGGML_RPC="$RPC" \
    -DGGML_RPC_RDMA=OFF \
    -DGGML_BLAS=OFF \
    \
    -DLLAMA_BUILD_COMMON=ON \
    -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF

"$CMAKE_BIN" --build "$BUILD_DIR" --config Release -j "$JOBS" --target "${TARGETS[@]}"

SERVER="$BUILD_DIR/bin/llama-server"
BENCH="$BUILD_DIR/bin/llama-bench"
[[ -x "$SERVER" ]] || die "the build finished but $SERVER is missing"
[[ -x "$BENCH" ]] || die "the build finished but $BENCH is missing"
"$SERVER" --version >&2
echo "$SERVER"
echo "$BENCH"
if [[ "$RPC" == ON ]]; then
    [[ -x "$BUILD_DIR/bin/ggml-rpc-server" ]] || die "the build finished but ggml-rpc-server is missing"
    echo "$BUILD_DIR/bin/ggml-rpc-server"
fi
for t in "${EXTRA[@]}"; do
    [[ -x "$BUILD_DIR/bin/$t" ]] || die "the build finished but $BUILD_DIR/bin/$t is missing"
    echo "$BUILD_DIR/bin/$t"
done
