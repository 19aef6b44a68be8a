"""The local SLURM cluster (bench/local_slurm.py) as a session-scoped pytest fixture.

Use it from a test module with::

    from tests.slurm_fixture import slurm_cluster  # noqa: F401  (registers the fixture)

Every SLURM test is skipped, with the reason, when we are not root or slurm cannot be installed
(the script exits 3).
"""
import os

import pytest

from bench.local_slurm import slurm_script, start_cluster


def require_slurm() -> None:
    """Skip the calling test/fixture unless a local SLURM cluster can be run here."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        pytest.skip("local SLURM cluster needs Linux")
    if os.geteuid() != 0:
        pytest.skip("local SLURM cluster needs root (apt-get install, SlurmUser=root)")
    r = slurm_script("install", timeout=600)
    if r.returncode == 3:
        pytest.skip((r.stderr.strip() or r.stdout.strip()).splitlines()[-1])
    if r.returncode != 0:
        pytest.fail(f"slurm_local.sh install failed ({r.returncode}): {r.stderr}")


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    require_slurm()
    cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
    finally:
        cluster.stop()
        left = cluster.pids()
        assert not left, f"SLURM daemons still running after stop: {left}"
