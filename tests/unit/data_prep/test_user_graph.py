"""A user's own graph (--graph, write_shards): every format reads to the same canonical graph,
each edge change is counted, the default split is recorded, and every bad input is one line
naming the input, the key, the value found and the value expected, with nothing written."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from data_prep.user_graph import graph_from_arrays, load_user_graph, read_graph_file
from tests.helpers.data_prep_fixtures import (N, edge_set, expected_edges, make_fake_ogb,
                                              run_cli, tiny_graph)

NODES = 30


def tiny_arrays(seed: int = 0, **extra) -> dict[str, np.ndarray]:
    """30 nodes, 3 classes, 4 features; edges given one way, with a self loop and a repeat."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, NODES, 60)
    dst = rng.integers(0, NODES, 60)
    src[:2], dst[:2] = (5, 7), (5, 8)  # a self loop 5-5 and the edge 7-8 ...
    src[2], dst[2] = 7, 8  # ... repeated
    return {"edge_index": np.stack([src, dst]), "x": rng.normal(size=(NODES, 4)),
            "y": np.arange(NODES) % 3, **extra}


def test_npz_pt_dict_pyg_data_and_python_dict_read_to_the_same_graph(tmp_path):
    from torch_geometric.data import Data

    arrays = tiny_arrays()
    np.savez(tmp_path / "g.npz", **arrays)
    tensors = {k: torch.from_numpy(v) for k, v in arrays.items()}
    torch.save(tensors, tmp_path / "dict.pt")
    torch.save(Data(**tensors), tmp_path / "data.pt")
    registered = torch.serialization.get_safe_globals()
    graphs = [load_user_graph(tmp_path / f, None, seed=4) for f in ("g.npz", "dict.pt", "data.pt")]
    assert set(registered) <= set(torch.serialization.get_safe_globals())  # PyG's own kept
    graphs.append(graph_from_arrays(tensors, "g", "write_shards(data)", seed=4))
    src, dst = arrays["edge_index"]
    for graph in graphs:
        assert edge_set(graph.adjacency) == expected_edges(src, dst)
        np.testing.assert_array_equal(graph.x, arrays["x"].astype(np.float32))
        np.testing.assert_array_equal(graph.y, arrays["y"])
        for name in ("train_mask", "val_mask", "test_mask"):
            np.testing.assert_array_equal(getattr(graph, name), getattr(graphs[0], name))
        assert graph.split_rule == "stratified-60/20/20 seed=4"  # the documented default
        assert graph.num_classes == 3
    assert [g.name for g in graphs[:3]] == ["g", "dict", "data"]
    assert graphs[0].source["format"] == "npz" and graphs[2].source["format"] == "pt"


def test_every_edge_change_is_counted():
    # (0,1) twice, (1,0), (2,3), (3,3): 5 entries, 1 self loop, 1 duplicate; (2,3) gets its
    # reverse, (0,1) already has it
    arrays = {"edge_index": np.array([[0, 0, 1, 2, 3], [1, 1, 0, 3, 3]]),
              "x": np.zeros((4, 1)), "y": np.zeros(4, dtype=np.int64)}
    graph = graph_from_arrays(arrays, "g", "g.npz", seed=0)
    assert graph.source["edge_cleaning"] == {"entries": 5, "self_loops_removed": 1,
                                     "duplicates_removed": 1, "reverse_edges_added": 1,
                                     "undirected_edges": 2}
    assert edge_set(graph.adjacency) == {(0, 1), (1, 0), (2, 3), (3, 2)}


def test_a_given_split_is_kept_as_masks_or_as_index_arrays():
    train = np.zeros(NODES, bool)
    train[:10] = True
    masks = dict(train_mask=train, val_mask=np.roll(train, 10), test_mask=np.roll(train, 20))
    by_mask = graph_from_arrays(tiny_arrays(**masks), "g", "g.npz", seed=0)
    by_index = graph_from_arrays(tiny_arrays(train_idx=np.arange(10), val_idx=np.arange(10, 20),
                                             test_idx=np.arange(20, 30)), "g", "g.npz", seed=0)
    for graph in (by_mask, by_index):
        np.testing.assert_array_equal(graph.train_mask, train)
        np.testing.assert_array_equal(graph.test_mask, np.roll(train, 20))
    assert by_mask.split_rule == "given (train_mask/val_mask/test_mask)"
    assert by_index.split_rule == "given (train_idx/val_idx/test_idx)"


def test_an_ogb_folder_reads_as_ogb_lays_it_out(tmp_path):
    labels, perm = make_fake_ogb(tmp_path, "ogbn-arxiv", folder=tmp_path / "mine")
    graph = load_user_graph(tmp_path / "mine", None, seed=0)
    _, src, dst = tiny_graph()
    assert graph.num_nodes == N and graph.name == "mine"
    assert edge_set(graph.adjacency) == expected_edges(src, dst)
    np.testing.assert_array_equal(graph.y, labels)
    assert sorted(np.flatnonzero(graph.train_mask)) == sorted(perm[:20])
    assert sorted(np.flatnonzero(graph.val_mask)) == sorted(perm[20:30])
    assert graph.split_rule == "given (train_idx/val_idx/test_idx)"


class Unpicklable:
    """Any class of the user's: weights_only refuses to rebuild it."""


def write(tmp_path, name: str, **arrays) -> str:
    np.savez(tmp_path / name, **arrays)
    return str(tmp_path / name)


@pytest.mark.parametrize("change,message", [
    (dict(y=None), "g.npz: missing key 'y' (expected edge_index [2, E], x [n, d], y [n]"),
    (dict(x=np.zeros(NODES)), "g.npz: x has shape (30,), expected [n, d]"),
    (dict(y=np.zeros(29, np.int64)), "g.npz: y has shape (29,), expected (30,)"),
    (dict(num_nodes=31), "g.npz: num_nodes is 31 but x has 30 rows, expected the same"),
    (dict(edge_index=np.zeros((3, 4), np.int64)),
     "g.npz: edge_index has shape (3, 4), expected [2, E]"),
    (dict(edge_index=np.array([[0, 30], [1, 2]])),
     "g.npz: edge_index holds node id 30, expected ids in 0..29 (the graph has 30 nodes)"),
    (dict(edge_index=np.array([[0, -1], [1, 2]])), "g.npz: edge_index holds node id -1"),
    (dict(edge_index=np.array([[0.5, 1.0], [1.0, 2.0]])),
     "g.npz: edge_index holds 0.5 at [0, 0], expected integer node ids"),
    (dict(y=np.full(NODES, 0.5)), "g.npz: y holds 0.5 at [0], expected integer class ids"),
    (dict(y=np.arange(NODES) - 1), "g.npz: y holds -1 at node 0, expected class ids >= 0"),
    (dict(train_mask=np.ones(NODES, bool), val_mask=np.ones(NODES, bool),
          test_mask=np.zeros(NODES, bool)),
     "g.npz: train_mask and val_mask overlap at 30 nodes (first: node 0), expected disjoint"),
    (dict(train_idx=np.array([0, 1]), val_idx=np.array([1]), test_idx=np.array([2])),
     "g.npz: train_idx and val_idx overlap at 1 nodes (first: node 1)"),
    (dict(train_mask=np.zeros(NODES, bool), val_mask=np.ones(NODES, bool),
          test_mask=np.zeros(NODES, bool)),
     "g.npz: the split has no training node, expected at least one"),
    (dict(train_mask=np.ones(NODES, bool)), "g.npz: missing key 'val_mask'"),
    (dict(train_mask=np.ones(NODES, bool), train_idx=np.arange(3)),
     "g.npz: both masks (train_mask) and index arrays (train_idx) given"),
    (dict(train_idx=np.arange(3), val_idx=np.array([40]), test_idx=np.array([4])),
     "g.npz: val_idx holds node id 40, expected ids in 0..29"),
    (dict(train_mask=np.ones(29, bool), val_mask=np.ones(29, bool), test_mask=np.ones(29, bool)),
     "g.npz: train_mask has shape (29,), expected (30,)"),
    (dict(x=np.array(["a"] * NODES).reshape(NODES, 1)),
     "g.npz: x has dtype <U1, expected a numeric array"),
])
def test_bad_arrays_are_named(tmp_path, capsys, change, message):
    arrays = {k: v for k, v in {**tiny_arrays(), **change}.items() if v is not None}
    path = write(tmp_path, "g.npz", **arrays)
    with pytest.raises(ValueError) as raised:
        graph_from_arrays(read_graph_file(tmp_path / "g.npz"), "g", path, seed=0)
    assert message.replace("g.npz", path) in str(raised.value)
    # the command line: one line, exit 2, nothing written
    status, stdout, stderr = run_cli(capsys, "--graph", path, "--num-clients", 2,
                                     "--out", tmp_path / "out", "--quiet")
    assert status == 2 and stdout == ""
    assert stderr.strip().splitlines() == [f"data_prep: error: {raised.value}"]
    assert not (tmp_path / "out").exists()


def test_pickled_and_unreadable_files_are_refused_without_unpickling(tmp_path):
    np.savez(tmp_path / "objects.npz", x=np.array([{"a": 1}, None], dtype=object))
    with pytest.raises(ValueError, match=r"objects.npz: key 'x' is an array of Python objects "
                                         r"\(pickled\), expected a numeric array"):
        read_graph_file(tmp_path / "objects.npz")
    torch.save({"x": torch.zeros(2), "extra": Unpicklable()}, tmp_path / "class.pt")
    with pytest.raises(ValueError, match=r"class.pt: loading it needs unpickling of the class "
                                         r"\S*Unpicklable; expected a dict of tensors or a "
                                         r"torch_geometric Data"):
        read_graph_file(tmp_path / "class.pt")
    for name in ("junk.pt", "junk.npz"):
        (tmp_path / name).write_bytes(b"not a graph")
        with pytest.raises(ValueError, match=f"{name}: not a readable"):
            read_graph_file(tmp_path / name)
    torch.save([torch.zeros(2)], tmp_path / "list.pt")
    with pytest.raises(ValueError, match="list.pt: holds a list, expected a dict of arrays"):
        read_graph_file(tmp_path / "list.pt")
    (tmp_path / "g.csv").write_text("0,1\n")
    with pytest.raises(ValueError, match=r"g.csv: unknown format '.csv', expected .npz, .pt"):
        read_graph_file(tmp_path / "g.csv")
    with pytest.raises(FileNotFoundError, match="nothing.npz: no such file or folder"):
        read_graph_file(tmp_path / "nothing.npz")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="raw/edge.csv.gz, raw/num-node-list.csv.gz, "
                                                "raw/node-feat.csv.gz, raw/node-label.csv.gz "
                                                "missing; expected OGB's node-property layout"):
        read_graph_file(tmp_path / "empty")


def test_dataset_and_graph_are_one_or_the_other(tmp_path, capsys):
    np.savez(tmp_path / "g.npz", **tiny_arrays())
    for args, message in (
            (["--graph", tmp_path / "g.npz", "--dataset", "cora"],
             "give --dataset NAME or --graph PATH, not both"),
            ([], "one of --dataset NAME or --graph PATH is required")):
        status, _, stderr = run_cli(capsys, *args, "--num-clients", 2, "--out", tmp_path / "o")
        assert status == 2 and stderr.strip() == f"data_prep: error: {message}"
    assert not (tmp_path / "o").exists()
