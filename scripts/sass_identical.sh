#!/usr/bin/env bash
# Whether a change leaves the GPU code as it was: compiles CUDA units at
# revision BASE (a git worktree) and in this tree, each for sm_90a as the
# package does (-O3), and compares their SASS function by function with the
# addresses stripped. A refactor whose SASS is identical needs no device run
# before it lands (pending/README.md: no default GPU path may run code the
# GPU has not checked); one that moves a register does.
#
#   bash scripts/sass_identical.sh BASE [UNIT.cu ...]   # default: ffi/cuda/sm90/*.cu
#   e.g. bash scripts/sass_identical.sh HEAD ffi/cuda/sm90/bwd_launch_bf16.cu
#
# Prints "same" or "DIFF" per unit (a DIFF keeps both listings under
# $SASS_OUT, default /tmp/sass_identical, for `diff`); exits 1 when any unit
# differs or fails to compile. Needs nvcc, and cuobjdump on PATH or from the
# nvidia-cuda-cuobjdump wheel in this tree's .venv (`pip install
# nvidia-cuda-cuobjdump`: this CPU machine's CUDA has no binary utilities).
# ~10-40 s a unit and tree on 2 cores.
set -uo pipefail
base=${1:?usage: bash scripts/sass_identical.sh BASE [UNIT.cu ...]}
shift
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
units=("$@")
[ ${#units[@]} -gt 0 ] || units=(ffi/cuda/sm90/*.cu)
python=${PYTHON:-$root/.venv/bin/python}
[ -x "$python" ] || python=python3
if ! command -v cuobjdump > /dev/null; then
  wheel_bin=$("$python" -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'bin'))" 2>/dev/null)
  [ -x "$wheel_bin/cuobjdump" ] || wheel_bin=$(ls -d "$root"/.venv/lib/python3*/site-packages/nvidia/cu*/bin 2>/dev/null | head -1)
  [ -n "$wheel_bin" ] && [ -x "$wheel_bin/cuobjdump" ] || { echo "cuobjdump not found (pip install nvidia-cuda-cuobjdump)"; exit 1; }
  export PATH="$wheel_bin:$PATH"
fi
ffi_include=$("$python" -c "import jax; print(jax.ffi.include_dir())") || { echo "jax is needed for its FFI headers"; exit 1; }
out=${SASS_OUT:-/tmp/sass_identical}
rm -rf "$out" && mkdir -p "$out/base" "$out/tree"
worktree=$(mktemp -d)
git worktree add -q --detach "$worktree" "$base" || exit 1
trap 'git worktree remove --force "$worktree"' EXIT
# SASS of one unit of tree $1 into $2: addresses and encodings stripped.
sass() {
  local tree=$1 unit=$2 dest=$3
  (cd "$tree" && nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -Iffi \
    -isystem "$ffi_include" -w -c "$unit" -o "$dest.o") || return 1
  cuobjdump -sass "$dest.o" | sed -E 's|/\*[0-9a-fx]{4,}\*/||g; s|[[:space:]]+$||' > "$dest.sass"
  rm -f "$dest.o"
  [ -s "$dest.sass" ]
}
status=0
for unit in "${units[@]}"; do
  name=$(basename "$unit" .cu)
  if ! sass "$worktree" "$unit" "$out/base/$name" || ! sass "$root" "$unit" "$out/tree/$name"; then
    echo "FAIL $unit (compile or empty listing)"; status=1; continue
  fi
  if cmp -s "$out/base/$name.sass" "$out/tree/$name.sass"; then
    echo "same $unit ($(grep -c 'Function :' "$out/tree/$name.sass") functions)"
    rm -f "$out/base/$name.sass" "$out/tree/$name.sass"
  else
    echo "DIFF $unit (diff $out/base/$name.sass $out/tree/$name.sass)"; status=1
  fi
done
exit $status
