"""mpifgl.secure (--secure), without mpirun: ranks are threads (tests/helpers/thread_comm.py).
The pure pieces are in test_keys.py and test_fixed_point.py, the masked exchange itself in
exchange/test_masked.py.

* exactness: masked sums within the derived bound m * 2^-(e+1) (e from the range each use ran
  with); lagged exponents: a jump redoes the sum, every rank ends with one exponent state;
  secure logits,
  loss and gradients equal the program's centralized mode (1e-10 in float64, 1e-5 in float32, as
  test_exactness.py) for 1-4 clients, full graph and sampled;
* what the server sees: ring words only, uniform bytes (chi-square), different between two runs
  with fresh keys on identical data while the results are the same;
* every key stream read once, front to back, by both its holders alike, in a whole run
  (training, evaluation, --save-logits), and no key in any file the run writes;
* fixed-point overflow and non-finite values stop with a clear error; bad flag combinations are
  refused naming both flags.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.exactness import (TOLERANCE, assert_close, centralized_reference, fixed_sample,
                                     gather_in_global_order, operator_logits)
from tests.helpers.graphs import random_parts, write_shards
from tests.helpers.ring_reference import reference_decode, reference_encode
from tests.helpers.thread_comm import ThreadComm, ThreadWorld
from tests.helpers.exactness import flat_grads
from tests.helpers.keys import fixed_key, fixed_session, keys_of, reference_keystream
from mpifgl import fixed_point, secure
from mpifgl.keys import RunKeys
from mpifgl.config import TrainConfig
from mpifgl.exchange.masked import MaskedExchange
from mpifgl.graph import ClientGraph
from fgl_common.shard_format import read_manifest
from mpifgl.communicator import Communicator
from mpifgl.methods import build_trainer


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # ranks are threads


def shards_for(toy_graph, tmp_path: Path, num_clients: int, seed: int = 5) -> Path:
    return write_shards(toy_graph, random_parts(toy_graph.num_nodes, num_clients, seed=seed),
                        tmp_path / f"shards-{num_clients}-{seed}")


def model_config(shard_dir, dtype: str, secure_flag: bool, buffer_mb: float = 256.0,
                 backbone: str = "gcn") -> TrainConfig:
    return TrainConfig(shards=str(shard_dir), backbone=backbone, dtype=dtype, dropout=0.0,
                       sampling="none", layers=3, hidden=16, seed=3, secure=secure_flag,
                       exchange_buffer_mb=buffer_mb)


def one_step(comm, shard_dir, config: TrainConfig, sampled: bool):
    """One forward/backward (full graph or the fixed sample) -> (loss, grads, logits by global
    id) on the server, plus the rank's SecureSession."""
    manifest = read_manifest(shard_dir)
    graph = ClientGraph.for_rank(shard_dir, manifest, comm.client_id)
    trainer = build_trainer(config, comm, graph, manifest.num_classes).method
    if sampled:
        own = fixed_sample(manifest.client_sizes())[comm.client_id] if comm.client_id >= 0 else None
        operator, train_rows = trainer.operator_for_sample(own)
    else:
        operator, train_rows = trainer.full_operator, trainer.setup.global_split_counts["train"]
    loss = trainer.loss_and_gradients(operator, train_rows)
    logits, _ = gather_in_global_order(
        comm, operator_logits(comm, trainer, operator, manifest.num_classes),
        graph.global_id[operator.rows.numpy()])
    return (loss, flat_grads(trainer.model), logits) if comm.is_server else None


def centralized(shard_dir, config: TrainConfig, sampled: bool):
    """The program's centralized mode on the same model and step -> (loss, grads, logits)."""
    return centralized_reference(shard_dir, config.backbone, config.dtype, config.layers,
                                 sampled)[:3]


# -- exactness ----------------------------------------------------------------------------------
@pytest.mark.parametrize("num_clients", [1, 2, 3, 4])
@pytest.mark.parametrize("sampled", [False, True])
def test_secure_model_equals_centralized(toy_graph, tmp_path, num_clients, sampled):
    shard_dir = shards_for(toy_graph, tmp_path, num_clients)
    for dtype in ("float64", "float32"):
        config = model_config(shard_dir, dtype, True)
        found = ThreadWorld(num_clients + 1).run(
            lambda comm: one_step(comm, shard_dir, config, sampled))[0]
        expected = centralized(shard_dir, config, sampled)
        for name, a, b in zip(("loss", "grads", "logits"), found, expected):
            assert_close(a, b, TOLERANCE[dtype], f"{dtype} {name} ({num_clients} clients)")


@pytest.mark.parametrize("backbone", ["gcn", "1gnn"])
def test_secure_with_one_row_chunks_equals_plain(toy_graph, tmp_path, backbone):
    """Chunking cuts every masked exchange into one-row pieces: keystream positions follow the
    rows, so the result is the plain exchange's within the fixed-point bound."""
    shard_dir = shards_for(toy_graph, tmp_path, 3)
    for dtype in ("float64", "float32"):
        results = [ThreadWorld(4).run(lambda comm: one_step(
            comm, shard_dir, model_config(shard_dir, dtype, flag, 1e-6, backbone), True))[0]
            for flag in (False, True)]
        for name, a, b in zip(("loss", "grads", "logits"), *results):
            assert_close(b, a, TOLERANCE[dtype], f"{backbone} {dtype} {name}")


# -- lagged exponents of the masked sums: redo on a jump, one state on every rank ---------------
def plain_sum(comm, values: np.ndarray) -> np.ndarray:
    return comm.sum_to_all(torch.from_numpy(np.ascontiguousarray(values))).numpy()


def lagged_sum_run(scales: list[float], num_clients: int = 3):
    """A 10-word masked sum whose terms are rank * scale * (1, -0.5, ...) on every client, once per
    scale -> (per use: the range it was given (None first), the largest it needed, the masked
    sum, the plain one), redos; asserts every rank ends each use in the same state."""
    def body(comm):
        session = secure.SecureSession.agree(comm)
        pattern = np.resize([1.0, -0.5, 0.25], 10)
        uses = []
        for scale in scales:
            values = scale * pattern * (comm.rank) if comm.is_client else np.zeros(10)
            lagged = session.ranges.lagged(("sum", (10,)))
            total = session.sum_to_all(comm, values)
            uses.append((None if lagged is None else lagged.tolist(),
                         session.ranges.agreed[("sum", (10,))], total, plain_sum(comm, values)))
        return uses, session.redos

    results = ThreadWorld(num_clients + 1).run(body)
    for uses, redos in results:
        assert redos == results[0][1]
        assert [u[:2] for u in uses] == [u[:2] for u in results[0][0]]
    uses, redos = results[0]
    for lagged, largest, masked, plain in uses:  # within the bound of the range each use ran with
        used = largest[0] if lagged is None else max(lagged[0], largest[0])
        exponent = fixed_point.scale_exponent(np.dtype(np.uint64), num_clients, used)
        assert np.max(np.abs(masked - plain)) <= num_clients * 2.0 ** -(exponent + 1)
    return [(lagged, largest[0]) for lagged, largest, _, _ in uses], redos


def test_a_slot_that_keeps_jumping_gets_the_headroom_of_its_jumps(monkeypatch):
    """A sum alternating between terms 2^4 apart is redone on its first jump only: the next
    uses' range covers the growth seen. After HEADROOM_WINDOW steady uses the headroom is back
    to HEADROOM_BITS (and the next jump is redone); a jump beyond MAX_HEADROOM_BITS gets only
    that many bits and keeps being redone."""
    monkeypatch.setattr(fixed_point, "HEADROOM_WINDOW", 4)
    # largest |term|: 3 * scale (rank 3) -> exponent 2 + log2(scale)
    states, redos = lagged_sum_run([1.0, 16.0, 1.0, 16.0, 1.0, 16.0] + [1.0] * 5 + [16.0])
    assert [largest for _, largest in states] == [2, 6] * 3 + [2] * 5 + [6]
    assert [lagged for lagged, _ in states] == [
        None, [4], [10], [6], [10], [6], [10], [6], [6], [6], [4], [4]]
    assert redos == 2  # the first jump, and the one after the window forgot the jumps

    states, redos = lagged_sum_run([1.0, 2.0 ** 8, 1.0, 2.0 ** 8])
    assert [lagged for lagged, _ in states] == [
        None, [2 + fixed_point.HEADROOM_BITS], [10 + fixed_point.MAX_HEADROOM_BITS],
        [2 + fixed_point.MAX_HEADROOM_BITS]]
    assert redos == 2  # each 8-bit jump: the headroom stops at MAX_HEADROOM_BITS


def test_masked_sums_learn_their_range_from_the_histogram(toy_graph, tmp_path):
    """The gradient sum's segments: steady -> one collective per call; a jump inside the
    histogram's window -> a redo, no extra collective; beyond it -> one agreement; the sums are
    exact within each segment's bound throughout, and a NaN stops the job."""
    num_clients = 3
    rounds = [(1.0, 1e-3), (1.2, 1e-3), (2.0 ** 8, 1e-3), (2.0 ** 8, 2.0 ** 40), (1.0, 1e-3)]

    def body(comm):
        session = secure.SecureSession.agree(comm)
        rng = np.random.default_rng(comm.rank)
        sums, collectives, states = [], [], []
        for big, small in rounds:
            values = (np.concatenate([rng.normal(scale=big, size=50),
                                      rng.normal(scale=small, size=7)])
                      if comm.is_client else np.zeros(57))
            before = comm.world.max_to_all_calls
            lagged = session.ranges.lagged(("sum", (50, 7)))
            sums.append((session.sum_to_all(comm, values, [50, 7]), plain_sum(comm, values)))
            collectives.append(comm.world.max_to_all_calls - before)
            states.append((None if lagged is None else lagged.tolist(),
                           session.ranges.agreed[("sum", (50, 7))]))
        return sums, collectives, session.redos, states

    results = ThreadWorld(num_clients + 1).run(body)
    sums, collectives, redos, states = results[0]
    assert all(r[3] == states for r in results) and all(r[2] == redos for r in results)
    assert redos == 2  # the jump to 2^8, then the one to 2^40
    assert collectives == [1, 0, 0, 1, 0]
    for use, (masked, plain) in enumerate(sums):
        for k, piece in enumerate((slice(0, 50), slice(50, 57))):
            # the range this use ran with: the lagged one, or the reported one after a redo
            lagged, largest = states[use]
            used = largest[k] if lagged is None else max(lagged[k], largest[k])
            bound = num_clients * 2.0 ** -(fixed_point.scale_exponent(
                np.dtype(np.uint64), num_clients, used) + 1)
            largest = float(np.max(np.abs(plain[piece])))
            assert np.max(np.abs(masked[piece] - plain[piece])) <= bound + 1e-12 * largest

    def diverged(comm):
        session = secure.SecureSession.agree(comm)
        session.sum_to_all(comm, np.ones(4) if comm.is_client else np.zeros(4), [4])
        bad = np.full(4, np.nan) if comm.client_id == 0 else np.ones(4) * comm.is_client
        return session.sum_to_all(comm, bad, [4])

    with pytest.raises(fixed_point.FixedPointOverflow, match="expected a finite number"):
        ThreadWorld(3).run(diverged)


def test_secure_bns_steps_equal_the_unmasked_ones(toy_graph, tmp_path):
    """--algo bns runs the same masked exchange: three sampled steps give the plain losses."""
    shard_dir = shards_for(toy_graph, tmp_path, 3)
    manifest = read_manifest(shard_dir)

    def body(comm, flag: bool):
        graph = ClientGraph.for_rank(shard_dir, manifest, comm.client_id)
        config = TrainConfig(shards=str(shard_dir), algo="bns", dtype="float64", hidden=8,
                             boundary_p=0.5, secure=flag)
        method = build_trainer(config, comm, graph, manifest.num_classes).method
        return [method.train_step() for _ in range(3)]

    plain, masked = (ThreadWorld(4).run(lambda comm: body(comm, flag))[0] for flag in (False, True))
    np.testing.assert_allclose(masked, plain, rtol=1e-10)


# -- what the server sees -----------------------------------------------------------------------
def chi_square_uniform_bytes(octets: np.ndarray) -> float:
    counts = np.bincount(octets, minlength=256)
    expected = counts.sum() / 256
    return float(((counts - expected) ** 2 / expected).sum())


def split_clear_words(kind: str, words: np.ndarray, tail_words: int, chunk_and_width
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(masked words, words sent in clear) of one buffer a client sent the server: an exchange's
    chunk 0 starts with a head row whose first word is the sender's exponent (the rest zeros); a
    float sum (the gradients and loss) ends in its exponent histogram; count sums are masked
    whole (docs/privacy.md)."""
    if kind == "gatherv":
        chunk, width = chunk_and_width
        head = width if chunk == 0 else 0
        return words[head:], words[:head]
    if words.shape[0] > tail_words:
        return words[:-tail_words], words[-tail_words:]
    return words, words[:0]


def server_view(toy_graph, tmp_path, dtype: str, monkeypatch):
    """(result, masked words, clear words, every buffer) the server received in one step."""
    shard_dir = shards_for(toy_graph, tmp_path, 3)
    world = ThreadWorld(4)
    config = model_config(shard_dir, dtype, True)
    # per client, each masked Gatherv's chunk and width, in call order
    sent: dict[int, list[tuple[int, int]]] = {rank: [] for rank in range(1, 4)}
    original = MaskedExchange._sum_chunk

    def recording(self, routing, c, rows, *args):
        if self.comm.is_client:
            sent[self.comm.rank].append((c, rows.shape[1]))
        return original(self, routing, c, rows, *args)

    monkeypatch.setattr(MaskedExchange, "_sum_chunk", recording)
    result = world.run(lambda comm: one_step(comm, shard_dir, config, True))[0]
    from mpifgl.model import GNN
    tensors = len(list(GNN(config.backbone, toy_graph.x.shape[1], config.hidden,
                           toy_graph.num_classes, config.layers, 0.0, 0).parameters()))
    tail_words = secure.HISTOGRAM_WORDS * (tensors + 1)
    masked, clear = [], []
    for kind, rank, v in world.server_received:
        if v.dtype.kind == "u":
            shape = sent[rank].pop(0) if kind == "gatherv" else None
            hidden, shown = split_clear_words(kind, v, tail_words, shape)
            masked.append((kind, rank, hidden))
            clear.append((kind, rank, shown))
    assert not any(sent.values()), "every masked Gatherv is accounted for"
    return result, masked, clear, world.server_received


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_server_receives_uniform_words_that_change_with_the_keys(toy_graph, tmp_path, dtype,
                                                                 monkeypatch):
    first, seen_first, clear_first, everything = server_view(toy_graph, tmp_path, dtype,
                                                             monkeypatch)
    second, seen_second, clear_second, _ = server_view(toy_graph, tmp_path, dtype, monkeypatch)
    # every float-valued buffer a client sent the server is ring words (ids are int32/int64)
    assert all(v.dtype.kind in "ui" for _, _, v in everything)
    assert {kind for kind, _, _ in seen_first} == {"gatherv", "sum"}
    ring = fixed_point.ring_of(np.dtype(dtype))
    # the exchange's terms travel as words of the run's ring (integer counts in Z_2^64)
    assert {v.dtype for kind, _, v in seen_first if kind == "gatherv"} == {ring}
    words = np.concatenate([np.ascontiguousarray(v).view(np.uint8).ravel()
                            for _, _, v in seen_first])
    assert words.size > 8000
    # chi-square of the byte histogram, 255 degrees of freedom: p = 1e-4 at 347
    assert chi_square_uniform_bytes(words) < 347
    # same data, same seed, fresh keys: the words differ (as often as random bytes would),
    # the results do not
    again = np.concatenate([np.ascontiguousarray(v).view(np.uint8).ravel()
                            for _, _, v in seen_second])
    assert again.shape == words.shape
    assert np.mean(again == words) < 2 / 256
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    # in clear: each sender's exponent per exchange (a head row of zeros after it), the
    # clients' exponent histogram per gradient segment; the same in both runs (they depend on
    # the data, not the keys)
    for (kind, _, a), (_, _, b) in zip(clear_first, clear_second):
        np.testing.assert_array_equal(a, b)
        signed = fixed_point.word_exponent(a)
        if kind == "gatherv" and a.size:
            assert signed[0] == fixed_point.EMPTY_EXPONENT or abs(signed[0]) < 1100
            assert not signed[1:].any()
        else:
            assert set(signed.tolist()) <= {0, 1}


def test_plain_run_sends_floats_the_secure_run_hides(toy_graph, tmp_path):
    """Control for the test above: without --secure the server receives the float terms."""
    shard_dir = shards_for(toy_graph, tmp_path, 3)
    world = ThreadWorld(4)
    world.run(lambda comm: one_step(comm, shard_dir, model_config(shard_dir, "float64", False),
                                    False))
    kinds = {v.dtype.kind for _, _, v in world.server_received}
    assert "f" in kinds


# -- nonces and keys across a whole run ---------------------------------------------------------
def test_whole_run_reads_every_key_stream_once_and_writes_no_key(toy_graph, tmp_path):
    """A real run (train.train on every rank: set-up, 3 epochs of sampled steps, evaluation,
    checkpoints, --save-logits): every key stream read once, front to back, by each of its two
    holders alike, and no key's bytes (raw or hex) in any file it writes."""
    import logging
    from mpifgl import train as train_module
    shard_dir = shards_for(toy_graph, tmp_path, 3)
    out = tmp_path / "run"
    sessions: dict[int, secure.SecureSession] = {}
    original_agree = secure.SecureSession.agree.__func__

    def recording_agree(cls, comm):
        session = original_agree(cls, comm)
        session.stream_log = []
        sessions[comm.rank] = session
        return session

    config = TrainConfig(shards=str(shard_dir), out=str(out), epochs=3, hidden=8,
                         sample_size=30, secure=True, save_logits=True, checkpoint_every=1,
                         verbose=True)
    log_lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            log_lines.append(self.format(record))

    logger = logging.getLogger("mpifgl")
    handler = Collect()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    secure.SecureSession.agree = classmethod(recording_agree)
    try:
        def body(comm):
            progress = train_module.RankProgress(config)
            return train_module.train(config, comm, progress, set())
        assert ThreadWorld(4).run(body) == [0, 0, 0, 0]
    finally:
        secure.SecureSession.agree = classmethod(original_agree)
        logger.removeHandler(handler)
    # every key's stream is read front to back, each byte once per holder; its two holders
    # (sender and owner, or the pair's adding and subtracting client) read the same byte
    # ranges in the same order, so the bytes that mask are the bytes that unmask
    reads: dict[tuple, list[tuple[int, int]]] = {}
    for session in sessions.values():
        for use in session.stream_log:
            reads.setdefault((use.key_label, use.role), []).append((use.start, use.end))
    for (label, role), ranges in reads.items():
        assert ranges[0][0] == 0 and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])), \
            f"{label} {role}: not read front to back once"
        partner = {"mask": "unmask", "unmask": "mask", "add": "subtract", "subtract": "add"}[role]
        assert reads[(label, partner)] == ranges, f"{label}: {role} and {partner} disagree"
    exchange_streams = {label for label, role in reads if label[0] == "exchange"}
    assert len(exchange_streams) == 6 and len(reads) == 2 * (6 + 3)  # 3 clients
    assert max(end for ranges in reads.values() for _, end in ranges) > 4000
    # no key material in any file of the run, nor in the log
    keys = [k for s in sessions.values() for k in keys_of(s)]
    assert len(keys) == 3 * 2 * 3  # 3 clients x 2 others x (to, from, pair)
    files = [p for p in out.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"config.json", "metrics.jsonl", "final.json", "model.pt",
                                        "logits.npy"}
    text = "\n".join(log_lines)
    for path in files:
        blob = path.read_bytes()
        for key in keys:
            assert key not in blob and key.hex().encode() not in blob, path
    for key in keys:
        assert key.hex() not in text
    import json
    assert json.loads((out / "config.json").read_text())["secure"] is True


def test_diverged_values_stop_the_job_with_a_clear_error(toy_graph, tmp_path):
    """A NaN in an exchange is refused before masking, on the rank that has it."""
    shard_dir = shards_for(toy_graph, tmp_path, 2)
    manifest = read_manifest(shard_dir)

    def body(comm):
        graph = ClientGraph.for_rank(shard_dir, manifest, comm.client_id)
        method = build_trainer(model_config(shard_dir, "float32", True), comm, graph,
                               manifest.num_classes).method
        if comm.client_id == 0:
            with torch.no_grad():
                next(method.model.parameters()).fill_(float("nan"))
        return method.loss_and_gradients(method.full_operator,
                                          method.setup.global_split_counts["train"])

    with pytest.raises(fixed_point.FixedPointOverflow, match="expected a finite number"):
        ThreadWorld(3).run(body)


@pytest.mark.parametrize("flags,message", [
    (dict(exchange="reduce"), "--secure with --exchange 'reduce': expected --exchange compact"),
    (dict(exchange="star"), "--secure with --exchange 'star'"),
    (dict(exchange="compact-reduce"), "--secure with --exchange 'compact-reduce'"),
    (dict(algo="centralized"), "--secure with --algo 'centralized'"),
    (dict(algo="fedavg"), "--secure with --algo 'fedavg'"),
])
def test_secure_refuses_modes_it_does_not_mask(flags, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        TrainConfig(secure=True, **flags).validate()
    TrainConfig(**flags).validate()
    TrainConfig(secure=True, algo="bns").validate()


def test_thread_comm_is_a_communicator():
    """The stand-in implements the one Protocol, so the code under test takes it as it is."""
    world = ThreadWorld(2)
    assert isinstance(ThreadComm(world, 1), Communicator)


# -- bit for bit: the masked paths against a straightforward reference ---------------------------
# The reference keeps the first implementation's arithmetic (a separate range scan, scale, round,
# convert; one fresh keystream per call, added with +=): for fixed keys, the words every client
# sends and every decoded output must be the same bits whatever the optimised code does.
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_masked_sum_is_bit_identical_to_the_reference(dtype):
    """Fixed keys, a two-segment float sum and an int64 count sum: each client's words are
    reference_encode + its zero-sum keystreams (+ the histogram tail), the total decodes to
    reference_decode of the ring sum of the encoded values, bit for bit."""
    num_clients = 3
    ring = fixed_point.ring_of(np.dtype(dtype))
    segments = [50, 7]

    def values_of(rank: int) -> np.ndarray:
        rng = np.random.default_rng(10 + rank)
        return np.concatenate([rng.normal(scale=3.0, size=50),
                               rng.normal(scale=1e-3, size=7)]).astype(dtype)

    def counts_of(rank: int) -> np.ndarray:
        return np.arange(6, dtype=np.int64) * rank

    def body(comm):
        session = fixed_session(comm)
        values = values_of(comm.rank) if comm.is_client else np.zeros(57, dtype)
        counts = counts_of(comm.rank) if comm.is_client else np.zeros(6, np.int64)
        return session.sum_to_all(comm, values, segments), session.sum_to_all(comm, counts)

    world = ThreadWorld(num_clients + 1)
    results = world.run(body)
    sums = [v for kind, _, v in world.server_received if kind == "sum"]
    float_words, count_words = sums[:num_clients], sums[num_clients:]
    pieces = (slice(0, 50), slice(50, 57))
    used = [max(fixed_point.largest_exponent(values_of(r)[p])
                for r in range(1, num_clients + 1)) for p in pieces]
    scales = [fixed_point.scale_exponent(ring, num_clients, u) for u in used]
    encoded_total = np.zeros(57, dtype=ring)
    for rank in range(1, num_clients + 1):
        me = rank - 1
        encoded = np.concatenate([reference_encode(values_of(rank)[p], e, ring)
                                  for p, e in zip(pieces, scales)])
        encoded_total += encoded
        masked, counted = encoded.copy(), counts_of(rank).view(np.uint64).copy()
        for j in range(num_clients):
            if j == me:
                continue
            key = fixed_key(f"{min(me, j)}-{max(me, j)}")
            stream = reference_keystream(key, 0, 57, ring)
            count_stream = reference_keystream(key, 57 * ring.itemsize, 6, np.dtype(np.uint64))
            if me < j:
                masked += stream
                counted += count_stream
            else:
                masked -= stream
                counted -= count_stream
        np.testing.assert_array_equal(float_words[me][:57], masked)
        np.testing.assert_array_equal(count_words[me], counted)
    expected = np.concatenate([reference_decode(encoded_total[p], e, dtype)
                               for p, e in zip(pieces, scales)])
    expected_counts = sum(counts_of(r) for r in range(1, num_clients + 1))
    for float_sum, count_sum in results:
        assert float_sum.dtype == expected.dtype
        np.testing.assert_array_equal(float_sum.view(ring), expected.view(ring))
        np.testing.assert_array_equal(count_sum, expected_counts)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("tiny", [False, True])
def test_masking_and_unmasking_rows_equal_the_reference_at_any_scale(dtype, tiny):
    """mask_rows and unmask_rows against reference_encode / reference_decode and the AES-CTR
    definition, word for word: at an ordinary scale (the compiled loops) and at one where 2^e
    is not a normal number of the float type (the ldexp path)."""
    ring = fixed_point.ring_of(dtype)
    exponent = np.finfo(dtype).maxexp + 3 if tiny else 20  # 2^e beyond the type's normal range
    sender = secure.SecureSession(1, 2, RunKeys(1, {0: fixed_key("1->0")}, {0: fixed_key("0->1")},
                                                {0: fixed_key("pair")}))
    owner = secure.SecureSession(0, 2, RunKeys(0, {1: fixed_key("0->1")}, {1: fixed_key("1->0")},
                                               {1: fixed_key("pair")}))
    rng = np.random.default_rng(3)
    width = 3
    terms = (rng.uniform(-1, 1, (4, width)) * 2.0 ** (20 - exponent)).astype(dtype)
    # the sender's 4 touched rows all lie in owner 0's segment; they land on the owner's
    # receive rows 0, 1, 3, 4 (row 2 is another sender's, absent here)
    sent = sender.mask_rows(secure.ExchangeMasks(np.asarray([0, 4, 4])), 0, terms, exponent, ring)
    stream = reference_keystream(fixed_key("1->0"), 0, terms.size, ring).reshape(terms.shape)
    np.testing.assert_array_equal(sent, reference_encode(terms, exponent, ring) + stream)
    chunk = secure.UnmaskChunk([(1, 0, 4)], np.asarray([0, 1, 2, 2, 3, 4]), np.arange(4))
    received = np.zeros((5, width), dtype=ring)
    received[[0, 1, 3, 4]] = sent
    result = np.full((7, width), 9.0, dtype=dtype)
    targets = np.asarray([6, 0, 2, 5, 1])
    owner.unmask_rows(secure.ExchangeMasks(np.zeros(3, np.int64), chunks=[chunk]), 0, received,
                      exponent, result, targets)
    expected = np.full((7, width), 9.0, dtype=dtype)
    expected[targets[[0, 1, 3, 4]]] = reference_decode(reference_encode(terms, exponent, ring),
                                                      exponent, dtype)
    expected[targets[2]] = 0.0
    np.testing.assert_array_equal(result, expected)
