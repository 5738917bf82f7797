"""The multinode tier: jobs whose ranks run on namespace hosts (tests/helpers/netns.py) that
stand in for cluster nodes. Where namespaces cannot be made here (not root, no ``ip``, EPERM)
every test of the tier is skipped with the reason.

Nothing outlives the tier: each fixture removes the namespaces it made in a ``finally`` (their
processes, links and mounts go with them), and the test run sweeps first whatever namespaces of
this helper a killed run left behind, and after, any of its own."""
from __future__ import annotations

import os

import pytest

from tests.helpers.mpi import mpi_env
from tests.helpers.netns import (PREFIX, NamespaceError, NamespaceHosts, missing_requirements,
                                 netns_names, sweep_leftovers)

HOSTS = 3  # two for most jobs; the third shows a launch over more than two


@pytest.fixture(scope="session", autouse=True)
def no_namespace_left_behind():
    """Leftovers of dead runs are swept first; after the tier, none of ours is left."""
    sweep_leftovers()
    yield
    mine = [n for n in netns_names() if n.startswith(f"{PREFIX}-{os.getpid()}-")]
    sweep_leftovers(owner=os.getpid())
    assert not mine, f"namespaces left by the multinode tests (now removed): {mine}"


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """Three namespace hosts for a module's tests; host 2 does not see the folder
    ``hidden[2][0]``, as if it were a disk of host 1 only."""
    reason = missing_requirements()
    if reason:
        pytest.skip(f"namespace hosts cannot be made here: {reason}")
    work = tmp_path_factory.mktemp("hosts")
    hidden = work / "node1-only"
    hidden.mkdir()
    cluster = NamespaceHosts(HOSTS, work, hidden={2: [str(hidden)]})
    try:
        try:
            cluster.start()
        except NamespaceError as exc:
            pytest.skip(f"namespace hosts cannot be made here: {exc}")
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def launch_env() -> dict[str, str]:
    """The project's launch environment (fgl_common.launch), this checkout on PYTHONPATH."""
    return mpi_env()
