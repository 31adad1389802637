#!/usr/bin/env bash
# Exports git refs as plain source trees under ab/<ref with / -> ->, for
# scripts/gpu_ab.sh: the device machine gets the working tree, not the git
# history, so each version to compare must travel as files. ab/ is
# git-ignored: name it in the device run's `carry` (["ab"]) so it travels.
#
#   bash scripts/export_refs.sh main wip/sm80-bwd-h256   # -> ab/main ab/wip-sm80-bwd-h256
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
for ref in "$@"; do
  dir="ab/${ref//\//-}"
  rm -rf "$dir"
  mkdir -p "$dir"
  git archive "$ref" | tar -x -C "$dir"
  rm -rf "$dir/docs"  # charts and JSON need not travel
  echo "$dir"
done
