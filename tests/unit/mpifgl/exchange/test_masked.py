"""mpifgl.exchange.masked (--secure's exchange), without mpirun: ranks are threads.

* exactness: one masked exchange equals the plain one within the derived bound m * 2^-(e+1)
  per row sum (e from the range each use ran with), whole and in one-row chunks;
* lagged exponents: a jump beyond the headroom redoes the exchange once on every rank, a steady
  slot never does nor agrees again after its first use, every rank ends with one state;
* bit for bit: for fixed keys, the words each client sends and each owner's decoded rows are
  those of a straightforward reference encoding and keystream.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fgl_common.shard_format import read_manifest
from mpifgl import fixed_point, secure
from mpifgl.exchange import build_exchange
from mpifgl.exchange.masked import MASKS
from mpifgl.graph import ClientGraph, build_operator
from tests.helpers.exchange import SLOT
from tests.helpers.graphs import random_parts, write_shards
from tests.helpers.keys import fixed_key, fixed_session, reference_keystream
from tests.helpers.ring_reference import reference_decode, reference_encode
from tests.helpers.thread_comm import ThreadWorld

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # ranks are threads


def shards_for(toy_graph, tmp_path: Path, num_clients: int, seed: int) -> Path:
    return write_shards(toy_graph, random_parts(toy_graph.num_nodes, num_clients, seed=seed),
                        tmp_path / f"shards-{num_clients}-{seed}")


def exchange_on_plan(comm, shard_dir: Path, masked: bool, buffer_mb: float, dtype):
    """This rank's compact exchange (masked or not) prepared on its full-graph plan, width 5
    -> (exchange, plan, the number of rows y has, the session or None)."""
    graph = ClientGraph.for_rank(shard_dir, read_manifest(shard_dir), comm.client_id)
    session = secure.SecureSession.agree(comm) if masked else None
    torch_dtype = torch.float64 if dtype == np.float64 else torch.float32
    exchange = build_exchange(comm, "compact", int(buffer_mb * 2 ** 20), 5, torch_dtype, session)
    plan = build_operator(graph, "gcn", None, None, torch_dtype, True).exchange
    exchange.prepare(plan)
    rows = plan.send_rows.shape[1] if plan.send_rows is not None else 0
    return exchange, plan, rows, session


def terms_of(plan, y: np.ndarray) -> np.ndarray:
    """A client's terms A_i,cross^T y on its touched rows."""
    if plan.send_rows is None:
        return np.zeros((0, y.shape[1]))
    return plan.send_rows.matmul(torch.from_numpy(y)).numpy()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("buffer_mb", [256.0, 1e-6])
def test_masked_exchange_within_the_derived_bound(toy_graph, tmp_path, dtype, buffer_mb):
    """One exchange of random terms, plain and masked: every owner's row sums differ by at most
    m * 2^-(e+1), e = k - 2 - ceil(log2 m) - ceil(log2 max|term|) (mpifgl.secure)."""
    num_clients = 4
    shard_dir = shards_for(toy_graph, tmp_path, num_clients, seed=2)

    def body(comm, masked: bool):
        exchange, plan, rows, session = exchange_on_plan(comm, shard_dir, masked,
                                                         buffer_mb, dtype)
        y = np.random.default_rng(comm.rank).normal(scale=30.0, size=(rows, 5)).astype(dtype)
        terms = terms_of(plan, y)
        return (exchange.run(plan, torch.from_numpy(y), SLOT).numpy(),
                float(np.abs(terms).max(initial=0)))

    plain = ThreadWorld(num_clients + 1).run(lambda comm: body(comm, False))
    masked = ThreadWorld(num_clients + 1).run(lambda comm: body(comm, True))
    ring = fixed_point.ring_of(np.dtype(dtype))
    largest = max(found for _, found in masked)
    bound = fixed_point.sum_error_bound(ring, num_clients, largest)
    float_rounding = num_clients * np.finfo(dtype).eps * largest  # the plain sum's own
    for (a, _), (b, _) in zip(plain[1:], masked[1:]):
        assert np.max(np.abs(a.astype(np.float64) - b), initial=0) <= bound + float_rounding


# -- lagged exponents: redo on a jump, none in a steady run, one state on every rank ------------
def exchange_sequence(toy_graph, tmp_path, dtype, buffer_mb: float, scales: list[float]):
    """One exchange slot used once per scale (terms of that magnitude), plain and masked ->
    (plain outputs by rank, masked outputs by rank, sessions by rank, max_to_all calls)."""
    num_clients = 4
    shard_dir = shards_for(toy_graph, tmp_path, num_clients, seed=2)

    def body(comm, masked: bool):
        exchange, plan, rows, session = exchange_on_plan(comm, shard_dir, masked,
                                                         buffer_mb, dtype)
        rng = np.random.default_rng(comm.rank)
        outputs, states = [], []
        for scale in scales:
            y = rng.normal(scale=scale, size=(rows, 5)).astype(dtype)
            lagged = None if session is None else session.ranges.lagged(SLOT)
            outputs.append(exchange.run(plan, torch.from_numpy(y), SLOT).numpy().copy())
            if session is not None:  # the range this use was given, the largest it needed
                states.append((None if lagged is None else lagged.tolist(),
                               session.ranges.agreed[SLOT]))
        return outputs, states, session

    plain = ThreadWorld(num_clients + 1).run(lambda comm: body(comm, False))
    world = ThreadWorld(num_clients + 1)
    masked = world.run(lambda comm: body(comm, True))
    return plain, masked, world.max_to_all_calls


def assert_within_range_bound(plain, masked, dtype, num_clients: int = 4):
    """Each use's outputs within m * 2^-(e+1) of the plain ones, e from the range that use
    ran with: the lagged one, or after a redo the exponent the senders reported."""
    ring = fixed_point.ring_of(np.dtype(dtype))
    states = masked[1][1]  # every rank holds the same (asserted by the callers)
    for use, (lagged, (largest,)) in enumerate(states):
        used = largest if lagged is None else max(lagged[0], largest)
        bound = num_clients * 2.0 ** (-fixed_point.scale_exponent(ring, num_clients, used) - 1)
        float_rounding = num_clients * np.finfo(dtype).eps * 2.0 ** largest
        for (a, _, _), (b, _, _) in zip(plain[1:], masked[1:]):
            error = np.max(np.abs(a[use].astype(np.float64) - b[use]), initial=0)
            assert error <= bound + float_rounding, (use, error, bound)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("buffer_mb", [256.0, 1e-6])
def test_a_jump_beyond_the_headroom_redoes_the_exchange_and_stays_exact(toy_graph, tmp_path,
                                                                       dtype, buffer_mb):
    """Terms 2^6 times larger than the last use exceed the lagged range (2 bits of headroom):
    every rank redoes the exchange once with the reported exponent; the result is the plain
    exchange's within the bound of that exponent, and every rank ends with one state."""
    scales = [1.0, 64.0, 64.0, 1.0 / 64]
    plain, masked, agreements = exchange_sequence(toy_graph, tmp_path, dtype, buffer_mb, scales)
    sessions = [session for _, _, session in masked]
    assert [s.redos for s in sessions] == [1] * 5  # the server's view included
    assert all(states == masked[0][1] for _, states, _ in masked)
    assert agreements == 1  # the slot's first use only
    assert_within_range_bound(plain, masked, dtype)


@pytest.mark.parametrize("buffer_mb", [256.0, 1e-6])
def test_a_steady_slot_needs_no_redo_and_no_agreement_after_its_first_use(toy_graph, tmp_path,
                                                                          buffer_mb):
    scales = [1.0, 1.5, 0.8, 2.0, 1.2, 1.0]
    plain, masked, agreements = exchange_sequence(toy_graph, tmp_path, np.float32, buffer_mb,
                                                  scales)
    assert [session.redos for _, _, session in masked] == [0] * 5
    assert agreements == 1
    assert all(states == masked[0][1] for _, states, _ in masked)
    assert_within_range_bound(plain, masked, np.float32)


# -- bit for bit: the masked paths against a straightforward reference ---------------------------
# The reference keeps the first implementation's arithmetic (a separate range scan, scale, round,
# convert; one fresh keystream per call, added with +=): for fixed keys, the words every client
# sends and every decoded output must be the same bits whatever the optimised code does.
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("buffer_mb", [256.0, 1e-6])
def test_masked_exchange_is_bit_identical_to_the_reference(toy_graph, tmp_path, monkeypatch,
                                                           dtype, buffer_mb):
    """Fixed keys, one masked exchange: each client's words on the wire are a head row (its
    exponent word, zeros) then reference_encode(terms) + the owners' keystreams, and each
    owner's rows are reference_decode of the ring sum of every sender's encoded terms, bit for
    bit."""
    num_clients = 4
    shard_dir = shards_for(toy_graph, tmp_path, num_clients, seed=2)
    monkeypatch.setattr(secure.SecureSession, "agree", classmethod(
        lambda cls, comm: fixed_session(comm)))
    ring = fixed_point.ring_of(np.dtype(dtype))

    def body(comm):
        exchange, plan, rows, session = exchange_on_plan(comm, shard_dir, True,
                                                         buffer_mb, dtype)
        y = np.random.default_rng(comm.rank).normal(scale=30.0, size=(rows, 5)).astype(dtype)
        output = exchange.run(plan, torch.from_numpy(y), SLOT).numpy().copy()
        terms = terms_of(plan, y) if plan.send_rows is not None else None
        return output, terms, plan, session.ranges.agreed[SLOT][0], session.redos

    world = ThreadWorld(num_clients + 1)
    results = world.run(body)
    agreed = results[1][3]
    assert results[1][4] == 0  # no redo: the reference below is the one attempt, from byte 0
    exponent = fixed_point.scale_exponent(ring, num_clients, agreed)
    total_rows = int(results[1][2].segment_rows.sum())
    ring_sum = np.zeros((total_rows, 5), dtype=ring)
    for rank in range(1, num_clients + 1):
        _, terms, plan, _, _ = results[rank]
        me = rank - 1
        encoded = reference_encode(terms, exponent, ring)
        ring_sum[plan.touched] += encoded
        sent = np.concatenate([v.ravel() for kind, r, v in world.server_received
                               if kind == "gatherv" and r == rank and v.dtype == ring])
        expected = encoded.copy()
        owner_first = plan.routing.extra[MASKS].owner_first
        for j in range(num_clients):
            low, high = int(owner_first[j]), int(owner_first[j + 1])
            if j != me and high > low:
                expected[low:high] += reference_keystream(
                    fixed_key(f"{me}->{j}"), 0, (high - low) * 5, ring).reshape(-1, 5)
        # chunk 0 starts with a head row: the exponent word, then zeros
        heads = [v for kind, r, v in world.server_received
                 if kind == "gatherv" and r == rank and v.dtype == ring]
        np.testing.assert_array_equal(sent[1:5], np.zeros(4, ring))
        sent = np.concatenate([heads[0][5:], *[v for v in heads[1:]]])
        np.testing.assert_array_equal(sent, expected.ravel())
    starts = results[1][2].segment_start
    touched_any = np.zeros(total_rows, dtype=bool)
    for rank in range(1, num_clients + 1):
        touched_any[results[rank][2].touched] = True
    for rank in range(1, num_clients + 1):
        output, _, plan, _, _ = results[rank]
        me = rank - 1
        union = np.flatnonzero(touched_any[starts[me]:starts[me + 1]]) + starts[me]
        expected = np.zeros_like(output)
        expected[plan.receive_rows] = reference_decode(ring_sum[union], exponent, dtype)
        assert output.dtype == expected.dtype
        np.testing.assert_array_equal(output.view(ring), expected.view(ring))
