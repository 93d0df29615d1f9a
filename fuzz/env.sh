# Environment for building and running the fuzz targets: `. fuzz/env.sh`
# (from the repository root or from fuzz/). See fuzz/README.md.

# cargo-fuzz passes -Z flags (-Zsanitizer=address, ...) to rustc; on a
# stable toolchain RUSTC_BOOTSTRAP=1 lets it accept them.
export RUSTC_BOOTSTRAP=1

# Build llama.cpp itself with clang, instrumented for libFuzzer's coverage
# (-fsanitize=fuzzer-no-link) and AddressSanitizer, so the fuzzer sees
# coverage inside llama.cpp and ASan checks its memory accesses. Without
# clang, llama.cpp is built uninstrumented by the default C++ compiler and
# only the Rust side gives coverage (set LLAMA_FUZZ_NO_CLANG=1 to force it).
# CMake's compiler checks only compile (no link): the ASan and libFuzzer
# runtimes come from rustc when the fuzz binary is linked, so clang's own
# runtime libraries (libclang-rt-*-dev) are not needed.
if [ -z "${LLAMA_FUZZ_NO_CLANG:-}" ]; then
    for v in "" -19 -18 -17 -16 -15 -14; do
        if command -v "clang$v" >/dev/null && command -v "clang++$v" >/dev/null; then
            LLAMA_FUZZ_CFLAGS="-fsanitize=address -fsanitize=fuzzer-no-link -fno-omit-frame-pointer -gline-tables-only"
            export LLAMA_SYS_CMAKE_DEFINES="CMAKE_C_COMPILER=clang$v;CMAKE_CXX_COMPILER=clang++$v;CMAKE_C_FLAGS=$LLAMA_FUZZ_CFLAGS;CMAKE_CXX_FLAGS=$LLAMA_FUZZ_CFLAGS;CMAKE_TRY_COMPILE_TARGET_TYPE=STATIC_LIBRARY"
            break
        fi
    done
fi

# Reuse the cmake the main build already unpacked, if there is one.
if [ -z "${CMAKE:-}" ] && ! command -v cmake >/dev/null; then
    _root=$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)
    if [ -x "$_root/target/llamacpp-sys/cmake-wheel/cmake/data/bin/cmake" ]; then
        export CMAKE="$_root/target/llamacpp-sys/cmake-wheel/cmake/data/bin/cmake"
    fi
    unset _root
fi

# ASan options that keep reports readable; libFuzzer runs the leak check.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:symbolize=1:abort_on_error=0:allocator_may_return_null=1}"
