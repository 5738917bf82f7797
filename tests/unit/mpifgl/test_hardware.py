"""mpifgl.hardware: --threads auto divides the cores a process may use among the ranks of its
node that share them and never gives more than SLURM_CPUS_PER_TASK; --device names the flag
when it cannot be met; the placement of ranks that are threads (tests/helpers/thread_comm.py);
freed heap pages go back to the system."""
from __future__ import annotations


import numpy as np
import psutil
import pytest
import torch

from mpifgl import hardware
from mpifgl.config import TrainConfig, check_device_spec, parse_threads
from tests.helpers.thread_comm import ThreadWorld


@pytest.mark.parametrize("mine,node,expected", [
    ({0, 1}, [{0, 1}] * 9, 1),  # 9 ranks on 2 cores: 1 thread each, never 0
    ({0, 1}, [{0, 1}], 2),  # one process on 2 cores
    (set(range(16)), [set(range(16))] * 4, 4),  # 4 unbound ranks on 16 cores
    ({0, 1, 2, 3}, [{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}], 4),  # srun -c 4: pinned apart
    (set(range(16)), [set(range(16))] * 5, 3),  # floor: 5 x 3 = 15 <= 16 cores
])
def test_auto_threads_share_the_cores_without_oversubscribing(mine, node, expected, monkeypatch):
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    assert hardware.auto_threads(mine, node) == expected
    assert expected * sum(1 for cores in node if cores & mine) <= max(len(mine), len(node))


def test_gpu_clients_take_one_core_and_the_server_the_rest(monkeypatch):
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    cores, node, light = set(range(16)), [set(range(16))] * 9, [False] + [True] * 8
    assert hardware.auto_threads(cores, node, light, i_am_light=False) == 8  # the server
    assert hardware.auto_threads(cores, node, light, i_am_light=True) == 1  # a GPU client
    assert hardware.auto_threads({0, 1}, [{0, 1}] * 9, light, i_am_light=False) == 1


def test_slurm_cpus_per_task_caps_auto(monkeypatch):
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "2")
    assert hardware.auto_threads(set(range(16)), [set(range(16))]) == 2


def test_thread_and_device_flags_name_themselves():
    assert parse_threads("auto") == 0 and parse_threads("6") == 6
    for bad in ("0", "-1", "many", ""):
        with pytest.raises(ValueError, match=f"--threads is {bad!r}, expected auto or an integer"):
            parse_threads(bad)
    for good in ("auto", "cpu", "cuda", "cuda:3"):
        check_device_spec(good)
    with pytest.raises(ValueError, match="--device is 'gpu', expected one of auto, cpu, cuda"):
        TrainConfig(device="gpu").validate()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("spec", ["cuda", "cuda:1"])
def test_a_gpu_asked_for_without_one_is_a_one_line_error(spec):
    with pytest.raises(ValueError, match=f"--device {spec}: torch sees no CUDA device"):
        hardware.resolve_device(spec, 0)
    assert hardware.resolve_device("auto", 3) == torch.device("cpu")


def test_placement_of_every_rank_of_a_node():
    """Three threads as one node's ranks, on the cores this process may use: auto threads
    divide them, every rank records its device."""
    cores = len(hardware.usable_cores())
    placements = ThreadWorld(3).run(lambda comm: hardware.place("cpu", "auto", comm))
    assert [p.threads for p in placements] == [max(1, cores // 3)] * 3
    assert {str(p.device) for p in placements} == {"cpu"}
    assert placements[0].describe().startswith("cpu, ")
    fixed = ThreadWorld(2).run(lambda comm: hardware.place("cpu", "5", comm))
    assert [p.threads for p in fixed] == [5, 5]


def _resident_mb() -> float:
    return psutil.Process().memory_info().rss / 2 ** 20


def test_freed_heap_blocks_in_the_middle_of_the_heap_go_back_to_the_system():
    """Blocks below glibc's mapping threshold come from its heap; freed below a block still in
    use they stay resident, until release_free_heap gives their pages back."""
    blocks = [np.ones(12_500) for _ in range(400)]  # 100 KB each, 40 MB, written: resident
    fence = np.ones(12_500)  # above them: the heap cannot shrink from its top
    del blocks
    before = _resident_mb()
    if not hardware.release_free_heap():
        pytest.skip("the C library is not glibc")
    assert _resident_mb() < before - 20
    del fence
