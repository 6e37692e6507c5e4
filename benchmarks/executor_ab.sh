#!/usr/bin/env bash
# Alternate benchmarks/executor_overhead.py between an earlier revision and this checkout, PAIRS times, on the
# same machine and venv (before-after, then after-before, ...: whatever one run leaves the next lands on
# both sides), and print the medians and the median after/before
# ratio of the pairs (benchmarks/ab_summary.py). Alternating keeps a loaded machine's drift out of the ratio.
#
#   benchmarks/executor_ab.sh REV PAIRS OUTDIR [executor_overhead.py flags, e.g. --no-ray]
set -euo pipefail
rev=$1; pairs=$2; out=$3; shift 3
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
    (cd "$dir" && "$py" benchmarks/executor_overhead.py "$@" > "$out/$side-$i.json" 2> "$out/$side-$i.err")
  done
done
"$py" "$here/benchmarks/ab_summary.py" "$out"
