"""mpifgl.exchange (the package: ``build_exchange`` and ``CrossClientSums``) without mpirun:
every mode of the registry, run by threads through ThreadComm (tests/helpers/thread_comm.py),
gives each owner the sum of the other clients' terms for its rows, whole and in chunks, sampled
or not, with a client that touches nothing; the hooks follow one schedule on every rank. Each
mode's own pieces are tested in tests/unit/mpifgl/exchange/; the bytes a real run records are
checked under mpirun (tests/mpi/test_exchange.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fgl_common.shard_format import read_manifest
from mpifgl.exchange import CrossClientSums, build_exchange
from mpifgl.model import GNN
from mpifgl.registry import EXCHANGES
from tests.helpers.exchange import ONE_ROW_MB, expected_sums, islands_shards, run_exchange
from tests.helpers.thread_comm import ThreadWorld


@pytest.mark.parametrize("mode", list(EXCHANGES))
@pytest.mark.parametrize("buffer_mb", [64.0, ONE_ROW_MB])
@pytest.mark.parametrize("sampled", [False, True])
def test_every_mode_gives_each_owner_the_other_clients_terms(tmp_path, mode, buffer_mb, sampled):
    shard_dir = islands_shards(tmp_path)
    sizes = read_manifest(shard_dir).client_sizes()
    rng = np.random.default_rng(4)
    samples = ([np.sort(rng.choice(n, (2 * n) // 3, replace=False)) for n in sizes]
               if sampled else None)
    results = run_exchange(shard_dir, mode, buffer_mb, samples)
    assert results[0][0].shape == (0, 5)  # the server holds no rows
    for (result, added, _, plan, chunks), expected in zip(results[1:], expected_sums(results)):
        np.testing.assert_allclose(result.numpy(), expected, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(added.numpy(), expected + 1.0, rtol=1e-12, atol=1e-12)
        assert not np.any(np.delete(result.numpy(), plan.receive_rows, axis=0))
    islander = results[3]
    assert islander[3].touched.size == 0 and islander[3].receive_rows.size == 0
    assert not islander[0].numpy().any()
    if buffer_mb == ONE_ROW_MB:  # one row per chunk: as many chunks as summed rows
        assert results[1][4] > 1


def test_an_unknown_mode_and_a_mode_secure_cannot_mask_are_named():
    from tests.helpers.thread_comm import ThreadComm
    comm = ThreadComm(ThreadWorld(2), 1)
    with pytest.raises(ValueError, match="--exchange 'mesh', expected one of compact, "
                                         "compact-reduce, reduce, star"):
        build_exchange(comm, "mesh", 1 << 20, 4, torch.float32)
    with pytest.raises(ValueError, match="--secure with --exchange 'star': expected --exchange "
                                         "one of compact"):
        build_exchange(comm, "star", 1 << 20, 4, torch.float32, masking=object())


def test_the_schedule_is_recorded_from_the_layers_and_its_order_is_enforced(tmp_path):
    """Every propagation registers its width once, in forward order; a forward and backward pass
    run the sums 0..L-1 then L-1..0 (the server's pass follows the same list); a sum out of that
    order is an error naming both, not a silent mismatch of collectives."""
    model = GNN("gcn", 6, 4, 3, 3, 0.0, seed=0)

    class Recording:
        dtype = torch.float32

        def __init__(self):
            self.calls = []

        def run(self, plan, y, slot, total=None):
            self.calls.append((slot, y.shape[1]))
            return torch.zeros_like(y) if total is None else total

    exchange = Recording()
    sums = CrossClientSums(exchange)
    sums.attach(model)
    assert sums.widths == [4, 4, 3]
    assert [len(layer.cross_sums) for layer in model.layers] == [1, 1, 1]
    sums.start_pass("train")
    sums.server_pass(plan=None, backward=True)
    assert exchange.calls == [(("train", "forward", k), w) for k, w in enumerate([4, 4, 3])] + \
        [(("train", "backward", k), w) for k, w in reversed(list(enumerate([4, 4, 3])))]
    sums.start_pass("eval")
    sums.run(None, torch.zeros(0, 4), "forward", 0)
    with pytest.raises(RuntimeError, match="cross-client sum 2 ran forward where sum 1"):
        sums.run(None, torch.zeros(0, 3), "forward", 2)
