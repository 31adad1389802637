#!/usr/bin/env bash
# Installs a built wheel (scripts/build_wheel.sh) into a fresh virtual
# environment with no compiler on PATH (no gcc, g++, nvcc, cmake: a build step
# would fail) and runs a slice of the suite from outside the source tree
# (ARGS: pytest arguments; default the attention and paged tests, -x;
# TESTS: the test files, default those two).
#
#   bash scripts/check_wheel.sh dist/jax_flash-*.whl
#   OFFLINE=1 TESTS=tests bash scripts/check_wheel.sh dist/*.whl   # no network (the H200):
#       the wheel alone unpacked by pip into a folder ahead of the running
#       Python's own packages (jax, pytest and the rest come from those)
set -euo pipefail
wheel=$(realpath "$1")
repo=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "${OFFLINE:-}" ]; then
  # A venv would not do there: python3 is itself a venv's, whose packages a
  # --system-site-packages venv does not see.
  site=$(mktemp -d)/site
  python3 -m pip install -q --no-index --no-deps --target "$site" "$wheel"
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  # Run by its full path (its venv's packages come with it) with PATH bare:
  # that venv's bin/ holds cmake and ninja.
  py=$(command -v python3)
  path_dirs=""
else
  venv=$(mktemp -d)/venv
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "$wheel" pytest flatbuffers
  py="$venv/bin/python"
  path_dirs="$venv/bin:"
fi
# PATH with (the fresh venv and) the basic tools only: no compiler can be found.
bare=$(mktemp -d)
for tool in env sh bash ls cat mkdir rm; do ln -s "$(command -v $tool)" "$bare/$tool"; done
for tool in gcc g++ cc c++ nvcc cmake; do
  if PATH="$path_dirs$bare" command -v $tool > /dev/null 2>&1; then echo "a compiler is visible: $tool"; exit 1; fi
done
cd "$(mktemp -d)"
# Several pytest-xdist workers (ARGS="-n 8") share one GPU: without this each
# preallocates 75% of its memory and the rest fail (session 16, the H200).
export XLA_PYTHON_CLIENT_PREALLOCATE=${XLA_PYTHON_CLIENT_PREALLOCATE:-false}
PATH="$path_dirs$bare" "$py" -c "import jax_flash, jax; print(jax.__version__, jax.devices(), jax_flash.build_info(), jax_flash.__file__)"
if [ -n "${OFFLINE:-}" ]; then  # the wheel's copy must be the one imported, not an earlier install
  where=$(PATH="$path_dirs$bare" "$py" -c "import jax_flash; print(jax_flash.__file__)")
  case "$where" in "$site"/*) ;; *) echo "jax_flash imports from $where, not the wheel"; exit 1;; esac
fi
tests=()
for t in ${TESTS:-tests/test_attention.py tests/test_paged.py}; do tests+=("$repo/$t"); done
PATH="$path_dirs$bare" "$py" -m pytest "${tests[@]}" -q -x ${ARGS:-}
