"""Bad input ends with one clear ``data_prep: error: ...`` line (exit 2), never a traceback or
a network access."""
from __future__ import annotations

import pytest

from data_prep.catalog import KNOWN_DATASETS
from data_prep.datasets import default_data_root

from tests.helpers.data_prep_fixtures import SMALL_SYN, run_cli


def expect_error(capsys, *argv, contains: list[str]) -> str:
    status, stdout, stderr = run_cli(capsys, *argv)
    assert status == 2, (stdout, stderr)
    assert "data_prep: error:" in stderr
    assert "Traceback" not in stderr
    for text in contains:
        assert text in stderr, f"{text!r} not in {stderr!r}"
    return stderr


def test_unknown_dataset_lists_known_ones(tmp_path, capsys):
    err = expect_error(capsys, "--dataset", "corra", "--num-clients", 2, "--out", tmp_path / "o",
                       contains=["corra", "known datasets"])
    for name in KNOWN_DATASETS:
        assert name in err


@pytest.mark.parametrize("flag,value,message", [
    ("--num-clients", 0, "--num-clients must be >= 1, got 0"),
    ("--num-clients", -3, "--num-clients must be >= 1, got -3"),
    ("--num-clients", 601, "--num-clients 601 exceeds the 600 nodes"),
    ("--seed", -1, "--seed must be >= 0, got -1"),
    ("--syn-homophily", 1.5, "--syn-homophily must be in [0, 1], got 1.5"),
    ("--syn-nodes", 0, "--syn-nodes must be >= 1, got 0"),
    ("--skew-factor", 0.5, "--skew-factor must be > 1, got 0.5"),
    ("--partition", "spectral", "unknown --partition 'spectral'"),
])
def test_bad_numbers(tmp_path, capsys, flag, value, message):
    argv = {"--num-clients": 2, "--seed": 0}
    args = [*SMALL_SYN, "--out", tmp_path / "o", "--partition", "label-skew"]
    if flag in argv or flag == "--partition":
        argv[flag] = value
    else:
        args += [flag, value]
    for key, val in argv.items():
        args += [key, val]
    expect_error(capsys, *args, contains=[message])
    assert not (tmp_path / "o").exists()


def test_num_clients_above_real_node_count(tmp_path, capsys):
    expect_error(capsys, "--dataset", "cora", "--num-clients", 5000, "--out", tmp_path / "o",
                 "--data-root", tmp_path, contains=["--num-clients 5000 exceeds the 2708 nodes"])


def test_non_integer_flag_is_a_usage_error(tmp_path, capsys):
    status, _, stderr = run_cli(capsys, "--dataset", "cora", "--num-clients", "eight",
                                "--out", tmp_path / "o")
    assert status == 2 and "invalid int value: 'eight'" in stderr and "Traceback" not in stderr


@pytest.mark.parametrize("dataset,files", [
    ("pubmed", ["Planetoid/PubMed/raw/ind.pubmed.x", "ind.pubmed.graph"]),
    ("reddit", ["Reddit/raw/reddit_data.npz", "Reddit/raw/reddit_graph.npz"]),
    ("ogbn-products", ["OGB/ogbn_products/raw/edge.csv.gz", "split/sales_ranking/train.csv.gz"]),
    ("ogbn-arxiv", ["OGB/ogbn_arxiv/raw/node_year.csv.gz"]),
    ("amazon-photo", ["Amazon/Photo/raw/amazon_electronics_photo.npz"]),
    ("coauthor-physics", ["Coauthor/Physics/raw/ms_academic_phy.npz"]),
])
def test_missing_raw_files_fail_at_once(tmp_path, isolated_cache, capsys, dataset, files):
    empty_root = tmp_path / "empty"
    empty_root.mkdir()
    err = expect_error(capsys, "--dataset", dataset, "--num-clients", 8, "--data-root",
                       empty_root, "--out", tmp_path / "o",
                       contains=[str(empty_root), "--download", "To obtain them", *files])
    assert "urlopen" not in err and "Connection" not in err
    assert list(empty_root.iterdir()) == []  # nothing downloaded, nothing written




def test_corrupted_raw_file_is_reported(tmp_path, isolated_cache, capsys):
    data_root = tmp_path / "data"
    raw = data_root / "Amazon/Computers/raw/amazon_electronics_computers.npz"
    raw.parent.mkdir(parents=True)
    raw.write_bytes(b"this is not a zip archive")
    expect_error(capsys, "--dataset", "amazon-computers", "--num-clients", 2, "--data-root",
                 data_root, "--out", tmp_path / "o",
                 contains=["amazon-computers", "could not read the raw files",
                           str(data_root / "Amazon/Computers/raw")])


def test_unwritable_output_directory(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    expect_error(capsys, *SMALL_SYN, "--num-clients", 2, "--out", blocker / "shards",
                 contains=[f"output directory {blocker}", "cannot be created"])


def test_existing_output_needs_force(tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    expect_error(capsys, *SMALL_SYN, "--num-clients", 2, "--out", out,
                 contains=[f"output {out} already exists", "--force"])
    # --force must still refuse to delete a directory that is not a shard directory
    expect_error(capsys, *SMALL_SYN, "--num-clients", 2, "--out", out, "--force",
                 contains=["refusing to replace", "not a shard directory"])
    assert (out / "keep.txt").read_text() == "mine"


def test_default_data_root(monkeypatch, tmp_path):
    """MPIFGL_DATA_ROOT, else ../shared/data beside the checkout when it exists, else the cache
    in the home directory; both branches on a checkout laid out in tmp_path."""
    from data_prep import datasets
    monkeypatch.setenv("MPIFGL_DATA_ROOT", str(tmp_path / "env"))
    assert default_data_root() == tmp_path / "env"
    monkeypatch.delenv("MPIFGL_DATA_ROOT")
    checkout = tmp_path / "work" / "repo"
    monkeypatch.setattr(datasets, "__file__", str(checkout / "data_prep" / "datasets.py"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_data_root() == tmp_path / "home" / ".cache" / "mpifgl" / "data"
    (tmp_path / "work" / "shared" / "data").mkdir(parents=True)
    assert default_data_root() == tmp_path / "work" / "shared" / "data"


def test_label_skew_knobs_that_make_an_iid_split_are_refused_at_start(tmp_path, capsys):
    """Favouring every class, or favouring with weight 1, draws every class alike: an iid split
    under a non-iid name. Refused before anything is loaded (cora's raw files are not there)."""
    start = ["--num-clients", 3, "--out", tmp_path / "o", "--partition", "label-skew"]
    expect_error(capsys, "--dataset", "cora", "--data-root", tmp_path, *start,
                 "--favoured-classes", 8, contains=[
                     "data_prep: error: --favoured-classes must be in 1..6 for the 7 classes of "
                     "cora, got 8: a client that favours every class draws them all alike, an "
                     "iid split (that is --partition random)"])
    expect_error(capsys, *SMALL_SYN, *start, "--favoured-classes", 4,
                 contains=["--favoured-classes must be in 1..3 for the 4 classes of synthetic"])
    expect_error(capsys, *SMALL_SYN, *start, "--skew-factor", 1,
                 contains=["--skew-factor must be > 1, got 1.0: a favoured class of weight 1 "
                           "is drawn no more often than the others"])
    expect_error(capsys, *SMALL_SYN, "--num-clients", 3, "--out", tmp_path / "o",
                 "--favoured-classes", 3, contains=[
                     "--favoured-classes given with --partition random, which does not read it "
                     "(--partition label-skew does)"])
    assert not (tmp_path / "o").exists()



@pytest.mark.parametrize("size", [["--syn-avg-degree", "8"], ["--syn-edges", "2400"]],
                         ids=["avg-degree", "edges"])
def test_the_summary_of_a_synthetic_graph_names_no_edge_cleaning(tmp_path, capsys, size):
    """The generator's own settings (its edge count among them) are the manifest's source; only
    a user's graph has its edge list cleaned."""
    argv = [*SMALL_SYN[:SMALL_SYN.index("--syn-avg-degree")], *SMALL_SYN[SMALL_SYN.index(
        "--syn-avg-degree") + 2:], *size, "--num-clients", "2", "--out", tmp_path / "shards"]
    status, out, err = run_cli(capsys, *argv)
    assert status == 0, err
    assert "wrote 2 shards" in out and "edge_index:" not in out
