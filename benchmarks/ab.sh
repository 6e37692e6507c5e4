#!/usr/bin/env bash
# Alternate a JSON-printing benchmark between an earlier revision and this checkout, PAIRS times, on the same
# machine and venv (before-after, then after-before, ...: whatever one run leaves the next lands on both
# sides), and print the medians and the median after/before ratio of the pairs (benchmarks/ab_summary.py).
#
#   benchmarks/ab.sh REV PAIRS OUTDIR SCRIPT [the script's flags]
#
# Each side imports the project from its own tree (PYTHONPATH=tree:tree/lib/moe_trainer/src, ahead of the
# venv's editable install). A relative SCRIPT is each tree's own copy; an absolute one is that one file run
# against both trees' code (a driver that uses only names both revisions have, e.g.
# lib/moe_trainer/benchmarks/train_loop.py). Run it under scripts/netns when the benchmark starts Ray.
set -euo pipefail
rev=$1; pairs=$2; out=$3; script=$4; shift 4
here=$(cd "$(dirname "$0")/.." && pwd)
py="$here/.venv/bin/python"
base=$(mktemp -d /tmp/marin-ab-XXXX)
git -C "$here" worktree add -q --detach "$base/tree" "$rev"
trap 'git -C "$here" worktree remove --force "$base/tree"; rm -rf "$base"' EXIT
mkdir -p "$out"
for i in $(seq 1 "$pairs"); do
  sides="before after"; [ $((i % 2)) = 0 ] && sides="after before"
  for side in $sides; do
    dir="$base/tree"; [ "$side" = after ] && dir="$here"
    (cd "$dir" && PYTHONPATH="$dir:$dir/lib/moe_trainer/src" "$py" "$script" "$@" \
      > "$out/$side-$i.json" 2> "$out/$side-$i.err")
  done
done
"$py" "$here/benchmarks/ab_summary.py" "$out"
