#!/usr/bin/env bash
# Issue 25's check: the oldest jax the package claims (pyproject's jax>=X)
# builds and passes the CPU suite, in a separate virtual environment.
#
#   bash scripts/oldest_jax_check.sh            # the minimum in pyproject.toml
#   JAX_VERSION=0.6.2 bash scripts/oldest_jax_check.sh
#
# VENV (default /tmp/venv-oldest-jax) is made anew unless KEEP_VENV=1. flax,
# optax, equinox and flatbuffers are left to pip's resolver with jax pinned
# (the newest releases that accept that jax). The suite runs from /tmp, on the
# installed package. The log goes to $LOG (default /tmp/oldest_jax_check.log).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
min=$(sed -n 's/^dependencies = \["jax>=\([0-9.]*\)".*/\1/p' "$repo/pyproject.toml")
ver=${JAX_VERSION:-$min}
case "$ver" in *.*.*) ;; *) ver="$ver.0" ;; esac
venv=${VENV:-/tmp/venv-oldest-jax}
log=${LOG:-/tmp/oldest_jax_check.log}
echo "jax $ver (pyproject's minimum: $min) in $venv; log $log"
if [ -z "${KEEP_VENV:-}" ] || [ ! -d "$venv" ]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
fi
. "$venv/bin/activate"
pip install -q "jax==$ver" "jaxlib==$ver" nanobind scikit-build-core pytest numpy \
    flax optax equinox flatbuffers
pip list 2>/dev/null | grep -iE '^(jax|jaxlib|flax|optax|equinox|flatbuffers|numpy) '
cd "$repo"
JAX_FLASH_CUDA=${JAX_FLASH_CUDA:-OFF} pip install -q --no-build-isolation --no-deps .
cd /tmp
python -c "import jax, jax_flash; print('jax', jax.__version__, jax_flash.build_info())"
python -m pytest "$repo/tests" -q -p no:cacheprovider -rfs "$@" 2>&1 | tee "$log" | tail -40
