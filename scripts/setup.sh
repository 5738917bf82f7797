#!/usr/bin/env bash
# One-command set-up: a virtualenv in .venv with the CPU build of torch, MPI from PyPI and the
# project installed in editable mode. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -d .venv ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# torch first, the CPU build by default (on these machines 2.13.0 is on local disk; a looser spec
# may pull a multi-GB CUDA build). A torch already in the venv (a user's CUDA build) is kept.
python -c "import torch" 2>/dev/null || python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
python -m pip install -q -e '.[mpi-wheel,test]'
# Open MPI from the wheel refuses root and refuses more ranks than cores unless told; 9 ranks on a
# laptop or a 2-core VM is the normal case here, so the venv's activate script says so once, with
# the variables of fgl_common/launch.py, each set only where the shell has none (a user's or a
# launcher's value wins); the block is rewritten on every run of this script.
sed -i '/^# mpifgl: Open MPI settings/,/^# mpifgl: end of Open MPI settings/d' .venv/bin/activate
{
  echo "# mpifgl: Open MPI settings (added by scripts/setup.sh from fgl_common/launch.py)"
  python -m fgl_common.launch --activate
  echo "# mpifgl: end of Open MPI settings"
} >> .venv/bin/activate
# matplotlib's font cache is built here (it runs fc-list once), not in the middle of the first
# plot or test; the tests build their own where HOME is fresh (tests/conftest.py).
python - <<'PY'
import torch, torch_geometric, mpi4py, h5py
import matplotlib
matplotlib.use("Agg")
import matplotlib.font_manager
print(f"setup ok: torch {torch.__version__}, torch_geometric {torch_geometric.__version__}, "
      f"mpi4py {mpi4py.__version__}, h5py {h5py.__version__}")
PY
