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
# sm90-fwd-dropout-keep-warps dropout-philox7" once stage keepwarps keeps them).
for p in ${STACK_TOP:-sm90-plain-transforms sm90-bwd-dropout-pairs sm90-fwd-softcap-poly}; do
  git apply --3way "$root/pending/$p.patch" || true
  if git diff --name-only --diff-filter=U | grep -q .; then
    # The pairs patch meets the 256 patch in three files: their hand
    # resolution (session 33), kept beside the wheel.
    [ "$p" = sm90-bwd-dropout-pairs ] || { echo "conflict in $p"; exit 1; }
    # (ab/ is this machine's, git-ignored: without it, resolve the three
    # conflicts by hand here and keep the files there.)
    [ -d "$root/ab/stack_resolved" ] || { echo "no ab/stack_resolved: resolve $p's conflicts by hand"; exit 1; }
    for f in bwd_kernel_traits.cuh bwd_launch.cuh bwd_launch.h; do
      cp "$root/ab/stack_resolved/$f" ffi/cuda/sm90/$f
    done
  fi
  git add -A && git -c user.email=stack@local -c user.name=stack commit -qm "stack: $p (temp)"
done
git diff "$base" HEAD > /tmp/stack_keep.patch
cd / && git -C "$root" worktree remove --force /tmp/stk_build
wc -l /tmp/stack_keep.patch
