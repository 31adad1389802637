# ab/stack's combined patch: main + the three 256 patches + m0 + STACK_TOP
# (default: the soft cap's PolyExp2, the bias tiles, the bias's batch-inner
# order and the 7-round Philox), merged three-way. The bias tiles' hunk in
# bwd_launch.cuh meets the 256 patch's (the kernel's pick and launch):
# resolved by hand, ab/stack_resolved_bias/bwd_launch.cuh (session 36, on
# ab24e31; its fwd_kernel.cuh and launch.cuh were session 35's resolutions
# against the keep warps, dropped).
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
# STACK_TOP: the patches after m0, in order.
for p in ${STACK_TOP:-sm90-fwd-softcap-poly sm90-bias-tiles sm90-fwd-bias-batch-inner dropout-philox7}; do
  git apply --3way "$root/pending/$p.patch" || true
  if git diff --name-only --diff-filter=U | grep -q .; then
    case "$p" in
      sm90-bias-tiles) resolved=stack_resolved_bias files="bwd_launch.cuh" ;;
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
