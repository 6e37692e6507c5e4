#!/usr/bin/env bash
# benchmarks/executor_overhead.py before/after an earlier revision, alternating (benchmarks/ab.sh).
#
#   benchmarks/executor_ab.sh REV PAIRS OUTDIR [executor_overhead.py flags, e.g. --no-ray]
set -euo pipefail
exec "$(dirname "$0")/ab.sh" "$1" "$2" "$3" benchmarks/executor_overhead.py "${@:4}"
