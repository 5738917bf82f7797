"""mpifgl.methods.neighgen: the greedy loss against a direct loop of the reference's definition
(zkhku/fedsage, src/models/feat_loss.py), the impaired graph and its targets on a hand-made
graph, the mended graph's structure."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from mpifgl.methods.neighgen import (CHUNK_BYTES, FeatureGenerator, greedy_loss, hide_candidates,
                                     impair, mended_adjacency, row_normalised, slot_counts,
                                     slot_rows)


def reference_greedy_loss(pred_feats, true_feats, pred_missing, true_missing, num_pred,
                          literal):
    """The reference's loop: a [B, K, F] tensor of broadcast per-slot MSEs, its mean. ``literal``
    keeps its comparison of an MSE with the SUM over F of the slot's current value; without it
    the comparison is of the two MSEs (the least MSE, as the paper defines the loss)."""
    loss = torch.zeros(pred_feats.shape, dtype=pred_feats.dtype)
    pred = np.clip(pred_missing.detach().numpy().reshape(-1).astype(np.int32), 0, num_pred)
    true = np.clip(true_missing.detach().numpy().reshape(-1).astype(np.int32), 0, num_pred)
    for i in range(len(pred_feats)):
        for j in range(min(num_pred, pred[i])):
            if true[i] > 0:
                loss[i][j] += F.mse_loss(pred_feats[i][j], true_feats[i][true[i] - 1])
                for k in range(min(num_pred, true[i])):
                    candidate = F.mse_loss(pred_feats[i][j], true_feats[i][k])
                    current = loss[i][j].data.sum() if literal else loss[i][j].data[0]
                    if candidate < current:
                        loss[i][j] = candidate
    return loss.mean()


def random_case(batch: int, num_pred: int, width: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    pred_feats = torch.randn(batch, num_pred, width, generator=generator, dtype=torch.float64)
    true_feats = torch.randn(batch, num_pred, width, generator=generator, dtype=torch.float64)
    predicted = torch.rand(batch, generator=generator, dtype=torch.float64) * 7.0  # n^, up to 7
    true_missing = torch.randint(0, 8, (batch,), generator=generator)
    for b in range(batch):  # zero padding after the true neighbours, as the targets have
        true_feats[b, min(num_pred, int(true_missing[b])):] = 0.0
    return pred_feats, true_feats, predicted, true_missing


def ours(pred_feats, true_feats, predicted, true_missing, num_pred):
    return greedy_loss(pred_feats, true_feats, slot_counts(predicted, num_pred), true_missing)


@pytest.mark.parametrize("width,seed", [(1, 0), (8, 1), (33, 2)])
def test_greedy_loss_is_the_least_mse_of_the_references_loop(width, seed):
    num_pred = 5
    pred_feats, true_feats, predicted, true_missing = random_case(40, num_pred, width, seed)
    mine = pred_feats.clone().requires_grad_(True)
    theirs = pred_feats.clone().requires_grad_(True)
    value = ours(mine, true_feats, predicted, true_missing, num_pred)
    expected = reference_greedy_loss(theirs, true_feats, predicted, true_missing, num_pred,
                                     literal=False)
    assert value.item() == pytest.approx(expected.item(), abs=1e-12, rel=1e-12)
    value.backward()
    expected.backward()
    assert torch.allclose(mine.grad, theirs.grad, atol=1e-12, rtol=0)
    assert float(value) > 0 and (mine.grad != 0).any()
    literal = reference_greedy_loss(pred_feats, true_feats, predicted, true_missing, num_pred,
                                    literal=True)
    if width == 1:  # one feature: the reference's sum over F is the value itself
        assert float(literal) == pytest.approx(float(value), abs=1e-12)
    else:  # the departure: its comparison keeps (nearly always) the last neighbour's MSE
        assert float(literal) > float(value)


def test_greedy_loss_counts_floor_of_the_prediction_and_ignores_nodes_without_targets():
    generated = torch.ones(3, 2, 2, dtype=torch.float64)
    true = torch.zeros(3, 2, 2, dtype=torch.float64)
    true[0, 1] = 1.0  # node 0: neighbours (0, 0) and (1, 1); slot rows are all ones
    slots = slot_counts(torch.tensor([1.99, 2.5, 0.7], dtype=torch.float64), 2)
    assert slots.tolist() == [1, 2, 0]
    rounded = slot_counts(torch.tensor([1.5, 2.5, 0.7, 0.4, 9.0], dtype=torch.float64), 5, "round")
    assert rounded.tolist() == [2, 2, 1, 0, 5]  # half to even, as numpy's round
    # node 0, one slot: least MSE 0 (the second neighbour); node 1 has no hidden neighbour;
    # node 2 no slot: the loss is 0 over 3 x 2 slots
    assert float(greedy_loss(generated, true, slots, torch.tensor([2, 0, 1]))) == 0.0
    # node 0 keeps only its first neighbour: MSE 1 in its one counted slot
    assert float(greedy_loss(generated, true, slots, torch.tensor([1, 0, 1]))) == \
        pytest.approx(1.0 / 6)


def hand_graph():
    """0-1, 0-2, 0-3, 1-2, 3-4, 4-5; node 0 trains, 1 and 4 are validation nodes, 2 is a test
    node, 3 and 5 are in no split."""
    edges = [(0, 1), (0, 2), (0, 3), (1, 2), (3, 4), (4, 5)]
    rows, cols = zip(*edges)
    adjacency = sp.coo_matrix((np.ones(6), (rows, cols)), shape=(6, 6))
    adjacency = (adjacency + adjacency.T).tocsr()
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    train = np.array([1, 0, 0, 0, 0, 0], bool)
    val = np.array([0, 1, 0, 0, 1, 0], bool)
    test = np.array([0, 0, 1, 0, 0, 0], bool)
    return adjacency, x, train, val, test


def test_impaired_graph_and_targets_on_a_hand_made_graph():
    adjacency, x, train, val, test = hand_graph()
    assert hide_candidates(train, val, test, "not-train-test").tolist() == \
        [False, True, False, True, True, True]
    assert hide_candidates(train, val, test, "val").tolist() == \
        [False, True, False, False, True, False]
    # hide every validation node (portion 1): 1 and 4 go, with their edges
    impaired = impair(adjacency, x, train, hide_candidates(train, val, test, "val"), 1.0, 2,
                      np.random.default_rng(0))
    assert impaired.kept.tolist() == [0, 2, 3, 5] and impaired.num_hidden == 2
    assert impaired.adjacency.toarray().tolist() == [[0, 1, 1, 0], [1, 0, 0, 0], [1, 0, 0, 0],
                                                     [0, 0, 0, 0]]
    assert impaired.missing_count.tolist() == [1, 1, 1, 1]  # each kept node lost one neighbour
    assert impaired.train.tolist() == [0]
    # targets for the training nodes with a hidden neighbour only: node 0 misses node 1
    assert impaired.targets.tolist() == [0] and impaired.missing_x.shape == (1, 2, 2)
    assert np.array_equal(impaired.missing_x[0], [x[1], [0, 0]])
    # every node a training node: each kept node's first hidden neighbour, zero-padded
    everyone = impair(adjacency, x, np.ones(6, bool), hide_candidates(train, val, test, "val"),
                      1.0, 2, np.random.default_rng(0))
    assert everyone.targets.tolist() == [0, 1, 2, 3]
    assert np.array_equal(everyone.missing_x[1], [x[1], [0, 0]])  # node 2 misses node 1
    assert np.array_equal(everyone.missing_x[2], [x[4], [0, 0]])  # node 3 misses node 4
    assert np.array_equal(everyone.missing_x[3], [x[4], [0, 0]])
    # the reference's rule, K = 1: hiding 1, 3, 4, 5 leaves 0 with three hidden neighbours of
    # which the first (node 1) is its target
    impaired = impair(adjacency, x, train, hide_candidates(train, val, test, "not-train-test"),
                      1.0, 1, np.random.default_rng(0))
    assert impaired.kept.tolist() == [0, 2]
    assert impaired.missing_count.tolist() == [2, 1] and impaired.targets.tolist() == [0]
    assert np.array_equal(impaired.missing_x[:, 0], [x[1]])
    # half of the four candidates (int(4 * 0.5) = 2), drawn among them only
    impaired = impair(adjacency, x, train, hide_candidates(train, val, test, "not-train-test"),
                      0.5, 5, np.random.default_rng(3))
    assert impaired.num_hidden == 2 and {0, 2} <= set(impaired.kept.tolist())
    assert impaired.kept.shape[0] == 4


def test_mended_graph_joins_each_node_to_its_counted_slots():
    adjacency, *_ = hand_graph()
    small = adjacency[:3][:, :3].tocsr()  # the triangle 0-1-2
    mended = mended_adjacency(small, np.array([2, 0, 1]), 2).toarray()
    assert mended.shape == (9, 9)  # 3 nodes + 3 x 2 slots
    assert np.array_equal(mended[:3, :3], small.toarray())
    # node 0's slots are rows 3 and 4, node 2's first slot row 7; the others stay isolated
    assert set(np.flatnonzero(mended[0, 3:]) + 3) == {3, 4}
    assert mended[1, 3:].sum() == 0 and set(np.flatnonzero(mended[2, 3:]) + 3) == {7}
    assert np.array_equal(mended, mended.T) and mended[[5, 6, 8]].sum() == 0
    normalised = row_normalised(sp.csr_matrix(mended)).toarray()
    assert np.allclose(normalised.sum(axis=1), 1.0)
    assert normalised[0, 0] == pytest.approx(1 / 5)  # itself, 1, 2 and two slots
    assert normalised[5, 5] == 1.0  # an unattached slot: its own row only
    assert slot_rows(np.array([2, 0, 1]))[0].tolist() == [0, 0, 2]
    assert slot_rows(np.array([2, 0, 1]))[1].tolist() == [0, 1, 0]
    assert slot_rows(np.zeros(0, np.int64))[0].shape == (0,)


def test_fgen_chunks_hold_at_most_chunk_bytes_of_generated_rows():
    """A chunk is --neighgen-chunk-rows rows, fewer where K F is wide (Coauthor CS: 4,096 rows of
    5 x 6,805 would be 557 MB); 0 keeps every row in one piece."""
    generator = torch.Generator().manual_seed(0)

    def fgen(num_features):
        return FeatureGenerator(8, (4,), 5, num_features, 0.5, generator, torch.float32)

    assert fgen(100).chunk_size(10_000, 4096) == 4096
    wide = fgen(6805)
    assert wide.chunk_size(10_000, 4096) == CHUNK_BYTES // (5 * 6805 * 4) == 493
    assert wide.chunk_size(10_000, 0) == 10_000 and wide.chunk_size(0, 0) == 1


def test_greedy_loss_over_the_nodes_with_hidden_neighbours_alone_is_the_same():
    """The clients keep targets for the training nodes with n_v > 0 only: the others' terms are
    0, and the mean stays over every training node (``num_nodes``)."""
    pred_feats, true_feats, predicted, true_missing = random_case(40, 5, 8, 4)
    some = torch.nonzero(true_missing > 0).squeeze(1)
    assert 0 < some.shape[0] < 40
    slots = slot_counts(predicted, 5)
    everyone = greedy_loss(pred_feats, true_feats, slots, true_missing)
    alone = greedy_loss(pred_feats[some], true_feats[some], slots[some], true_missing[some],
                        num_nodes=40)
    assert alone.item() == pytest.approx(everyone.item(), rel=1e-12, abs=0)
