#!/usr/bin/env bash
# The device check (docs/gpu.md): what a GPU machine is asked to prove,
# on the crate's own static `cuda` build. That machine has nvcc (CUDA 13),
# CMake, ninja and Python, no Rust and no network, takes 64 MiB of
# working tree per call and 10 minutes per command. So the Rust side is
# built here and llama.cpp's tools there, from the same pinned source:
#
#   bash scripts/device-check.sh prepare          # here
#   bash scripts/device-check.sh run STEP...      # there, with target/device-check carried
#
# prepare: NVIDIA's toolkit from PyPI (scripts/cuda-toolkit.sh), then
#   llama-serve's device_tools example (device_check, bench and
#   serve_bench in one executable, run by name: one copy of the CUDA
#   kernels) in release with `--no-default-features --features cuda`
#   for LLAMA_CUDA_ARCHITECTURES (default 90: H100/H200): llamacpp-sys's
#   own static build, as a user's `cargo build --features cuda` makes it.
#   Stripped and xz-compressed into target/device-check with the pinned
#   llama.cpp source (less what a CUDA build does not read); fails if the
#   pack passes 60 MiB. Prints the sizes and the build time.
# run, on the GPU machine, by steps (each well under 9 minutes; a warm
#   machine keeps /tmp between calls, so `run tools bench` then
#   `run serve checks` is the whole check in two calls):
#   tools   llama.cpp's llama-bench and llama-server from the carried
#           source, the same CUDA options as llamacpp-sys's (sm_90,
#           GGML_CUDA_NO_VMM as the PyPI toolkit builds ours, no NCCL)
#   models  synthetic Llama-3.2-1B- and Llama-3.1-8B-shaped Q4_K_M models
#           (random weights; llamacpp::testing::ShapedSpec), once
#   bench   our bench beside llama-bench, pp512 and tg128, every layer on
#           the GPU, ROUNDS (5) interleaved rounds of one repetition each,
#           on both shapes: mean, spread and ratio
#   serve   serve_bench: the engine in-process beside llama-server over
#           loopback at 1, 16 and 64 streams (same total context, -kvu,
#           -b/-ub 512), and short requests behind a 4,000-token prompt
#           (TTFT), on the 8B shape
#   checks  device_check on the 1B shape (teacher-forced greedy against the
#           CPU, plan = live per device, engine streams) and its offload
#           check on the 8B shape (all layers by default; under a budget
#           of half the model, the fitted count loads and runs)
#   Everything goes to $OUT/device-check.log too (the device tool returns
#   $OUT), with rows in $OUT/*.jsonl.
# DEVICE_CHECK_CUDA=OFF rehearses both sides on any machine without CUDA
# (the examples with the default CPU build, the tools CPU-only), with
# knobs to keep it short: DEVICE_CHECK_SHAPES (default "llama-3.2-1b
# llama-3.1-8b"), DEVICE_CHECK_TOOLS (a folder with llama-bench and
# llama-server built already), ROUNDS, SERVE_SHAPE, SERVE_LEVELS (default
# 1,16,64), SERVE_EXTRA (more serve_bench arguments), THREADS.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PACK="$ROOT/target/device-check"
CUDA="${DEVICE_CHECK_CUDA:-ON}"
WORK="${DEVICE_CHECK_WORK:-/tmp/device-check}"
# One executable (llama-serve's device_tools example) for the three tools
# it runs as, by name: each CUDA build is ~43 MB compressed.
TOOLS=(device_check bench serve_bench)
say() { printf 'device-check: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

prepare() {
    # shellcheck source=scripts/pinned-llama.sh
    source "$ROOT/scripts/pinned-llama.sh"
    local features=(--no-default-features) cargo_dir="$ROOT/target/device-check-cargo" start
    if [[ $CUDA == ON ]]; then
        eval "$(bash "$ROOT/scripts/cuda-toolkit.sh")"
        features+=(--features cuda)
    fi
    start=$(date +%s)
    # Portable CPU code (runtime dispatch), not this machine's `native`.
    (cd "$ROOT" && cargo build --release --target-dir "$cargo_dir" -p llama-serve "${features[@]}" --example device_tools)
    say "built device_tools (cuda $CUDA) in $(($(date +%s) - start)) s"
    rm -rf "$PACK"
    mkdir -p "$PACK"
    strip -o "$PACK/device_tools" "$cargo_dir/release/examples/device_tools"
    xz -T0 -9 "$PACK/device_tools"
    # The source with tools/ and common/ (for llama-bench and
    # llama-server), from the pinned sdist, less what the CUDA build does
    # not read.
    local tarball stage="$ROOT/target/device-check-src" top
    tarball="$(pinned_sdist "$ROOT")" || die "cannot get the pinned sdist"
    rm -rf "$stage" && mkdir -p "$stage"
    # awk reads the whole list: `| head -1` would end tar with SIGPIPE,
    # which pipefail turns into a failure.
    top="$(tar -tzf "$tarball" | awk -F/ 'NR == 1 { print $1 }')"
    tar -xzf "$tarball" -C "$stage" --strip-components=2 "$top/vendor/llama.cpp"
    rm -rf "$stage/llama.cpp/.git"
    local backend exclude=()
    for backend in vulkan metal sycl opencl cann musa webgpu zdnn hexagon openvino; do
        exclude+=("--exclude=llama.cpp/ggml/src/ggml-$backend")
    done
    tar -C "$stage" -cJf "$PACK/llama.cpp.tar.xz" "${exclude[@]}" \
        --exclude=llama.cpp/models --exclude=llama.cpp/docs --exclude=llama.cpp/examples \
        --exclude=llama.cpp/tests --exclude=llama.cpp/media --exclude=llama.cpp/gguf-py \
        --exclude='llama.cpp/tools/server/webui' --exclude='llama.cpp/tools/server/public*' \
        llama.cpp
    echo "${PINNED_COMMIT:0:7}" >"$PACK/commit"
    echo "$CUDA" >"$PACK/cuda"
    du -b "$PACK"/* >&2
    local total
    total=$(du -sb "$PACK" | cut -f1)
    ((total < 60 * 1024 * 1024)) || die "target/device-check is $total bytes: over the 64 MiB a device call carries"
    say "packed $total bytes into $PACK; carry target/device-check and run: bash scripts/device-check.sh run tools bench"
}

# The unpacked binaries, and the CUDA 13 libraries they link
# (libcudart, libcublas: PyTorch's NVIDIA wheels there).
unpack() {
    mkdir -p "$WORK/bin"
    local tool
    if [[ ! -x "$WORK/bin/device_tools" || "$PACK/device_tools.xz" -nt "$WORK/bin/device_tools" ]]; then
        xz -dc "$PACK/device_tools.xz" >"$WORK/bin/device_tools" && chmod +x "$WORK/bin/device_tools"
    fi
    for tool in "${TOOLS[@]}"; do
        ln -sf device_tools "$WORK/bin/$tool"
    done
    if [[ $(cat "$PACK/cuda") == ON ]]; then
        local libs
        libs="$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null || true)"
        export LD_LIBRARY_PATH="${libs:+$libs:}/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
}

tools_bin() { echo "${DEVICE_CHECK_TOOLS:-$WORK/tools/bin}"; }

step_tools() {
    [[ -x "$(tools_bin)/llama-server" ]] && { say "tools: built already ($(tools_bin))"; return; }
    local src="$WORK/src" build="$WORK/tools" start generator=() cuda
    cuda="$(cat "$PACK/cuda")"
    command -v ninja >/dev/null && generator=(-G Ninja)
    start=$(date +%s)
    rm -rf "$src" "$build" && mkdir -p "$src" && tar -C "$src" -xJf "$PACK/llama.cpp.tar.xz"
    cmake "${generator[@]}" -S "$src/llama.cpp" -B "$build" -DCMAKE_BUILD_TYPE=Release \
        -DGGML_CUDA="$cuda" -DCMAKE_CUDA_ARCHITECTURES="${LLAMA_CUDA_ARCHITECTURES:-90}" \
        -DGGML_CUDA_NO_VMM=ON -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
        -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DGGML_CCACHE=OFF -DLLAMA_BUILD_COMMIT="$(cat "$PACK/commit")" >/dev/null
    cmake --build "$build" -j "$(nproc)" --target llama-bench llama-server >/dev/null
    say "tools: llama-bench and llama-server (GGML_CUDA=$cuda) built in $(($(date +%s) - start)) s"
}

shapes() { echo "${DEVICE_CHECK_SHAPES:-llama-3.2-1b llama-3.1-8b}"; }
model_of() { echo "$WORK/models/$1.gguf"; }

step_models() {
    mkdir -p "$WORK/models"
    local shape
    for shape in $(shapes); do
        [[ -f "$(model_of "$shape")" ]] && continue
        "$WORK/bin/device_check" --write-model "$(model_of "$shape")" --shape "$shape" --checks none
    done
}

step_bench() {
    local shape model round threads="${THREADS:-8}"
    for shape in $(shapes); do
        model="$(model_of "$shape")"
        for round in $(seq "${ROUNDS:-5}"); do
            say "bench: $shape, round $round"
            "$WORK/bin/bench" -m "$model" -p 512 -n 128 -r 1 -t "$threads" --ngl 99 |
                sed -n "s/^|.*| \(pp512\|tg128\) | \([0-9.]*\) .*/{\"shape\":\"$shape\",\"tool\":\"ours\",\"test\":\"\1\",\"tps\":\2}/p" \
                    >>"$OUT/bench.jsonl"
            "$(tools_bin)/llama-bench" -m "$model" -p 512 -n 128 -r 1 -t "$threads" -ngl 99 -o jsonl |
                python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    test = ("pp%d" % r["n_prompt"]) if r["n_gen"] == 0 else ("tg%d" % r["n_gen"])
    print(json.dumps({"shape": sys.argv[1], "tool": "llama-bench", "test": test, "tps": r["avg_ts"]}))
' "$shape" >>"$OUT/bench.jsonl"
        done
    done
    python3 - "$OUT/bench.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = sorted({(r["shape"], r["test"]) for r in rows})
print("| shape | test | ours t/s (mean ± sd, n) | llama-bench t/s | ours / llama-bench |")
print("| --- | --- | ---: | ---: | ---: |")
for shape, test in keys:
    s = {t: [r["tps"] for r in rows if (r["shape"], r["test"], r["tool"]) == (shape, test, t)] for t in ("ours", "llama-bench")}
    if not s["ours"] or not s["llama-bench"]:
        continue
    f = lambda v: "%.1f ± %.1f (%d)" % (statistics.mean(v), statistics.stdev(v) if len(v) > 1 else 0, len(v))
    print("| %s | %s | %s | %s | %.3f |" % (shape, test, f(s["ours"]), f(s["llama-bench"]),
          statistics.mean(s["ours"]) / statistics.mean(s["llama-bench"])))
EOF
}

step_serve() {
    local shape="${SERVE_SHAPE:-llama-3.1-8b}" model threads="${THREADS:-8}" round
    model="$(model_of "$shape")"
    local sb=("$WORK/bin/serve_bench" -m "$model" -t "$threads" --gpu-layers 99 --json
        --server-bin "$(tools_bin)/llama-server" --server-log "$OUT/llama-server.log" --port 18089)
    local levels="${SERVE_LEVELS:-1,16,64}" extra
    read -ra extra <<<"${SERVE_EXTRA:-}"
    row() { sed "s/^{/{\"run\":\"$1\",\"shape\":\"$shape\",/" >>"$OUT/serve.jsonl"; }
    for round in $(seq "${SERVE_ROUNDS:-1}"); do
        say "serve: throughput at 1, 16, 64 streams, round $round"
        "${sb[@]}" "${extra[@]}" --backend engine --parallel 64 --ctx 16384 --scenario throughput --levels "$levels" |
            row engine
        "${sb[@]}" "${extra[@]}" --spawn --parallel 64 --ctx 16384 --scenario throughput --levels "$levels" |
            row llama-server
        say "serve: six short requests behind a 4,000-token prompt, round $round"
        "${sb[@]}" "${extra[@]}" --backend engine --parallel 8 --ctx 16384 --scenario long-short --shorts 6 \
            --gap-ms 50 | row engine
        "${sb[@]}" "${extra[@]}" --spawn --parallel 8 --ctx 16384 --scenario long-short --shorts 6 --gap-ms 50 |
            row llama-server
    done
    python3 "$ROOT/scripts/serve-bench-summary.py" "$OUT/serve.jsonl" || true
}

step_checks() {
    local first second
    read -r first second <<<"$(shapes)"
    "$WORK/bin/device_check" -m "$(model_of "$first")" -t "${THREADS:-8}" -n 256 --checks teacher,plan,engine ||
        say "device_check on $first: a check failed"
    "$WORK/bin/device_check" -m "$(model_of "${second:-$first}")" -t "${THREADS:-8}" --checks fit ||
        say "device_check fit on ${second:-$first}: a check failed"
}

run() {
    [[ -f "$PACK/device_tools.xz" ]] || die "no $PACK/device_tools.xz: run \`bash scripts/device-check.sh prepare\` here first and carry target/device-check"
    (($# > 0)) || set -- tools models bench serve checks
    export OUT="${OUT:-$ROOT/target/device-check-out}"
    mkdir -p "$OUT" "$WORK"
    exec > >(tee -a "$OUT/device-check.log") 2>&1
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader || true
    unpack
    local step start
    for step in "$@"; do
        start=$(date +%s)
        case "$step" in
            tools) step_tools ;;
            models) step_models ;;
            bench) step_models && step_bench ;;
            serve) step_models && step_serve ;;
            checks) step_models && step_checks ;;
            *) die "unknown step $step: tools, models, bench, serve, checks" ;;
        esac
        say "$step: $(($(date +%s) - start)) s"
    done
}

case "${1:-}" in
    prepare) prepare ;;
    run) shift && run "$@" ;;
    *) die "usage: scripts/device-check.sh prepare | run [tools|models|bench|serve|checks]..." ;;
esac
