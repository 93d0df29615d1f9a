#!/usr/bin/env bash
# Packages llama-sys and llama as a user of the Rust registry gets them, and
# proves the packages build and run on their own.
#
# 1. Bundles the pinned llama.cpp into llama-sys/llama.cpp (gitignored, in
#    llama-sys's `include`): from the verified sdist, only what the library
#    build needs (the CMake files, include/, src/, ggml/ with the CPU, CUDA,
#    Metal, Vulkan, RPC and BLAS backends, vendor/'s CMake targets, the
#    licences). Never committed; removed again on exit unless --keep.
# 0. Unless --no-verify: the checkout's own greedy output, for step 3.
# 2. `cargo package -p llama-sys -p llama` (cargo's own verification off:
#    step 3 builds the same .crate files, offline, as a dependent would,
#    which proves more and saves a third llama.cpp build): the .crate files
#    in target/package/, each checked to be under the registry's 10 MiB.
# 3. Unless --no-verify: unpacks both .crate files into a new folder outside
#    this repository, with a consumer crate that depends on `llama` and
#    patches crates.io's `llama-sys` with the unpacked one (the registry as
#    it would be after publishing both), builds it with the network cut off
#    (`unshare -rn` where the kernel allows it, and always cargo --offline,
#    no pip: PYTHON points nowhere), runs the README's first example on the
#    default model, and checks that the build wrote nothing into the
#    unpacked packages.
#
# Usage: scripts/package.sh [--keep] [--no-verify]
# Environment: CMAKE (the cmake the offline build uses; default: cmake on
# PATH, else the wheel a checkout build fetched into target/llama-sys/),
# LLAMA_MODEL (the model to run; default: the cached default model).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/pinned-llama.sh
source "$ROOT/scripts/pinned-llama.sh"
BUNDLE="$ROOT/llama-sys/llama.cpp"
LIMIT=$((10 * 1024 * 1024))
# The packaged crates build runtime CPU dispatch from the bundle with two of
# ggml's CPU variants (the baseline and this one) instead of all fourteen:
# the machinery is the same, CI's portable stage builds all of them from
# the checkout, and the other twelve would add six minutes here. The text
# is compared with this variant forced on both sides, so the same kernels
# run (any x86-64 CPU since 2013 has AVX2).
CPU_VARIANT="${CPU_VARIANT:-haswell}"

keep=0
verify=1
for arg in "$@"; do
    case "$arg" in
        --keep) keep=1 ;;
        --no-verify) verify=0 ;;
        *) echo "usage: scripts/package.sh [--keep] [--no-verify]" >&2; exit 2 ;;
    esac
done

say() { printf 'package: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

check_dir=""
cleanup() {
    if [[ $keep == 0 ]]; then
        rm -rf "$BUNDLE"
        [[ -n "$check_dir" ]] && rm -rf "$check_dir"
    fi
    rm -rf "$ROOT/llama-sys/.llama.cpp.partial-$$"
}
trap cleanup EXIT

# 0. What the checkout's own build (vendor/llama.cpp, before the bundle
#    exists: the build prefers a bundle) generates in the packages' default
#    configuration (portable, OpenMP: the suite without its `native` and
#    `rpc` defaults), for the packaged crates to match: the same kernels,
#    so the same tokens.
rm -rf "$BUNDLE"
if [[ $verify == 1 ]]; then
    # The default model as llama-model-cache (model-cache/) caches it (the tests fetch it), or LLAMA_MODEL.
    model="${LLAMA_MODEL:-${LLAMA_CACHE_DIR:-$HOME/.cache/llama-rs}/gemma-3-270m-q4_k_m.gguf}"
    [[ -f "$model" ]] || die "no model at $model; run the tests once (they fetch it) or set LLAMA_MODEL"
    generate_log="$(mktemp)"
    # The dev profile: the same llama.cpp build (always CMake's Release),
    # and the portable test stage has built everything else already.
    expected="$(cd "$ROOT" && LLAMA_CPU_VARIANT="$CPU_VARIANT" cargo run --quiet --no-default-features --example generate -- -m "$model" \
        --prompt "The capital of France is" -n 8 --greedy 2>"$generate_log")" \
        || die "the checkout's generate example failed: $(tail -20 "$generate_log")"
    rm -f "$generate_log"
fi

# 1. The bundle.
tarball="$(pinned_sdist "$ROOT")" || die "cannot get the pinned sdist"
staging="$ROOT/llama-sys/.llama.cpp.partial-$$"
rm -rf "$staging" && mkdir -p "$staging"
# What the library build reads (see ../shared/reference's CMake notes and
# llama-sys/build/features.rs): the other ggml backends are only
# add_subdirectory'd when switched on, and vendor/'s header-only targets
# need their CMakeLists.txt, not their headers.
keep_paths=(CMakeLists.txt LICENSE licenses cmake include src ggml vendor)
dropped_backends=(cann et hexagon hip musa opencl openvino sycl virtgpu webgpu zdnn zendnn)
excludes=(--exclude="$SDIST_PREFIX/vendor/cpp-httplib"
          --exclude="$SDIST_PREFIX/vendor/miniaudio/miniaudio.h"
          --exclude="$SDIST_PREFIX/vendor/nlohmann/*.hpp"
          --exclude="$SDIST_PREFIX/vendor/sheredom/subprocess.h"
          --exclude="$SDIST_PREFIX/vendor/stb/stb_image.h")
for b in "${dropped_backends[@]}"; do excludes+=(--exclude="$SDIST_PREFIX/ggml/src/ggml-$b"); done
tar -xzf "$tarball" -C "$staging" --strip-components=3 "${excludes[@]}" "${keep_paths[@]/#/$SDIST_PREFIX/}"
[[ -f "$staging/include/llama.h" && -f "$staging/ggml/src/ggml-cpu/CMakeLists.txt" ]] \
    || die "the bundle in $staging has no include/llama.h or ggml-cpu"
rm -rf "$BUNDLE"
mv "$staging" "$BUNDLE"
say "bundled llama.cpp ${PINNED_COMMIT:0:7} into llama-sys/llama.cpp ($(du -sh "$BUNDLE" | cut -f1))"

# 2. The packages.
cd "$ROOT"
# --allow-dirty: the bundle is gitignored by design, which cargo counts as
# dirty; other uncommitted changes are named here instead.
dirty="$(git status --porcelain -- llama-sys llama Cargo.toml Cargo.lock README.md)"
[[ -z "$dirty" ]] || say "warning: packaging uncommitted changes: $(echo "$dirty" | tr '\n' ' ')"
cmake_bin="$(installed_cmake "$ROOT")" || die "the packaged llama-sys needs an installed cmake (set CMAKE)"
env -u LLAMA_SYS_FETCH_CMAKE -u LLAMA_CPP_DIR -u LLAMA_SYS_LIB_DIR -u LLAMA_SYS_USE_PKG_CONFIG \
    CMAKE="$cmake_bin" PYTHON=/nonexistent/python3 \
    cargo package -p llama-sys -p llama --no-verify --allow-dirty --offline --quiet
version_sys="$(sed -n 's/^version = "\(.*\)"$/\1/p' llama-sys/Cargo.toml | head -n1)"
version_llama="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)"
crate_sys="$ROOT/target/package/llama-sys-$version_sys.crate"
crate_llama="$ROOT/target/package/llama-$version_llama.crate"
for crate in "$crate_sys" "$crate_llama"; do
    [[ -f "$crate" ]] || die "cargo package wrote no $crate"
    size=$(stat -c %s "$crate")
    say "$(basename "$crate"): $size bytes ($(numfmt --to=iec-i --suffix=B "$size")), $(tar -tzf "$crate" | wc -l) files"
    (( size < LIMIT )) || die "$(basename "$crate") is $size bytes, over the registry's limit of $LIMIT"
done
files_sys="$(tar -tzf "$crate_sys")"
grep -q "/llama.cpp/include/llama.h$" <<<"$files_sys" || die "$crate_sys has no bundled llama.cpp"
if grep -qE "/llama.cpp/(models|docs|tools|examples|tests)/" <<<"$files_sys"; then
    die "$crate_sys bundles more than the library build needs"
fi
[[ $verify == 1 ]] || exit 0

# 3. The packages on their own, offline, in a new folder.
check_dir="$(mktemp -d "${TMPDIR:-/tmp}/llama-package-check.XXXXXX")"
tar -xzf "$crate_sys" -C "$check_dir"
tar -xzf "$crate_llama" -C "$check_dir"
sys_dir="$check_dir/llama-sys-$version_sys"
llama_dir="$check_dir/llama-$version_llama"
snapshot() { (cd "$check_dir" && find "llama-sys-$version_sys" "llama-$version_llama" -type f -print0 | sort -z | xargs -0 sha256sum); }
snapshot > "$check_dir/before.sha256"

mkdir -p "$check_dir/consumer/src"
cat > "$check_dir/consumer/Cargo.toml" <<TOML
[package]
name = "consumer"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
llama = { path = "../llama-$version_llama" }
# Directly too: its build script reads llama-sys's links metadata.
llama-sys = { version = "0.1.0", default-features = false }

# As if both packages were on the registry: llama's dependency on
# llama-sys resolves to the unpacked package.
[patch.crates-io]
llama-sys = { path = "../llama-sys-$version_sys" }

[workspace]
TOML
# A dependent's build script reads the `links = "llama"` metadata.
cat > "$check_dir/consumer/build.rs" <<'RUST'
fn main() {
    let include = std::env::var("DEP_LLAMA_INCLUDE").expect("llama-sys emits DEP_LLAMA_INCLUDE");
    let commit = std::env::var("DEP_LLAMA_COMMIT").expect("llama-sys emits DEP_LLAMA_COMMIT");
    assert!(std::path::Path::new(&include).join("llama.h").is_file(), "no llama.h in DEP_LLAMA_INCLUDE={include}");
    assert_eq!(commit.len(), 40, "DEP_LLAMA_COMMIT={commit}");
    println!("cargo:warning=DEP_LLAMA_INCLUDE={include} DEP_LLAMA_COMMIT={commit}");
}
RUST
# The README's lower-level example, greedy, with the model from the command line.
cat > "$check_dir/consumer/src/main.rs" <<'RUST'
use llama::{AddBos, ContextParams, Model, ModelParams, Output, SamplerChain, Special};

fn main() -> Result<(), llama::Error> {
    let path = std::env::args().nth(1).expect("usage: consumer MODEL.gguf");
    let model = Model::load(&path, &ModelParams::default())?;
    let mut ctx = model.new_context(&ContextParams::default().n_ctx(512))?;
    ctx.eval(&model.vocab().tokenize("The capital of France is", AddBos::Yes)?, 0)?;
    let mut sampler = SamplerChain::new().greedy().build()?;
    let mut text = Vec::new();
    for _ in 0..8 {
        let token = sampler.sample(&mut ctx, Output::Last)?;
        text.extend(model.vocab().token_to_piece(token, Special::Plain)?);
        ctx.eval(&[token], 0)?;
    }
    println!("{}", String::from_utf8_lossy(&text));
    Ok(())
}
RUST

offline=()
if unshare -rn true 2>/dev/null; then
    offline=(unshare -rn)
    say "building the packages with the network cut off (unshare -rn)"
else
    say "unshare -rn is not permitted here: building with cargo --offline and no pip, network not cut off"
fi
start=$(date +%s)
build_status=0
(cd "$check_dir/consumer" &&
    env -u LLAMA_SYS_FETCH_CMAKE -u LLAMA_CPP_DIR -u LLAMA_SYS_LIB_DIR -u LLAMA_SYS_USE_PKG_CONFIG \
        CMAKE="$cmake_bin" PYTHON=/nonexistent/python3 CARGO_TARGET_DIR="$check_dir/target" \
        LLAMA_SYS_CPU_VARIANTS="$CPU_VARIANT" \
        "${offline[@]}" cargo build --offline >"$check_dir/build.log" 2>&1) || build_status=$?
grep -E '^(warning: consumer|error)' "$check_dir/build.log" >&2 || true
[[ $build_status == 0 ]] || die "the offline build failed ($build_status): $(tail -30 "$check_dir/build.log")"
grep -q 'warning: consumer.*DEP_LLAMA_INCLUDE=' "$check_dir/build.log" || die "the dependent's build script saw no DEP_LLAMA_INCLUDE"
say "offline build of the packaged crates: $(( $(date +%s) - start )) s"
snapshot > "$check_dir/after.sha256"
cmp -s "$check_dir/before.sha256" "$check_dir/after.sha256" \
    || die "the build changed the unpacked packages: $(diff "$check_dir/before.sha256" "$check_dir/after.sha256" | head -5)"

text="$(LLAMA_CPU_VARIANT="$CPU_VARIANT" "$check_dir/target/debug/consumer" "$model" 2>"$check_dir/consumer.log")" \
    || die "the packaged crates' example failed: $(tail -20 "$check_dir/consumer.log")"
say "the packaged crates generate: ${text@Q}"
[[ "$text" == "$expected" ]] || die "the checkout's build generates ${expected@Q} instead"

# 4. As docs.rs builds them: DOCS_RS set, every feature, no network, no
#    native library; the links metadata still reaches a dependent.
(cd "$check_dir/consumer" &&
    env -u LLAMA_SYS_FETCH_CMAKE DOCS_RS=1 PYTHON=/nonexistent/python3 CARGO_TARGET_DIR="$check_dir/target-docsrs" \
        RUSTDOCFLAGS="-D warnings" "${offline[@]}" cargo doc --offline --no-deps -p llama -p llama-sys -p consumer \
        --all-features >"$check_dir/doc.log" 2>&1) || die "the docs.rs-style build failed: $(tail -30 "$check_dir/doc.log")"
grep -q 'warning: consumer.*DEP_LLAMA_INCLUDE=.*/llama.cpp/include ' "$check_dir/doc.log" \
    || die "the docs.rs-style build gave the dependent no DEP_LLAMA_INCLUDE: $(grep -i dep_llama "$check_dir/doc.log")"
ls "$check_dir/target-docsrs/doc/llama/index.html" "$check_dir/target-docsrs/doc/llama_sys/index.html" >/dev/null
[[ ! -d "$check_dir/target-docsrs/llama-sys" ]] || die "the docs.rs-style build built llama.cpp"
say "docs.rs-style build of every feature: ok"
say "ok"
