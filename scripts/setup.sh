#!/usr/bin/env bash
# One-command set-up: a virtualenv in .venv with the CPU build of torch, MPI from PyPI and the
# project installed in editable mode. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -d .venv ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# torch first, pinned: on these machines 2.13.0 is the CPU build on local disk; anything looser
# may pull a multi-GB CUDA build.
python -m pip install -q torch==2.13.0
python -m pip install -q -e '.[mpi-wheel,test]'
# Open MPI from the wheel refuses root and refuses more ranks than cores unless told; 9 ranks on a
# laptop or a 2-core VM is the normal case here, so the venv's activate script says so once.
if ! grep -q "mpifgl: Open MPI settings" .venv/bin/activate; then
  cat >> .venv/bin/activate <<'ACT'
# mpifgl: Open MPI settings (added by scripts/setup.sh)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
ACT
fi
python - <<'PY'
import torch, torch_geometric, mpi4py, h5py
print(f"setup ok: torch {torch.__version__}, torch_geometric {torch_geometric.__version__}, "
      f"mpi4py {mpi4py.__version__}, h5py {h5py.__version__}")
PY
