# ab/stack's combined patch: main + the three 256 patches + m0 + the plain
# transforms + the dropout pairs + the soft cap's PolyExp2 (STACK_TOP), those
# merged three-way (the pairs' hunks meet the 256 patch's in bwd_launch.cuh,
# bwd_launch.h and bwd_kernel_traits.cuh: resolved by hand, ab/stack_resolved/).
# Writes /tmp/stack_keep.patch; then
#   bash scripts/ab_wheel.sh stack /tmp/stack_keep.patch
set -e
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
base=$(git -C "$root" rev-parse HEAD)
rm -rf /tmp/stk_build && git -C "$root" worktree add -q --detach /tmp/stk_build "$base"
cd /tmp/stk_build
for p in sm90-bwd-256 sm90-bwd-256-deterministic sm90-bwd-256-operand-split sm90-bwd-counter-m0; do
  git apply "$root/pending/$p.patch"
done
git add -A && git -c user.email=stack@local -c user.name=stack commit -qm "stack: 256 + m0 (temp)"
# STACK_TOP: the patches after m0, in order (session 34 added the dropout
# keep warps and the 7-round Philox as candidates: STACK_TOP="... 
# sm90-fwd-dropout-keep-warps dropout-philox7" once stage keepwarps keeps
# them; session 35 the bias tiles and the batch-inner order, after the step
# copies: every pending sm90 patch is STACK_TOP="sm90-plain-transforms
# sm90-bwd-dropout-pairs sm90-fwd-softcap-poly sm90-fwd-dropout-keep-warps
# dropout-philox7 sm90-bwd-feature-step-copies sm90-bias-tiles
# sm90-fwd-bias-batch-inner", ab/stackall's).
for p in ${STACK_TOP:-sm90-plain-transforms sm90-bwd-dropout-pairs sm90-fwd-softcap-poly}; do
  git apply --3way "$root/pending/$p.patch" || true
  if git diff --name-only --diff-filter=U | grep -q .; then
    # The pairs patch meets the 256 patch in three files, the bias tiles
    # (session 35) the keep warps and the 256 patch in three: their hand
    # resolutions, kept beside the wheels (each for the STACK_TOP of
    # session 34's stage plus the bias tiles, in that order).
    case "$p" in
      sm90-bwd-dropout-pairs) resolved=stack_resolved files="bwd_kernel_traits.cuh bwd_launch.cuh bwd_launch.h" ;;
      sm90-bias-tiles) resolved=stack_resolved_bias files="bwd_launch.cuh fwd_kernel.cuh launch.cuh" ;;
      *) echo "conflict in $p"; exit 1 ;;
    esac
    # (ab/ is this machine's, git-ignored: without it, resolve the
    # conflicts by hand here and keep the files there.)
    [ -d "$root/ab/$resolved" ] || { echo "no ab/$resolved: resolve $p's conflicts by hand"; exit 1; }
    for f in $files; do
      cp "$root/ab/$resolved/$f" ffi/cuda/sm90/$f
    done
  fi
  git add -A && git -c user.email=stack@local -c user.name=stack commit -qm "stack: $p (temp)"
done
git diff "$base" HEAD > /tmp/stack_keep.patch
cd / && git -C "$root" worktree remove --force /tmp/stk_build
wc -l /tmp/stack_keep.patch
