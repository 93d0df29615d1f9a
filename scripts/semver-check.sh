#!/usr/bin/env bash
# cargo-semver-checks for every publishable crate against the last release
# (.ci/semver-baseline: "COMMIT VERSION"): a change that breaks the API
# fails unless the workspace version was bumped past the release's (0.x:
# the minor number). Both sides are documented with DOCS_RS set, so
# llamacpp-sys builds no llama.cpp. Installs the pinned cargo-semver-checks
# when this machine has another version or none.
#
# Usage: scripts/semver-check.sh [BASELINE-COMMIT]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SEMVER_CHECKS_VERSION=0.51.0

if [[ "$(cargo semver-checks --version 2>/dev/null)" != "cargo-semver-checks $SEMVER_CHECKS_VERSION" ]]; then
    echo "semver-check: installing cargo-semver-checks $SEMVER_CHECKS_VERSION" >&2
    # Its release profile asks for fat LTO in one codegen unit: minutes
    # more on two cores, for a tool that runs a few seconds.
    CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
        cargo install --locked --quiet cargo-semver-checks --version "$SEMVER_CHECKS_VERSION"
fi
baseline="${1:-$(cut -d' ' -f1 .ci/semver-baseline)}"
git cat-file -e "$baseline^{commit}" 2>/dev/null \
    || { echo "semver-check: the baseline $baseline is not in this clone's history" >&2; exit 1; }
echo "semver-check: against $(cat .ci/semver-baseline) (baseline $baseline)" >&2
# One crate at a time, each with the features its docs.rs page shows (the
# public API of every backend), `bindgen` (a build-time switch) aside;
# after a second colon, features the baseline does not have yet (0.2.0:
# llamacpp's `engine` and `constraints` were not features; both were
# always built; `mtmd` came in 0.3's development).
for spec in "llamacpp-sys:openmp,rpc,cuda,vulkan,metal,blas:mtmd" \
            "llamacpp:openmp,rpc,cuda,vulkan,metal,blas,testing:engine,constraints,mtmd" \
            "llama-model-cache::" \
            "llama-serve:openmp,rpc:"; do
    IFS=: read -r crate features new_features <<< "$spec"
    DOCS_RS=1 cargo semver-checks check-release --package "$crate" --baseline-rev "$baseline" \
        --only-explicit-features ${features:+--features "$features"} \
        ${new_features:+--current-features "$new_features"}
done
