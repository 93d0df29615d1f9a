# Sourced by the scripts that build the pinned llama.cpp themselves: the
# pinned facts and the verified sdist come from `cargo xtask` (which
# includes llamacpp-sys/build/pinned.rs, the one place that names them); the
# sdist lives in target/llamacpp-sys/download, shared with llamacpp-sys's build.
#
#   source "$ROOT/scripts/pinned-llama.sh"   # sets SDIST_PREFIX, PINNED_COMMIT, ...
#   tarball="$(pinned_sdist "$ROOT")"   # the verified .tar.gz
#   tar -xzf "$tarball" --strip-components=3 "$SDIST_PREFIX/..."
#   cmake_bin="$(installed_cmake "$ROOT")" || die "no cmake"

_pinned_facts="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && cargo xtask pinned)" \
    || { echo "error: \`cargo xtask pinned\` failed" >&2; return 1 2>/dev/null || exit 1; }
eval "$_pinned_facts"
unset _pinned_facts

# Prints the path of the verified sdist, fetching it with pip if needed.
pinned_sdist() {
    (cd "$1" && cargo xtask sdist)
}

# Prints the cmake to use: $CMAKE, cmake on PATH, or the PyPI wheel that a
# checkout build of llamacpp-sys unpacked into target/llamacpp-sys/; fails when
# none of them runs.
installed_cmake() {
    local root="$1" candidate
    for candidate in "${CMAKE:-}" cmake "$root/target/llamacpp-sys/cmake-wheel/cmake/data/bin/cmake"; do
        if [[ -n "$candidate" ]] && "$candidate" --version >/dev/null 2>&1; then
            echo "$candidate"
            return 0
        fi
    done
    echo "error: no cmake: install one, set CMAKE, or build the workspace once (it fetches the wheel)" >&2
    return 1
}
