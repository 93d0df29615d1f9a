#!/usr/bin/env bash
# Runs one fuzz target for a while: fuzz/run.sh <target> [seconds] [extra libFuzzer args...]
# One process, one worker, under nice; log in fuzz/logs/<target>.log, crash
# inputs in fuzz/artifacts/<target>/, the growing corpus in fuzz/corpus/<target>/.
set -euo pipefail
cd "$(dirname "$0")/.."
. fuzz/env.sh

target=${1:?usage: fuzz/run.sh <target> [seconds] [libFuzzer args...]}
secs=${2:-600}
shift $(( $# >= 2 ? 2 : 1 ))

# Inputs bigger than the targets read only cost time; gguf_load needs room
# for its GGUF seeds (the vocab fixtures are up to 724 KB).
case "$target" in
    gguf_load) max_len=800000 ;;
    state_load|media_decode) max_len=65536 ;;
    *) max_len=4100 ;;
esac

mkdir -p fuzz/logs "fuzz/corpus/$target"
nice -n 10 cargo fuzz run "$target" "fuzz/corpus/$target" -- \
    -max_total_time="$secs" -max_len="$max_len" -rss_limit_mb=6144 -timeout=60 \
    -print_final_stats=1 "$@" 2>&1 | tee "fuzz/logs/$target.log"
