#!/usr/bin/env bash
# Installs a built wheel (scripts/build_wheel.sh) into a fresh virtual
# environment with no compiler on PATH (no gcc, g++, nvcc, cmake: a build step
# would fail) and runs a slice of the suite from outside the source tree
# (ARGS: pytest arguments; default the attention and paged tests, -x).
#
#   bash scripts/check_wheel.sh dist/jax_flash-*.whl
set -euo pipefail
wheel=$(realpath "$1")
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=$(mktemp -d)/venv
python3 -m venv "$venv"
"$venv/bin/pip" install -q "$wheel" pytest flatbuffers
# PATH with the venv and the basic tools only: no compiler can be found.
bare=$(mktemp -d)
for tool in env sh bash ls cat mkdir rm; do ln -s "$(command -v $tool)" "$bare/$tool"; done
for tool in gcc g++ cc c++ nvcc cmake; do
  if PATH="$venv/bin:$bare" command -v $tool > /dev/null 2>&1; then echo "a compiler is visible: $tool"; exit 1; fi
done
cd "$(mktemp -d)"
PATH="$venv/bin:$bare" "$venv/bin/python" -c "import jax_flash, jax; print(jax.__version__, jax.devices(), jax_flash.build_info())"
PATH="$venv/bin:$bare" "$venv/bin/python" -m pytest "$repo/tests/test_attention.py" "$repo/tests/test_paged.py" -q -x ${ARGS:-}
