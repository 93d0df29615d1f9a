#!/usr/bin/env bash
# Creates (or updates) the Python venv the tests use, target/py-venv, with
# the pinned packages of scripts/requirements-test.txt. Prints the venv's
# python path. Idempotent: reinstalls only when the requirements changed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/target/py-venv"
req="$root/scripts/requirements-test.txt"
stamp="$venv/.requirements"
if [[ ! -x "$venv/bin/python" ]]; then
  python3 -m venv "$venv" >&2 || {
    echo "error: cannot create a Python venv: install python3 with its venv module (e.g. apt-get install python3-venv)" >&2
    exit 1
  }
fi
if ! cmp -s "$req" "$stamp"; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req" >&2
  cp "$req" "$stamp"
fi
echo "$venv/bin/python"
