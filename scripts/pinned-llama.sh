# Sourced by the scripts that build the pinned llama.cpp themselves: the
# llama-cpp-python sdist that llama-sys's build fetches (the same constants
# as llama-sys/build/source.rs and build/fetch.rs), downloaded once into
# target/llama-sys/download and checked against its sha256, and the cmake
# to build it with.
#
#   source "$ROOT/scripts/pinned-llama.sh"
#   tarball="$(pinned_sdist "$ROOT")"   # the verified .tar.gz
#   tar -xzf "$tarball" --strip-components=3 "$SDIST_PREFIX/..."
#   cmake_bin="$(installed_cmake "$ROOT")" || die "no cmake"

SDIST_VERSION=0.3.36
SDIST_FILE="llama_cpp_python-${SDIST_VERSION}.tar.gz"
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
SDIST_PREFIX="llama_cpp_python-${SDIST_VERSION}/vendor/llama.cpp"
PINNED_COMMIT=0c1e57098bba43ac29e6e3b677cdceebdd22334f

# Prints the path of the verified sdist, fetching it with pip if needed.
pinned_sdist() {
    local root="$1" dir tarball digest
    dir="$root/target/llama-sys/download"
    tarball="$dir/$SDIST_FILE"
    if [[ ! -f "$tarball" ]] || [[ "$(sha256sum "$tarball" | cut -d' ' -f1)" != "$SDIST_SHA256" ]]; then
        echo "fetching llama-cpp-python==$SDIST_VERSION sdist with pip" >&2
        mkdir -p "$dir"
        rm -f "$tarball"
        "${PYTHON:-python3}" -m pip download --no-deps --disable-pip-version-check -q \
            --no-binary :all: "llama-cpp-python==$SDIST_VERSION" -d "$dir" >&2
        [[ -f "$tarball" ]] || { echo "error: pip download left no $tarball" >&2; return 1; }
    fi
    digest="$(sha256sum "$tarball" | cut -d' ' -f1)"
    if [[ "$digest" != "$SDIST_SHA256" ]]; then
        echo "error: $tarball has sha256 $digest, expected $SDIST_SHA256" >&2
        return 1
    fi
    echo "$tarball"
}

# Prints the cmake to use: $CMAKE, cmake on PATH, or the PyPI wheel that a
# checkout build of llama-sys unpacked into target/llama-sys/; fails when
# none of them runs.
installed_cmake() {
    local root="$1" candidate
    for candidate in "${CMAKE:-}" cmake "$root/target/llama-sys/cmake-wheel/cmake/data/bin/cmake"; do
        if [[ -n "$candidate" ]] && "$candidate" --version >/dev/null 2>&1; then
            echo "$candidate"
            return 0
        fi
    done
    echo "error: no cmake: install one, set CMAKE, or build the workspace once (it fetches the wheel)" >&2
    return 1
}
