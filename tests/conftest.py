"""The fixtures the test modules share, and what every test checks besides its own assertions: each InputError it
provokes reads as one line of at most ERROR_LINE_LIMIT characters as printed (`error: ...`), the length
docs/running.md promises. A path under the tests' temporary folder counts as a short one ("runs"): a user's own long
paths are theirs, the rest of the line is ours. Helpers (functions and constants) are in tests/helpers.py."""
import os
import re

# pytest.ini's two test processes share the CI machine's two cores: one thread each, where torch's default threads,
# two a process, spin while the other process holds the core (tests/test_fast_path.py, test_time_to_accuracy.py and
# test_tokenizers.py together: 109-129 s with the default against 66-70 s, in both orders). Set in the process
# before torch is imported, and inherited by the runs and jobs the tests start.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

from qa.errors import InputError
from tests.helpers import clear_slurm_leftovers, require_slurm

ERROR_LINE_LIMIT = 300


@pytest.fixture(autouse=True)
def error_lines_stay_short(monkeypatch, tmp_path_factory):
    made = []
    init = InputError.__init__

    def recorded(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(f"error: {self}")

    monkeypatch.setattr(InputError, "__init__", recorded)
    yield
    temporary = re.compile(re.escape(str(tmp_path_factory.getbasetemp())) + r"/[^/\s'\"]+")
    long = [line for line in made if "\n" in line or len(temporary.sub("runs", line)) > ERROR_LINE_LIMIT]
    if long:
        pytest.fail(f"error lines over {ERROR_LINE_LIMIT} characters (test paths as 'runs'), or of several lines: "
                    + " | ".join(f"{len(temporary.sub('runs', line))}: {line}" for line in long), pytrace=False)


_STARTED_CLUSTER = []  # the session's cluster, once started


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """One local 2-node SLURM cluster (bench/local_slurm.py) for the whole session, every SLURM test module's; skipped,
    with the reason, where none can run (not root, slurm-wlm not installable)."""
    from bench.local_slurm import start_cluster

    require_slurm()
    cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
    _STARTED_CLUSTER.append(cluster)
    try:
        yield cluster
    finally:
        _STARTED_CLUSTER.clear()
        cluster.stop()
        left = cluster.pids()
        assert not left, f"SLURM daemons still running after stop: {left}"


@pytest.fixture(autouse=True)
def slurm_cluster_left_idle(request):
    """The tests share one cluster: what a test leaves on it (a job still queued or running because the test failed
    before the job ended, a node drained) is cleared after it, so that no later test, of this module or another,
    waits behind it or runs on fewer nodes."""
    yield
    if "slurm_cluster" in request.fixturenames and _STARTED_CLUSTER:  # (a test that failed in its setup too)
        left = clear_slurm_leftovers(_STARTED_CLUSTER[0])
        if left:
            print(f"\n{request.node.nodeid}: left on the SLURM cluster and cleared: {'; '.join(left)}")


SLURM_MODULES = "tests/test_slurm_"  # the modules that use the cluster: one process runs them all, one after another


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own default
def pytest_xdist_make_scheduler(config, log):
    """pytest.ini runs the suite in two processes (pytest-xdist): a module's tests stay in one, so that its module
    fixtures run once, and the SLURM modules share one process and so its one cluster (xdist's loadgroup cannot say
    so: pytest 9 ignores the test ids it rewrites)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            module = nodeid.split("::", 1)[0]
            return SLURM_MODULES if module.startswith(SLURM_MODULES) else module

    return ByModule(config, log)


def pytest_collection_modifyitems(items):
    strays = {item.nodeid.split("::")[0] for item in items if "slurm_cluster" in item.fixturenames
              and not item.nodeid.startswith(SLURM_MODULES)}
    if strays:  # else two processes would start two clusters on the same ports
        raise pytest.UsageError(f"{', '.join(sorted(strays))} use(s) slurm_cluster: name the module {SLURM_MODULES}*")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """QA_NO_SKIPS=1 (.ci/run sets it): a test that skips fails with its reason, so that CI cannot pass without what
    it provides (the dev set, the second transformers environment, the SLURM cluster, a compiler)."""
    report = (yield).get_result()
    if report.skipped and os.environ.get("QA_NO_SKIPS") == "1" and not hasattr(report, "wasxfail"):
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome, report.longrepr = "failed", f"skipped, where QA_NO_SKIPS=1 expects it to run: {reason}"
