#!/bin/bash
# The moe-1b MFU benchmark as one prepared GPU run (issue 16): bf16 compute, seq 2048, cuDNN attention, scanned
# layers, ragged_dot experts. Run from the repository root on a machine whose python3 has jax with CUDA:
#
#   bash lib/moe_trainer/benchmarks/gpu_moe1b.sh            # STEPS=10 WARMUP=2 BATCH=8 by default
#
# The device machines here have jax, optax, orbax-checkpoint, fsspec and numpy but not draccus: download its
# wheels first, on a machine with the registry (they travel in .whl/, carried with the run):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl \
#       draccus==0.11.6 mergedeep==1.3.4 toml==0.10.2
# Prints the benchmark's JSON (also written to $OUT/moe1b.json when $OUT is set) and a line "MFU moe-1b <x>".
set -euo pipefail
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="lib/moe_trainer/src:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
python3 -c "import draccus" 2>/dev/null || { echo "draccus is missing: carry its wheels in .whl/ (see above)"; exit 2; }
python3 -c "import jax; d = jax.devices()[0]; print('device:', d.platform, d.device_kind, 'jax', jax.__version__)"
out="${OUT:-/tmp}/moe1b.json"
python3 lib/moe_trainer/benchmarks/train_throughput.py --presets moe-1b --steps "${STEPS:-10}" \
  --warmup "${WARMUP:-2}" --batch-size "${BATCH:-8}" > "$out"
cat "$out"
