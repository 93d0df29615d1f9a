#!/usr/bin/env bash
# Packages the four publishable crates (llamacpp-sys, llamacpp,
# llama-model-cache, llama-serve) as a user of the Rust registry gets them,
# and proves the packages build and run on their own.
#
# 1. Bundles the pinned llama.cpp into llamacpp-sys/llama.cpp (gitignored, in
#    llamacpp-sys's `include`): from the verified sdist, only what the library
#    build needs (the CMake files, include/, src/, ggml/ with the CPU, CUDA,
#    Metal, Vulkan, RPC and BLAS backends, vendor/'s CMake targets, the
#    licences). Never committed; removed again on exit unless --keep.
# 0. Unless --no-verify: the checkout's own greedy output, for step 3.
# 2. `cargo package` of the four, in dependency order (cargo's own
#    verification off: step 3 builds the same .crate files, offline, as a
#    dependent would, which proves more and saves a third llama.cpp build):
#    the .crate files in target/package/, each checked to be under the
#    registry's 10 MiB and to carry its LICENSE.
# 3. Unless --no-verify: unpacks the .crate files into a new folder outside
#    this repository, with a consumer crate that depends on all four, and
#    patches crates.io with the unpacked ones (the registry as it would be
#    after publishing them), builds it with the network cut off
#    (`unshare -rn` where the kernel allows it, and always cargo --offline,
#    no pip: PYTHON points nowhere), runs the README's lower-level example
#    on the default model, serves a completion with the packaged
#    llama-serve library, and checks that the build wrote nothing into the
#    unpacked packages.
# 4. Unless --no-verify: documents each unpacked crate as docs.rs does
#    (DOCS_RS=1, the features of its [package.metadata.docs.rs], no network)
#    with no C or C++ compiler and no cmake reachable: a `cc` that only
#    links (rustc needs one for build scripts) and refuses to compile.
#
# Usage: scripts/package.sh [--keep] [--no-verify] [--release] [--server-out DIR]
# --release builds the consumer in the release profile (as `cargo install`
# builds llama-serve); --server-out DIR keeps the packaged server: DIR/
# consumer and DIR/llama-serve, a script that runs `consumer serve ARGS`
# (CI runs the official SDKs' checks against it).
# Environment: CMAKE (the cmake the offline build uses; default: cmake on
# PATH, else the wheel a checkout build fetched into target/llamacpp-sys/),
# LLAMA_MODEL (the model to run; default: the cached default model).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/pinned-llama.sh
source "$ROOT/scripts/pinned-llama.sh"
BUNDLE="$ROOT/llamacpp-sys/llama.cpp"
LIMIT=$((10 * 1024 * 1024))
# The packaged crates build runtime CPU dispatch from the bundle with two of
# ggml's CPU variants (the baseline and this one) instead of the default
# nine: the machinery is the same, CI's test stage builds the nine from the
# checkout, and the other seven would add minutes here. The text
# is compared with this variant forced on both sides, so the same kernels
# run (any x86-64 CPU since 2013 has AVX2).
CPU_VARIANT="${CPU_VARIANT:-haswell}"

keep=0
verify=1
profile=debug
server_out=
while (($# > 0)); do
    case "$1" in
        --keep) keep=1 ;;
        --no-verify) verify=0 ;;
        --release) profile=release ;;
        --server-out) server_out="${2:?--server-out needs a folder}"; shift ;;
        *) echo "usage: scripts/package.sh [--keep] [--no-verify] [--release] [--server-out DIR]" >&2; exit 2 ;;
    esac
    shift
done
release=()
[[ $profile == release ]] && release=(--release)

say() { printf 'package: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

check_dir=""
cleanup() {
    if [[ $keep == 0 ]]; then
        rm -rf "$BUNDLE"
        [[ -n "$check_dir" ]] && rm -rf "$check_dir"
    fi
    rm -rf "$ROOT/llamacpp-sys/.llama.cpp.partial-$$"
}
trap cleanup EXIT

# 0. What the checkout's own build (vendor/llama.cpp, before the bundle
#    exists: the build prefers a bundle) generates in the configuration the
#    consumer below builds (runtime CPU dispatch, OpenMP, libmtmd and RPC:
#    the suite's defaults, so `cargo test` has built it already), for the
#    packaged crates to match: the same kernels, so the same tokens.
rm -rf "$BUNDLE"
if [[ $verify == 1 ]]; then
    # The default model as llama-model-cache (model-cache/) caches it (the tests fetch it), or LLAMA_MODEL.
    model="${LLAMA_MODEL:-${LLAMA_CACHE_DIR:-$HOME/.cache/llama-rs}/gemma-3-270m-q4_k_m.gguf}"
    [[ -f "$model" ]] || die "no model at $model; run the tests once (they fetch it) or set LLAMA_MODEL"
    generate_log="$(mktemp)"
    # The dev profile: the same llama.cpp build (always CMake's Release),
    # and CI's test stage has built everything else already.
    expected="$(cd "$ROOT" && LLAMA_CPU_VARIANT="$CPU_VARIANT" cargo run --quiet --example generate -- -m "$model" \
        --prompt "The capital of France is" -n 8 --greedy 2>"$generate_log")" \
        || die "the checkout's generate example failed: $(tail -20 "$generate_log")"
    rm -f "$generate_log"
fi

# 1. The bundle.
tarball="$(pinned_sdist "$ROOT")" || die "cannot get the pinned sdist"
staging="$ROOT/llamacpp-sys/.llama.cpp.partial-$$"
rm -rf "$staging" && mkdir -p "$staging"
# What the library build reads (see ../shared/reference's CMake notes and
# llamacpp-sys/build/features.rs): the other ggml backends are only
# add_subdirectory'd when switched on, and vendor/'s header-only targets
# need their CMakeLists.txt, not their headers, except stb_image.h and
# miniaudio.h, which libmtmd (tools/mtmd, feature `mtmd`) compiles: its
# library sources and headers are kept, not its tools, tests or media.
keep_paths=(CMakeLists.txt LICENSE licenses cmake include src ggml vendor tools/mtmd)
dropped_backends=(cann et hexagon hip musa opencl openvino sycl virtgpu webgpu zdnn zendnn)
excludes=(--exclude="$SDIST_PREFIX/vendor/cpp-httplib"
          --exclude="$SDIST_PREFIX/vendor/nlohmann/*.hpp"
          --exclude="$SDIST_PREFIX/vendor/sheredom/subprocess.h")
for f in tests legacy-models 'test-*' '*.md' requirements.txt tests.sh mtmd-cli.cpp deprecation-warning.cpp \
         debug/mtmd-debug.cpp; do
    excludes+=(--exclude="$SDIST_PREFIX/tools/mtmd/$f")
done
for b in "${dropped_backends[@]}"; do excludes+=(--exclude="$SDIST_PREFIX/ggml/src/ggml-$b"); done
tar -xzf "$tarball" -C "$staging" --strip-components=3 "${excludes[@]}" "${keep_paths[@]/#/$SDIST_PREFIX/}"
[[ -f "$staging/include/llama.h" && -f "$staging/ggml/src/ggml-cpu/CMakeLists.txt" ]] \
    || die "the bundle in $staging has no include/llama.h or ggml-cpu"
rm -rf "$BUNDLE"
mv "$staging" "$BUNDLE"
say "bundled llama.cpp ${PINNED_COMMIT:0:7} into llamacpp-sys/llama.cpp ($(du -sh "$BUNDLE" | cut -f1))"

# 2. The packages, in dependency order.
cd "$ROOT"
crates=(llamacpp-sys llamacpp llama-model-cache llama-serve)
# --allow-dirty: the bundle is gitignored by design, which cargo counts as
# dirty; other uncommitted changes are named here instead.
dirty="$(git status --porcelain -- llamacpp-sys llamacpp model-cache llama-serve Cargo.toml Cargo.lock README.md LICENSE)"
[[ -z "$dirty" ]] || say "warning: packaging uncommitted changes: $(echo "$dirty" | tr '\n' ' ')"
cmake_bin="$(installed_cmake "$ROOT")" || die "the packaged llamacpp-sys needs an installed cmake (set CMAKE)"
env -u LLAMA_SYS_FETCH_CMAKE -u LLAMA_CPP_DIR -u LLAMA_SYS_LIB_DIR -u LLAMA_SYS_USE_PKG_CONFIG \
    CMAKE="$cmake_bin" PYTHON=/nonexistent/python3 \
    cargo package "${crates[@]/#/-p}" --no-verify --allow-dirty --offline --quiet
# The version of each crate, as cargo resolved it.
version_of() {
    cargo metadata --format-version 1 --no-deps --offline \
        | "${PYTHON_FOR_SCRIPTS:-python3}" -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == sys.argv[1]))' "$1"
}
declare -A version dir
for c in "${crates[@]}"; do
    version[$c]="$(version_of "$c")"
    crate="$ROOT/target/package/$c-${version[$c]}.crate"
    [[ -f "$crate" ]] || die "cargo package wrote no $crate"
    size=$(stat -c %s "$crate")
    files="$(tar -tzf "$crate")"
    say "$(basename "$crate"): $size bytes ($(numfmt --to=iec-i --suffix=B "$size")), $(wc -l <<<"$files") files"
    (( size < LIMIT )) || die "$(basename "$crate") is $size bytes, over the registry's limit of $LIMIT"
    grep -qx "$c-${version[$c]}/LICENSE" <<<"$files" || die "$(basename "$crate") carries no LICENSE"
    readme="$(tar -xzOf "$crate" "$c-${version[$c]}/Cargo.toml" | sed -n 's/^readme = "\(.*\)"$/\1/p')"
    [[ -n "$readme" ]] && grep -qx "$c-${version[$c]}/$readme" <<<"$files" \
        || die "$(basename "$crate") carries no readme (${readme:-none named})"
done
crate_sys="$ROOT/target/package/llamacpp-sys-${version[llamacpp-sys]}.crate"
files_sys="$(tar -tzf "$crate_sys")"
grep -q "/llama.cpp/include/llama.h$" <<<"$files_sys" || die "$crate_sys has no bundled llama.cpp"
grep -q "/llama.cpp/tools/mtmd/mtmd.h$" <<<"$files_sys" || die "$crate_sys has no libmtmd (tools/mtmd)"
extra="$(grep -E "/llama.cpp/(models|docs|tools|examples|tests)/" <<<"$files_sys" \
    | grep -vE "/llama.cpp/tools/mtmd/([^/]+\.(cpp|h)|CMakeLists.txt|models/[^/]+\.(cpp|h)|debug/mtmd-debug\.h)$" || true)"
if [[ -n "$extra" ]]; then
    say "not needed by the library build: $(head -5 <<<"$extra" | tr '\n' ' ')"
    die "$crate_sys bundles more than the library build needs"
fi
[[ $verify == 1 ]] || exit 0

# 3. The packages on their own, offline, in a new folder.
check_dir="$(mktemp -d "${TMPDIR:-/tmp}/llama-package-check.XXXXXX")"
mkdir -p "$check_dir/.cargo"
# As if the four were on the registry: every dependency on one of them
# resolves to its unpacked package (config-file paths are relative to the
# folder holding .cargo/).
echo "[patch.crates-io]" > "$check_dir/.cargo/config.toml"
# llamacpp-sys is unpacked as vendor/, so that its bundled llama.cpp
# (vendor/llama.cpp) sits where a checkout's does relative to the target
# folder (target/llamacpp-sys/build-*): a compiler cache that rewrites
# paths relative to a base folder (CI's ccache, CCACHE_BASEDIR) then finds
# the same compile commands as the checkout's build of the same sources.
# The objects still come from the bundle's own files: ccache hashes them.
for c in "${crates[@]}"; do
    tar -xzf "$ROOT/target/package/$c-${version[$c]}.crate" -C "$check_dir"
    dir[$c]="$c-${version[$c]}"
    if [[ $c == llamacpp-sys ]]; then
        mv "$check_dir/${dir[$c]}" "$check_dir/vendor"
        dir[$c]=vendor
    fi
    echo "$c = { path = \"${dir[$c]}\" }" >> "$check_dir/.cargo/config.toml"
done
snapshot() { (cd "$check_dir" && find "${dir[@]}" -type f -print0 | sort -z | xargs -0 sha256sum); }
snapshot > "$check_dir/before.sha256"

mkdir -p "$check_dir/consumer/src"
cat > "$check_dir/consumer/Cargo.toml" <<TOML
[package]
name = "consumer"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
# With libmtmd (feature mtmd: the bundle carries what it compiles) and the
# RPC backend: the configuration of the checkout's cargo test, so that a
# compiler cache has its objects (CI's ccache).
llamacpp = { version = "${version[llamacpp]}", features = ["mtmd", "rpc"] }
# Directly too: its build script reads llamacpp-sys's links metadata.
llamacpp-sys = { version = "${version[llamacpp-sys]%%+*}", default-features = false }
llama-model-cache = "${version[llama-model-cache]}"
llama-serve = "${version[llama-serve]}"
# llama-serve's binary in a few lines: its Args parsed, its future run.
clap = "4"
tokio = { version = "1", features = ["rt-multi-thread"] }

[workspace]
TOML
# A dependent's build script reads the `links = "llama"` metadata.
cat > "$check_dir/consumer/build.rs" <<'RUST'
fn main() {
    let include = std::env::var("DEP_LLAMA_INCLUDE").expect("llamacpp-sys emits DEP_LLAMA_INCLUDE");
    let commit = std::env::var("DEP_LLAMA_COMMIT").expect("llamacpp-sys emits DEP_LLAMA_COMMIT");
    assert!(std::path::Path::new(&include).join("llama.h").is_file(), "no llama.h in DEP_LLAMA_INCLUDE={include}");
    assert_eq!(commit.len(), 40, "DEP_LLAMA_COMMIT={commit}");
    println!("cargo:warning=DEP_LLAMA_INCLUDE={include} DEP_LLAMA_COMMIT={commit}");
}
RUST
# `consumer MODEL`: the README's lower-level example, greedy. `consumer
# serve ARGS`: the packaged llama-serve library as its binary runs it.
cat > "$check_dir/consumer/src/main.rs" <<'RUST'
use llamacpp::{AddBos, ContextParams, Model, ModelParams, Output, SamplerChain, Special};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("serve") {
        use clap::Parser;
        let serve_args = llama_serve::Args::try_parse_from(args[1..].iter())?;
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        return Ok(runtime.block_on(llama_serve::serve(serve_args))?);
    }
    let path = args.get(1).ok_or("usage: consumer MODEL.gguf | consumer serve ARGS")?;
    // The packaged model cache's fixed facts are reachable too.
    assert_eq!(llama_model_cache::DEFAULT_MODEL_FILE, "gemma-3-270m-q4_k_m.gguf");
    let model = Model::load(path, &ModelParams::default())?;
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
        "${offline[@]}" cargo build --offline "${release[@]}" >"$check_dir/build.log" 2>&1) || build_status=$?
grep -E '^(warning: consumer|error)' "$check_dir/build.log" >&2 || true
[[ $build_status == 0 ]] || die "the offline build failed ($build_status): $(tail -30 "$check_dir/build.log")"
grep -q 'warning: consumer.*DEP_LLAMA_INCLUDE=' "$check_dir/build.log" || die "the dependent's build script saw no DEP_LLAMA_INCLUDE"
say "offline build of the packaged crates ($profile): $(( $(date +%s) - start )) s"
snapshot > "$check_dir/after.sha256"
cmp -s "$check_dir/before.sha256" "$check_dir/after.sha256" \
    || die "the build changed the unpacked packages: $(diff "$check_dir/before.sha256" "$check_dir/after.sha256" | head -5)"

consumer="$check_dir/target/$profile/consumer"
text="$(LLAMA_CPU_VARIANT="$CPU_VARIANT" "$consumer" "$model" 2>"$check_dir/consumer.log")" \
    || die "the packaged crates' example failed: $(tail -20 "$check_dir/consumer.log")"
say "the packaged crates generate: ${text@Q}"
[[ "$text" == "$expected" ]] || die "the checkout's build generates ${expected@Q} instead"

# The packaged server: one greedy completion over loopback.
serve_log="$check_dir/serve.log"
LLAMA_CPU_VARIANT="$CPU_VARIANT" "$consumer" serve --model "$model" --port 0 --threads 2 --ctx 1024 --parallel 1 \
    >"$check_dir/serve.out" 2>"$serve_log" &
serve_pid=$!
served="$("${PYTHON_FOR_SCRIPTS:-python3}" - "$check_dir/serve.out" <<'PY'
import json, sys, time, urllib.request
deadline = time.time() + 120
url = None
while url is None and time.time() < deadline:
    for line in open(sys.argv[1]):
        if line.startswith("listening on "):
            url = line.split()[-1]
    time.sleep(0.2)
assert url, "the packaged server printed no 'listening on' line"
while time.time() < deadline:
    try:
        urllib.request.urlopen(url + "/health", timeout=5)
        break
    except Exception:
        time.sleep(0.5)
body = json.dumps({"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}).encode()
req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
print(json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["text"])
PY
)" || { kill "$serve_pid" 2>/dev/null; die "the packaged server did not answer: $(tail -20 "$serve_log")"; }
kill -TERM "$serve_pid"
wait "$serve_pid" || die "the packaged server did not exit cleanly on SIGTERM: $(tail -5 "$serve_log")"
say "the packaged server completes: ${served@Q}"
[[ -n "$served" ]] || die "the packaged server's completion is empty"
if [[ -n "$server_out" ]]; then
    mkdir -p "$server_out"
    server_out="$(cd "$server_out" && pwd)"
    cp "$consumer" "$server_out/consumer"
    printf '#!/bin/sh\n# llama-serve as the packaged crates build it (scripts/package.sh).\nexec "%s/consumer" serve "$@"\n' \
        "$server_out" > "$server_out/llama-serve"
    chmod +x "$server_out/llama-serve"
    say "the packaged server kept: $server_out/llama-serve"
fi

# 4. As docs.rs builds them: DOCS_RS set, the features docs.rs reads from
#    each crate's metadata, no network, no native library, and no C/C++
#    compiler or cmake: `cc` on PATH only links (rustc links build scripts
#    with it) and logs any compile it refuses; nothing else of /usr/bin.
tools="$check_dir/docsrs-tools"
mkdir -p "$tools"
cat > "$tools/cc" <<SH
#!/bin/sh
for arg in "\$@"; do
    case "\$arg" in
        -c|-E|-S|*.c|*.cc|*.cpp|*.cxx) echo "refused: cc \$*" >> "$check_dir/compiler-calls.log"; exit 1 ;;
    esac
done
exec /usr/bin/cc "\$@"
SH
chmod +x "$tools/cc"
docs_features() {
    "${PYTHON_FOR_SCRIPTS:-python3}" -c 'import sys, tomllib
meta = tomllib.load(open(sys.argv[1], "rb"))["package"].get("metadata", {}).get("docs", {}).get("rs", {})
print(",".join(meta.get("features", [])))' "$check_dir/$1/Cargo.toml"
}
# The consumer last: a dependent's build script still gets the links
# metadata (DEP_LLAMA_INCLUDE) under DOCS_RS.
dir[consumer]=consumer
for c in "${crates[@]}" consumer; do
    features="$(docs_features "${dir[$c]}")"
    (cd "$check_dir/${dir[$c]}" &&
        "${offline[@]}" env -i HOME="$HOME" PATH="$tools:$(dirname "$(command -v cargo)")" \
            DOCS_RS=1 CC=/nonexistent/cc CXX=/nonexistent/c++ CMAKE=/nonexistent/cmake PYTHON=/nonexistent/python3 \
            CARGO_TARGET_DIR="$check_dir/target-docsrs" RUSTDOCFLAGS="-D warnings" \
            cargo doc --offline --no-deps ${features:+--features "$features"} >"$check_dir/doc-$c.log" 2>&1) \
        || die "the docs.rs-style build of $c (features $features) failed: $(tail -30 "$check_dir/doc-$c.log")"
    say "docs.rs-style build of $c (features: ${features:-default}): ok"
done
grep -q 'warning: consumer.*DEP_LLAMA_INCLUDE=.*/llama.cpp/include ' "$check_dir/doc-consumer.log" \
    || die "the docs.rs-style build gave the dependent no DEP_LLAMA_INCLUDE: $(grep -i dep_llama "$check_dir/doc-consumer.log")"
[[ ! -s "$check_dir/compiler-calls.log" ]] || die "the docs.rs-style build ran a compiler: $(head -3 "$check_dir/compiler-calls.log")"
ls "$check_dir/target-docsrs/doc/llamacpp/index.html" "$check_dir/target-docsrs/doc/llamacpp_sys/index.html" \
    "$check_dir/target-docsrs/doc/llama_serve/index.html" "$check_dir/target-docsrs/doc/llama_model_cache/index.html" >/dev/null
[[ ! -d "$check_dir/target-docsrs/llamacpp-sys" ]] || die "the docs.rs-style build built llama.cpp"
say "ok"
