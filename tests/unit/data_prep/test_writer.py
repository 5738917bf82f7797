"""Interrupted or failing runs leave no partial shard directory or temp dir, and never damage
an existing one."""
from __future__ import annotations

import errno
import json
import os
import socket

import numpy as np
import pytest

from data_prep import writer
from data_prep.api import prepare_shards
from data_prep.verify import verify_shard_dir
from fgl_common import shard_format
from fgl_common.ownership import remove_dead_owners
from tests.helpers import dead_pid

from tests.helpers.data_prep_fixtures import SMALL_SYN, leftovers, run_cli

SYN_OPTIONS = dict(syn_nodes=300, syn_avg_degree=6, syn_classes=3, syn_features=4,
                   show_progress=False)


def fail_on_second_shard(monkeypatch, exception: BaseException) -> None:
    real_write = shard_format.write_client_shard
    calls = {"n": 0}

    def flaky_write(path, shard):
        calls["n"] += 1
        if calls["n"] == 2:
            real_write(path, shard)  # half-written state on disk when the failure hits
            raise exception
        real_write(path, shard)

    monkeypatch.setattr(writer.shard_format, "write_client_shard", flaky_write)


def snapshot(directory):
    return {p.name: p.read_bytes() for p in directory.iterdir()}


@pytest.mark.parametrize("exception,status", [
    (KeyboardInterrupt(), 130),
    (OSError(errno.ENOSPC, "No space left on device"), 2),
])
def test_failure_leaves_nothing(tmp_path, capsys, monkeypatch, exception, status):
    parent = tmp_path / "out"
    fail_on_second_shard(monkeypatch, exception)
    code, _, stderr = run_cli(capsys, *SMALL_SYN, "--num-clients", 4, "--out",
                              parent / "shards", "--quiet")
    assert code == status
    assert "Traceback" not in stderr
    if status == 2:
        assert "No space left on device" in stderr
    assert list(parent.iterdir()) == []  # no SHARD_DIR, no .partial temp dir


@pytest.mark.parametrize("exception", [KeyboardInterrupt(), OSError(errno.ENOSPC, "disk full"),
                                       RuntimeError("bug")])
def test_failure_with_force_keeps_existing(tmp_path, capsys, monkeypatch, exception):
    out = tmp_path / "shards"
    assert run_cli(capsys, *SMALL_SYN, "--num-clients", 3, "--out", out, "--quiet")[0] == 0
    before = snapshot(out)
    fail_on_second_shard(monkeypatch, exception)
    try:
        code, _, _ = run_cli(capsys, *SMALL_SYN, "--num-clients", 4, "--seed", 1, "--out", out,
                             "--force", "--quiet")
        assert code != 0
    except RuntimeError:
        pass  # internal errors are not user errors: they propagate, but cleanup still happens
    assert snapshot(out) == before
    assert leftovers(tmp_path) == []


def test_failure_during_swap_restores_existing(tmp_path, capsys, monkeypatch):
    out = tmp_path / "shards"
    assert run_cli(capsys, *SMALL_SYN, "--num-clients", 3, "--out", out, "--quiet")[0] == 0
    before = snapshot(out)
    real_rename = writer.os.rename
    calls = {"n": 0}

    def rename_failing_second(src, dst):
        calls["n"] += 1
        if calls["n"] == 2:  # old moved aside, new not yet in place
            raise OSError(errno.EIO, "simulated I/O error")
        real_rename(src, dst)

    monkeypatch.setattr(writer.os, "rename", rename_failing_second)
    code, _, stderr = run_cli(capsys, *SMALL_SYN, "--num-clients", 4, "--out", out, "--force",
                              "--quiet")
    assert code == 2 and "simulated I/O error" in stderr
    assert snapshot(out) == before
    assert leftovers(tmp_path) == []


def test_force_replaces_only_when_complete(tmp_path, capsys):
    out = tmp_path / "shards"
    assert run_cli(capsys, *SMALL_SYN, "--num-clients", 3, "--out", out, "--quiet")[0] == 0
    code, _, _ = run_cli(capsys, *SMALL_SYN, "--num-clients", 5, "--out", out, "--force",
                         "--quiet")
    assert code == 0
    assert shard_format.read_manifest(out).num_clients == 5
    assert sorted(p.name for p in out.iterdir()) == \
        ["client_0.h5", "client_1.h5", "client_2.h5", "client_3.h5", "client_4.h5",
         "manifest.json"]
    assert leftovers(tmp_path) == []


def test_prepare_shards_reuses_and_protects(tmp_path, isolated_cache, monkeypatch):
    options = dict(syn_nodes=300, syn_avg_degree=6, syn_classes=3, syn_features=4,
                   show_progress=False)
    monkeypatch.chdir(tmp_path)  # the default out is relative to the working directory
    manifest = prepare_shards("synthetic", 3, seed=2, **options)
    out = tmp_path / "shards" / "synthetic-random-m3-s2"
    assert (out / "manifest.json").is_file() and manifest["num_clients"] == 3
    stamp = (out / "client_0.h5").stat().st_mtime_ns
    assert prepare_shards("synthetic", 3, seed=2, **options) == manifest  # reused as is
    assert (out / "client_0.h5").stat().st_mtime_ns == stamp
    with pytest.raises(FileExistsError, match="force=True"):
        prepare_shards("synthetic", 3, seed=2, out=out, **{**options, "syn_nodes": 400})
    rebuilt = prepare_shards("synthetic", 3, seed=2, out=out, force=True,
                             **{**options, "syn_nodes": 400})
    assert rebuilt["num_nodes"] == 400
    with pytest.raises(ValueError, match="unknown options"):
        prepare_shards("synthetic", 3, out=tmp_path / "x", syn_nodez=5)


def test_loser_of_the_preparation_race_uses_the_winners_shards(tmp_path, monkeypatch):
    out = tmp_path / "shards"
    real_install = writer._install

    def winner_first(scratch, target, force):
        monkeypatch.setattr(writer, "_install", real_install)
        prepare_shards("synthetic", 3, seed=2, out=target, **SYN_OPTIONS)  # the winner
        real_install(scratch, target, force)

    monkeypatch.setattr(writer, "_install", winner_first)
    manifest = prepare_shards("synthetic", 3, seed=2, out=out, **SYN_OPTIONS)
    assert manifest == json.loads((out / "manifest.json").read_text())
    assert [p.name for p in tmp_path.iterdir()] == ["shards"]  # the loser's partial is gone


def test_litter_of_killed_runs_is_removed_by_the_next(tmp_path, capsys):
    dead, live = dead_pid(), os.getpid()
    host = socket.gethostname()
    for owner in (dead, live):
        (tmp_path / f".shards.partial-{host}-{owner}-abc_12").mkdir()
        (tmp_path / "cache" / "raw-copies" / f"cora-{host}-{owner}-xyz").mkdir(parents=True)
    code, _, _ = run_cli(capsys, *SMALL_SYN, "--num-clients", 2, "--out", tmp_path / "shards",
                         "--quiet")
    assert code == 0
    assert sorted(p.name for p in tmp_path.glob(".shards.*")) == \
        [f".shards.partial-{host}-{live}-abc_12"]
    removed = remove_dead_owners(tmp_path / "cache" / "raw-copies", "cora-")
    assert [p.name for p in removed] == [f"cora-{host}-{dead}-xyz"]


@pytest.mark.needs_mount
def test_a_real_full_disk_ends_with_one_line_and_removes_the_partial_output(tiny_fs, capsys):
    """A tmpfs too small for the shards (no faked OSError): HDF5 never writes into the full
    file system itself (the shard is built in memory), so the run ends with one line naming the
    file, the free bytes and the bytes it needed, and leaves nothing behind."""
    fs = tiny_fs(96 * 1024)
    code, stdout, stderr = run_cli(capsys, *SMALL_SYN, "--num-clients", 4, "--out",
                                   fs / "shards", "--quiet")
    assert code == 2 and stdout == ""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"data_prep: error: {fs / 'shards'}/client_")
    assert "No space left on device (the file system has " in lines[0]
    assert "bytes free, this write needs " in lines[0] and "partial output removed" in lines[0]
    assert list(fs.iterdir()) == []


def test_non_finite_features_are_refused_naming_the_first_bad_node(monkeypatch, tmp_path, capsys):
    from data_prep import api

    original = api.load_dataset

    def with_a_nan(config):
        graph = original(config)
        graph.x[17, 3] = np.nan
        graph.x[40, 0] = np.inf
        return graph

    monkeypatch.setattr(api, "load_dataset", with_a_nan)
    code, _, stderr = run_cli(capsys, *SMALL_SYN, "--num-clients", 2, "--out",
                              tmp_path / "shards", "--quiet")
    assert code == 2
    assert stderr.strip() == (
        "data_prep: error: the generated dataset synthetic: the node features (dataset x) hold "
        "non-finite values: nan at node 17, column 3; 2 nodes affected; no shards written")
    assert list(tmp_path.iterdir()) == []


def test_shards_a_killed_force_moved_aside_are_restored_by_the_next_run(tmp_path, capsys):
    """SIGKILL between the two renames of --force: no --out, the good shards in a hidden
    `.old-` folder of a dead process. The next data_prep into that --out puts them back and
    says so (never removes them as litter); it replaces them only with --force."""
    out = tmp_path / "shards"
    assert run_cli(capsys, *SMALL_SYN, "--num-clients", 3, "--out", out, "--quiet")[0] == 0
    before = snapshot(out)
    host, dead = socket.gethostname(), dead_pid()
    aside = tmp_path / f".shards.old-{host}-{dead}-k2j"
    out.rename(aside)
    (tmp_path / f".shards.partial-{host}-{dead}-x7q").mkdir()  # the new shards, complete
    code, _, stderr = run_cli(capsys, *SMALL_SYN, "--num-clients", 4, "--out", out, "--quiet")
    assert code == 2 and stderr.splitlines() == [
        f"data_prep: warning: restored {out} from {aside.name}: a data_prep killed while "
        f"replacing it (--force) had moved the previous shards aside",
        f"data_prep: error: output {out} already exists; pass --force to replace it (the old "
        f"one is removed only after the new one is complete)"]
    assert snapshot(out) == before and leftovers(tmp_path) == [aside.name.replace(
        ".old-", ".partial-").replace("k2j", "x7q")]
    out.rename(aside)  # killed again: this time the next run asks for the replacement
    code, _, stderr = run_cli(capsys, *SMALL_SYN, "--num-clients", 4, "--out", out, "--force",
                              "--quiet")
    assert code == 0 and stderr.startswith(f"data_prep: warning: restored {out} from ")
    assert shard_format.read_manifest(out).num_clients == 4 and leftovers(tmp_path) == []


@pytest.mark.parametrize("umask,existing,expected", [
    (0o022, None, 0o755), (0o077, None, 0o700), (0o077, 0o755, 0o755), (0o022, 0o2770, 0o2770)])
def test_a_shard_directory_follows_the_umask_and_force_keeps_its_mode(
        tmp_path, capsys, umask, existing, expected):
    out = tmp_path / "shards"
    previous = os.umask(umask)
    try:
        if existing is not None:  # a group-shared directory replaced with --force
            assert run_cli(capsys, *SMALL_SYN, "--num-clients", 2, "--out", out, "--quiet")[0] == 0
            os.chmod(out, existing)
        code, _, stderr = run_cli(capsys, *SMALL_SYN, "--num-clients", 3, "--out", out,
                                  "--force", "--quiet")
    finally:
        os.umask(previous)
    assert code == 0, stderr
    assert oct(os.stat(out).st_mode & 0o7777) == oct(expected)
    assert oct(os.stat(out / "manifest.json").st_mode & 0o777) == oct(0o666 & ~umask)


def test_shards_never_go_into_or_over_a_run_or_shard_directory(tmp_path, capsys):
    shards, run = tmp_path / "shards", tmp_path / "run"
    assert run_cli(capsys, *SMALL_SYN, "--num-clients", 2, "--out", shards, "--quiet")[0] == 0
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"algo": "ours", "world_size": 3}))
    for out, why in ((shards / "more", f"it lies inside the shard directory {shards} of "
                                      f"data_prep, which holds that program's files only"),
                     (run / "shards", f"it lies inside the run directory {run} of "
                                      f"mpifgl.train, which holds that program's files only"),
                     (run, "it is a run directory of mpifgl.train (config.json there)")):
        code, _, stderr = run_cli(capsys, *SMALL_SYN, "--num-clients", 2, "--out", out,
                                  "--force", "--quiet")
        assert code == 2 and stderr.startswith(f"data_prep: error: --out {out}: {why}"), stderr
    assert sorted(p.name for p in run.iterdir()) == ["config.json"]
    assert verify_shard_dir(shards).ok
