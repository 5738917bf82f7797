"""The gpu tier runs where torch sees a CUDA device; elsewhere every test of it is skipped with
the reason (the one allowed skip besides the SLURM submissions)."""
import pytest
import torch

NO_GPU = "no CUDA device: torch {} (CUDA {}) sees none".format(
    torch.__version__, torch.version.cuda or "none, a CPU build")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    for item in items:
        if "tests/gpu/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.skip(reason=NO_GPU))
