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

baseline="${1:-$(cut -d' ' -f1 .ci/semver-baseline)}"
git cat-file -e "$baseline^{commit}" 2>/dev/null \
    || { echo "semver-check: the baseline $baseline is not in this clone's history" >&2; exit 1; }
echo "semver-check: against $(cat .ci/semver-baseline) (baseline $baseline)" >&2
release="$(cut -d' ' -f2 .ci/semver-baseline)"
# The part of a version whose change allows breaking changes: the major,
# or in 0.x the minor (build metadata such as +llama.cpp-… aside).
breaking() {
    local major minor
    IFS=. read -r major minor _ <<< "${1%%+*}"
    if [[ $major == 0 ]]; then echo "0.$minor"; else echo "$major"; fi
}
# One crate at a time, each with the features its docs.rs page shows (the
# public API of every backend), `bindgen` (a build-time switch) aside;
# after a second colon, features the baseline does not have yet (0.2.0:
# llamacpp's `engine` and `constraints` were not features; both were
# always built; `mtmd` came in 0.3's development). A crate whose version
# is already past the release's (0.2 -> 0.3) may break anything, and
# cargo-semver-checks runs no check on it ("0 checks ... 260 skip", about
# five minutes of rustdoc builds for the three such crates on 2 cores), so
# it is skipped; the tool is installed only when a crate is left.
checked=()
for spec in "llamacpp-sys:openmp,rpc,cuda,vulkan,metal,blas:mtmd" \
            "llamacpp:openmp,rpc,cuda,vulkan,metal,blas,testing:engine,constraints,mtmd" \
            "llama-model-cache::" \
            "llama-serve:openmp,rpc:"; do
    crate="${spec%%:*}"
    id="$(cargo pkgid --offline -p "$crate")"
    version="${id##*[#@]}"
    if [[ "$(breaking "$version")" != "$(breaking "$release")" ]]; then
        echo "semver-check: $crate $version is past the release's $release: any change is allowed, not checked" >&2
    else
        checked+=("$spec")
    fi
done
((${#checked[@]} > 0)) || exit 0
if [[ "$(cargo semver-checks --version 2>/dev/null)" != "cargo-semver-checks $SEMVER_CHECKS_VERSION" ]]; then
    echo "semver-check: installing cargo-semver-checks $SEMVER_CHECKS_VERSION" >&2
    # Its release profile asks for fat LTO in one codegen unit; even
    # without, the optimised install took about nine of the checks stage's
    # 20 minutes on two cores (the stage less its other steps), for a tool
    # that then runs a second. Unoptimised it built in 185 s and checked
    # llamacpp-sys's 202 rules in 0.7 s instead of 0.1 s.
    CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 CARGO_PROFILE_RELEASE_OPT_LEVEL=0 \
        cargo install --locked --quiet cargo-semver-checks --version "$SEMVER_CHECKS_VERSION"
fi
for spec in "${checked[@]}"; do
    IFS=: read -r crate features new_features <<< "$spec"
    DOCS_RS=1 cargo semver-checks check-release --package "$crate" --baseline-rev "$baseline" \
        --only-explicit-features ${features:+--features "$features"} \
        ${new_features:+--current-features "$new_features"}
done
