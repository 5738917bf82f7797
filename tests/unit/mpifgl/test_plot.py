"""mpifgl.plot: several runs' metrics.jsonl drawn into one PNG; a missing run is one line."""
from __future__ import annotations

import json

import pytest

from mpifgl import plot
from mpifgl.plot import client_mib, main, read_metrics

pytestmark = pytest.mark.usefixtures("matplotlib_fonts")  # draws a figure


def fake_run(path, epochs: int, ranks: int, eval_every: int = 1):
    path.mkdir(parents=True)
    lines = []
    for epoch in range(1, epochs + 1):
        record = {"epoch": epoch, "loss": 2.0 / epoch, "epoch_seconds": 0.1,
                  "bytes_sent": [2 ** 20] * ranks, "bytes_received": [2 ** 21] * ranks}
        if epoch % eval_every == 0:
            record.update(train_micro_f1=0.5, val_micro_f1=0.4, test_micro_f1=0.45)
        lines.append(json.dumps(record))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return path


def test_runs_are_drawn_over_each_other(tmp_path, capsys, monkeypatch):
    one = fake_run(tmp_path / "a", epochs=5, ranks=3)
    two = fake_run(tmp_path / "b", epochs=3, ranks=1, eval_every=2)
    out = tmp_path / "both.png"
    assert main([str(one), str(two), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out.strip() == f"mpifgl.plot: wrote {out} (2 runs)"
    monkeypatch.setattr(plot, "draw", lambda runs, x: b"drawn")  # where it goes, not what it is
    assert main([str(one)]) == 0 and (one / "metrics.png").read_bytes() == b"drawn"
    monkeypatch.chdir(tmp_path)
    assert main([str(one), str(two)]) == 0 and (tmp_path / "metrics.png").is_file()


def test_from_epoch_draws_only_the_later_epochs(tmp_path, monkeypatch, capsys):
    run = fake_run(tmp_path / "a", epochs=6, ranks=2, eval_every=2)
    drawn = {}
    monkeypatch.setattr(plot, "draw", lambda runs, x: drawn.update(runs) or b"drawn")
    assert main([str(run), "--from-epoch", "4"]) == 0
    assert [r["epoch"] for r in drawn["a"]] == [4, 5, 6]
    with pytest.raises(SystemExit):
        main([str(run), "--from-epoch", "0"])
    assert "--from-epoch 0: expected an epoch >= 1" in capsys.readouterr().err


def test_micro_f1_against_seconds(tmp_path, monkeypatch):
    """--x seconds: each epoch at its elapsed_seconds, or at the sum of the epochs' seconds for
    a run recorded before them; epochs left out by --from-epoch still count."""
    old = fake_run(tmp_path / "old", epochs=4, ranks=2)
    new = fake_run(tmp_path / "new", epochs=2, ranks=2)
    (new / "metrics.jsonl").write_text("".join(
        json.dumps({**json.loads(line), "elapsed_seconds": 1.5 * k}) + "\n"
        for k, line in enumerate((new / "metrics.jsonl").read_text().splitlines(), 1)))
    drawn = {}
    monkeypatch.setattr(plot, "draw", lambda runs, x: drawn.update(runs, x=x) or b"drawn")
    assert main([str(old), str(new), "--x", "seconds", "--from-epoch", "2", "--out",
                 str(tmp_path / "both.png")]) == 0
    assert drawn["x"] == "seconds"
    assert plot.x_values(drawn["old"], "seconds") == pytest.approx([0.2, 0.3, 0.4])
    assert plot.x_values(drawn["new"], "seconds") == [3.0]
    monkeypatch.undo()  # and the real drawing of it
    assert main([str(old), "--x", "seconds", "--out", str(tmp_path / "t.png")]) == 0
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


def test_bytes_per_client_leave_out_the_server():
    record = {"bytes_sent": [100, 2 ** 20, 3 * 2 ** 20], "bytes_received": [0, 2 ** 20, 2 ** 20]}
    assert client_mib(record) == 3.0
    assert client_mib({"bytes_sent": [0], "bytes_received": [0]}) == 0.0


def test_a_missing_or_empty_run_is_one_line(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere")]) == 1
    err = capsys.readouterr().err
    assert err == (f"mpifgl.plot: error: {tmp_path / 'nowhere' / 'metrics.jsonl'}: no such "
                   "directory; expected the run directory of `python -m mpifgl.train`\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.jsonl").write_text("")
    assert main([str(tmp_path / "empty")]) == 1
    assert "no epoch recorded yet" in capsys.readouterr().err
    torn = fake_run(tmp_path / "torn", epochs=2, ranks=1)
    with open(torn / "metrics.jsonl", "a") as handle:
        handle.write('{"epoch": 3, "lo')  # a line cut off by a kill
    assert [r["epoch"] for r in read_metrics(torn)] == [1, 2]


def test_a_plot_never_replaces_a_file_of_a_run_or_enters_a_shard_directory(
        tmp_path, capsys, toy_shards, monkeypatch):
    monkeypatch.setattr(plot, "draw", lambda runs, x: plot.PNG_SIGNATURE + b"drawn")
    run = fake_run(tmp_path / "run", epochs=2, ranks=3)
    (run / "config.json").write_text(json.dumps({"algo": "ours", "world_size": 3}))
    (run / "notes.txt").write_text("mine")
    (tmp_path / "link").symlink_to(run)
    shards = toy_shards(2)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    for out, why in (
            (run / "metrics.jsonl", f"refusing to replace metrics.jsonl in the run directory "
                                    f"{run}: it is a file of that run; choose a new file name"),
            (tmp_path / "link" / "config.json", "refusing to replace config.json in the run "
                                                "directory"),
            (run / "notes.txt", f"refusing to replace notes.txt in the run directory {run}: it "
                                f"is not a file this tool wrote"),
            (shards / "plot.png", f"refusing to write into the shard directory {shards}")):
        assert main([str(run), "--out", str(out)]) == 1
        assert capsys.readouterr().err.startswith(f"mpifgl.plot: error: --out {out}: {why}")
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    assert sorted(p.name for p in shards.iterdir()) == ["client_0.h5", "client_1.h5",
                                                        "manifest.json"]
    for _ in range(2):  # its own plot, drawn again, and a new file of its own
        assert main([str(run)]) == 0 and plot.is_png(run / "metrics.png")
    assert main([str(run), "--out", str(run / "late.png")]) == 0
