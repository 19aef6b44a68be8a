"""torchrun as jobs/launch.sh starts it on each node: torch.distributed.run's own `main`, the same arguments and
behaviour, less the Python traceback torchrun prints when it stops because a worker exited non-zero
(ChildFailedError) or because it got SIGTERM (SignalException, a requeue or a time limit). Those are the ends a job
expects (a refused run, a check that is not ready, a requeue): the job's .err file then holds the run's own
`error: ...` line and one line of this, not 30 lines that read as a crash. A worker's own traceback (a real bug) is
the worker's, printed before torchrun sees it exit, and stays; any other exception of torchrun keeps its traceback.
The exit status stays torchrun's 1: the launcher takes rank 0's status from the file run_qa.py wrote."""
import os
import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main as torchrun


def main(argv=None) -> int:
    try:
        torchrun(argv)
    except ChildFailedError as failed:
        rank, failure = failed.get_first_failure()
        how = f"was killed by {failure.signal_name()}" if failure.exitcode < 0 else f"exited with code {failure.exitcode}"
        print(f"torchrun: {os.path.basename(failed.name)} {how} on rank {rank} ({len(failed.failures)} process(es) "
              "failed)", file=sys.stderr)
        return 1
    except SignalException as stopped:
        print(f"torchrun: {stopped.sigval.name} received, workers stopped", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
