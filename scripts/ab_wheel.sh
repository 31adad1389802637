#!/usr/bin/env bash
# A package variant built here as a wheel for scripts/gpu_ab.sh, so that the
# device call spends its minutes timing, not compiling: a package build there
# costs ~105-160 s of the call per variant (session 29: three builds were
# ~470 s of its 30 minutes), installing a wheel a few seconds (the A/B of
# three wheels, four benchmark runs of eight cases, took 143 s in all).
#
#   bash scripts/ab_wheel.sh NAME [PATCH ...]    # -> ab/NAME/jax_flash-*.whl
#   (then, on the device, carry ["ab"]:)
#   AB_DIRS="ab/main ab/NAME" AB_ROUNDS=2 BENCH_ARGS="--impl jax_flash ..." bash scripts/gpu_ab.sh
#   (AB_TESTS="tests/test_x.py" AB_TEST_DIRS=ab/NAME: the variant's own tests,
#   copied beside its wheel, run against it there)
#
# NAME's wheel is main's commit (HEAD; uncommitted changes travel as PATCHes,
# paths from the repository root or absolute) plus the patches, in order.
# The wheels are for the H200's Python and jax (cp312 against jax 0.11.2's
# FFI headers, from a virtual environment made once in $AB_VENV) and for
# sm_90a alone (the only GPU they are timed on; the sm80 and generic kernels
# are compiled for it as well and run there): not for distribution
# (build_wheel.sh is). The variants share one source folder ($AB_SRC, a
# clone) and one CMake build folder ($AB_BUILD), so a variant recompiles
# only what its patches touch: git rewrites only the files that differ, and
# ninja goes by file times. A whole build takes ~3 minutes here (2 cores).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
name=${1:?usage: bash scripts/ab_wheel.sh NAME [PATCH ...]}
shift
src=${AB_SRC:-/tmp/ab_wheel_src} build_dir=${AB_BUILD:-/tmp/ab_wheel_build} venv=${AB_VENV:-/tmp/ab_wheel_venv}
patches=()
for patch in "$@"; do patches+=("$(cd "$root" && realpath "$patch")"); done
if [ ! -x "$venv/bin/python" ]; then
  "${AB_PYTHON:-python3.12}" -m venv "$venv"
  "$venv/bin/pip" install -q "jax==${AB_JAX:-0.11.2}" nanobind scikit-build-core
fi
[ -d "$src/.git" ] || git clone -q "$root" "$src"
# (A clean tree first: a patch that failed to apply in an earlier run left
# the ones before it applied.)
git -C "$src" checkout -q -- . && git -C "$src" clean -qfd
git -C "$src" fetch -q "$root" HEAD
git -C "$src" checkout -q --detach FETCH_HEAD
for patch in "${patches[@]}"; do git -C "$src" apply "$patch"; done
raw=$(mktemp -d)
start=$(date +%s)
(cd "$src" && CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} JAX_FLASH_CPU_NATIVE=OFF \
  "$venv/bin/pip" wheel -q --no-build-isolation --no-deps -C build-dir="$build_dir" \
  -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -w "$raw" . > "$raw/build.log" 2>&1) ||
  { tail -30 "$raw/build.log"; git -C "$src" checkout -q -- . && git -C "$src" clean -qfd; exit 1; }
rm -rf "$root/ab/$name" && mkdir -p "$root/ab/$name"
mv "$raw"/*.whl "$root/ab/$name/"  # (pip wants the wheel's own file name)
# The variant's tests beside it, for gpu_ab.sh's AB_TESTS (run against the
# wheel), with what they read from the tree around them (the README's
# snippets, the examples, the scripts they run, the sources the C++ and
# CUDA tests compile).
cp -r "$src/tests" "$src/examples" "$src/scripts" "$src/ffi" "$src/README.md" "$root/ab/$name/"
rm -rf "$raw"
# Back to main, so the next variant starts from it (its patched files get
# new times: ninja rebuilds them then).
git -C "$src" checkout -q -- . && git -C "$src" clean -qfd
echo "ab/$name (main $(git -C "$root" rev-parse --short HEAD)${*:+ + $*}): built in $(( $(date +%s) - start )) s, $(du -h "$root/ab/$name"/*.whl | cut -f1)"
