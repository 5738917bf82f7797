"""--algo fedsage-plus under mpirun at 2 and 3 clients on the toy graph: the run directory, and
the bytes of the federated fGen phase in final.json, equal to what its routing moves (the
gradient's equality with local features: tests/unit/mpifgl/methods/test_fedsage.py)."""
from __future__ import annotations

import json

import pytest

from tests.helpers.mpi import run_mpi
from tests.helpers.runs import TINY, TRAIN, check_run_dir, run_ok

# small, and quick to predict hidden neighbours (every node in neither train nor test hidden, a
# large learning rate) so that rows are generated, sent and mended
SMALL_NEIGHGEN = ["--neighgen-epochs", "10", "--neighgen-fed-epochs", "2", "--neighgen-lr", "0.05",
                  "--neighgen-hidden-portion", "1", "--neighgen-generator-widths", "16,32",
                  "--neighgen-latent", "16"]


def expected_bytes(rows: list[int], nodes: list[int], width: int, epochs: int):
    """Per client, (sent, received) by the federated phase's routing in float32: the sizes
    (2 int64 up, the table of every rank's two down), its rows and (slots, count) pairs up, the
    other clients' rows and pairs down and its answers to them up, the answers' sums down."""
    m = len(rows)
    sent, received = [], []
    for c in range(m):
        others = sum(rows) - rows[c]
        other_nodes = sum(nodes) - nodes[c]
        sent.append(epochs * (16 + 4 * width * rows[c] + 16 * nodes[c] + 4 * (width + 1) * others))
        received.append(epochs * (8 * (2 * (m + 1) + 1) + 4 * width * others + 16 * other_nodes
                                  + 4 * (width + 1) * rows[c]))
    return sent, received


@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.parametrize("clients", [2, 3])
def test_fedsage_plus_runs_and_counts_its_set_up_bytes(toy_graph, toy_shards, tmp_path, clients):
    out = tmp_path / "run"
    run_ok(run_mpi(clients + 1, TRAIN + ["--shards", str(toy_shards(clients)), "--algo",
                                         "fedsage-plus", "--epochs", "3", *SMALL_NEIGHGEN,
                                         *TINY, "--out", str(out)], timeout=280))
    check_run_dir(out, toy_graph.num_nodes, toy_graph.num_classes, 3)
    config = json.loads((out / "config.json").read_text())
    assert config["client_weights"] == "uniform"  # the method's default
    final = json.loads((out / "final.json").read_text())
    summary, traffic = final["fedsage"], final["setup_bytes"]["neighgen_federated"]
    assert sum(summary["hidden_nodes"]) > 0 and sum(summary["rows_sent_per_epoch"]) > 0
    sent, received = expected_bytes(summary["rows_sent_per_epoch"],
                                    summary["nodes_sent_per_epoch"], toy_graph.x.shape[1], 2)
    assert traffic["bytes_sent"][1:] == sent and traffic["bytes_received"][1:] == received
    # the server relays every byte: it receives what the clients send, sends what they receive
    assert traffic["bytes_received"][0] == sum(sent) and traffic["bytes_sent"][0] == sum(received)
