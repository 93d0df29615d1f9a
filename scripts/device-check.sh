#!/usr/bin/env bash
# The device check (docs/gpu.md): what a GPU machine is asked to prove, in
# one command there. That machine has nvcc, CMake, ninja and Python, no
# Rust and no network, takes 64 MiB of working tree per call and 10
# minutes per command. So the Rust side is built here and llama.cpp's CUDA
# side there, from the same source with the same CMake options:
#
#   bash scripts/device-check.sh prepare   # here (needs a workspace build)
#   bash scripts/device-check.sh run       # there, with target/device-check carried
#
# prepare: llama.cpp (vendor/llama.cpp) built here as shared libraries with
#   backend modules (GGML_BACKEND_DL) into $PREFIX, without CUDA; the
#   examples device_check and bench built in release against it through
#   pkg-config; both binaries and the llama.cpp source (without the other
#   GPU backends, tests and docs) packed into target/device-check (under
#   64 MiB; prints the sizes).
# run: the same source built there with the same options plus GGML_CUDA for
#   sm_90 (LLAMA_CUDA_ARCHITECTURES) and llama-bench, installed into the
#   same $PREFIX, where the Rust binaries find libllama and load the CUDA
#   module (llamacpp::init loads an install's modules); then
#   device_check --write-model (a synthetic 8-layer, width-2048 model in
#   Q4_K_M: no model can travel), our bench beside llama-bench (pp512,
#   tg128, every layer on the GPU), and device_check's checks
#   (teacher-forced greedy against the CPU, plan vs live per device, the
#   engine at 1 and 16 streams). Everything it prints goes to
#   $OUT/device-check.log as well (the device tool returns $OUT).
#   DEVICE_CHECK_CUDA=OFF runs the same steps without CUDA, on any machine:
#   a rehearsal of the script (device_check then stops at "no GPU device").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PACK="$ROOT/target/device-check"
PREFIX="${DEVICE_CHECK_PREFIX:-/tmp/llama-device}"
say() { printf 'device-check: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

# The CMake options of both sides (one place): shared libraries, backends
# as modules, the CPU module for x86-64-v3 (DL builds cannot be native).
cmake_options() {
    echo -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON \
        -DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DGGML_CCACHE=OFF \
        -DCMAKE_INSTALL_PREFIX="$PREFIX" -DCMAKE_INSTALL_LIBDIR=lib
}

prepare() {
    # shellcheck source=scripts/pinned-llama.sh
    source "$ROOT/scripts/pinned-llama.sh"
    local src="$ROOT/vendor/llama.cpp" build="$ROOT/target/device-check-build"
    [[ -f "$src/include/llama.h" ]] || die "no $src: build the workspace first (it fetches the pinned tree)"
    local cmake_bin
    cmake_bin="$(installed_cmake "$ROOT")" || die "no cmake"
    # shellcheck disable=SC2046
    GIT_CEILING_DIRECTORIES="$ROOT" "$cmake_bin" -S "$src" -B "$build" $(cmake_options) \
        -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_COMMIT="${PINNED_COMMIT:0:7}" >/dev/null
    "$cmake_bin" --build "$build" -j "${JOBS:-2}" >/dev/null
    rm -rf "$PREFIX"
    "$cmake_bin" --install "$build" >/dev/null
    say "llama.cpp (CPU only) installed into $PREFIX"

    (
        export LLAMA_SYS_USE_PKG_CONFIG=1 PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig"
        unset LLAMA_SYS_LIB_DIR LLAMA_SYS_INCLUDE_DIR
        cargo build --release -p llama-suite --no-default-features --example device_check --example bench \
            --target-dir "$ROOT/target/device-check-cargo"
    )
    rm -rf "$PACK"
    mkdir -p "$PACK"
    for bin in device_check bench; do
        strip -o "$PACK/$bin" "$ROOT/target/device-check-cargo/release/examples/$bin"
    done
    # The source with tools/ and common/ (for llama-bench), from the pinned
    # sdist (llamacpp-sys keeps only the library's part), less what the CUDA
    # build does not read.
    local tarball stage="$ROOT/target/device-check-src"
    tarball="$(pinned_sdist "$ROOT")" || die "cannot get the pinned sdist"
    rm -rf "$stage" && mkdir -p "$stage"
    local top
    # awk reads the whole list: `| head -1` would end tar with SIGPIPE,
    # which pipefail turns into a failure.
    top="$(tar -tzf "$tarball" | awk -F/ 'NR == 1 { print $1 }')"
    tar -xzf "$tarball" -C "$stage" --strip-components=2 "$top/vendor/llama.cpp"
    rm -rf "$stage/llama.cpp/.git"
    tar -C "$stage" -cJf "$PACK/llama.cpp.tar.xz" \
        --exclude='llama.cpp/ggml/src/ggml-vulkan' --exclude='llama.cpp/ggml/src/ggml-metal' \
        --exclude='llama.cpp/ggml/src/ggml-sycl' --exclude='llama.cpp/ggml/src/ggml-opencl' \
        --exclude='llama.cpp/ggml/src/ggml-cann' --exclude='llama.cpp/ggml/src/ggml-musa' \
        --exclude='llama.cpp/ggml/src/ggml-webgpu' --exclude='llama.cpp/ggml/src/ggml-zdnn' \
        --exclude='llama.cpp/ggml/src/ggml-hexagon' --exclude='llama.cpp/ggml/src/ggml-openvino' \
        --exclude=llama.cpp/models --exclude=llama.cpp/docs --exclude=llama.cpp/examples \
        --exclude=llama.cpp/tests --exclude=llama.cpp/media --exclude=llama.cpp/gguf-py \
        --exclude='llama.cpp/tools/server/webui' --exclude='llama.cpp/tools/server/public*' \
        llama.cpp
    echo "${PINNED_COMMIT:0:7}" >"$PACK/commit"
    du -b "$PACK"/* >&2
    local total
    total=$(du -sb "$PACK" | cut -f1)
    ((total < 60 * 1024 * 1024)) || die "target/device-check is $total bytes: over the 64 MiB a device call carries"
    say "packed $total bytes into $PACK; carry target/device-check and run: bash scripts/device-check.sh run"
}

run() {
    [[ -x "$PACK/device_check" ]] || die "no $PACK/device_check: run \`bash scripts/device-check.sh prepare\` here first and carry target/device-check"
    local out="${OUT:-$ROOT/target/device-check-out}"
    mkdir -p "$out"
    exec > >(tee "$out/device-check.log") 2>&1
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    local jobs
    jobs="$(nproc)"
    local src=/tmp/device-check-src build=/tmp/device-check-build start
    local cuda="${DEVICE_CHECK_CUDA:-ON}" targets=(llama-bench ggml-cpu llama) generator=()
    [[ $cuda == ON ]] && targets+=(ggml-cuda)
    command -v ninja >/dev/null && generator=(-G Ninja)
    if [[ ! -f "$PREFIX/.built-cuda-$cuda" ]]; then
        start=$(date +%s)
        rm -rf "$src" && mkdir -p "$src" && tar -C "$src" -xJf "$PACK/llama.cpp.tar.xz"
        # shellcheck disable=SC2046
        cmake "${generator[@]}" -S "$src/llama.cpp" -B "$build" $(cmake_options) \
            -DGGML_CUDA="$cuda" -DCMAKE_CUDA_ARCHITECTURES="${LLAMA_CUDA_ARCHITECTURES:-90}" -DGGML_CUDA_NCCL=OFF \
            -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_COMMIT="$(cat "$PACK/commit")" >/dev/null
        cmake --build "$build" -j "$jobs" --target "${targets[@]}" >/dev/null
        # Copied, not `cmake --install`, which wants every tool built. The
        # libraries in lib/, where the Rust binaries were linked to find
        # them; the backend modules in bin/ too, beside llama-bench (ggml
        # looks beside the executable; llamacpp::init in the install's lib/
        # and bin/).
        rm -rf "$PREFIX"
        mkdir -p "$PREFIX/lib" "$PREFIX/bin"
        cp -a "$build"/bin/*.so* "$PREFIX/lib/"
        cp -a "$build"/bin/libggml-c[pu]*.so "$PREFIX/bin/"
        cp "$build/bin/llama-bench" "$PREFIX/bin/"
        touch "$PREFIX/.built-cuda-$cuda"
        say "llama.cpp (GGML_CUDA=$cuda) built and installed into $PREFIX in $(($(date +%s) - start)) s"
    fi
    export LD_LIBRARY_PATH="$PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    local model=/tmp/device-check-model.gguf threads=$((jobs < 16 ? jobs : 16))
    "$PACK/device_check" --write-model "$model" -t "$threads" -n 256 || say "device_check failed"
    say "our bench, then llama-bench of the same source and options (every layer on the GPU)"
    "$PACK/bench" -m "$model" -p 512 -n 128 -r 5 -t "$threads" --ngl 99 || say "bench failed"
    "$PREFIX/bin/llama-bench" -m "$model" -p 512 -n 128 -r 5 -t "$threads" -ngl 99 || say "llama-bench failed"
}

case "${1:-}" in
    prepare) prepare ;;
    run) run ;;
    *) die "usage: scripts/device-check.sh prepare|run" ;;
esac
