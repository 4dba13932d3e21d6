"""One training run per workspace, and how a run ended, for the launcher.

The process that writes the checkpoints (rank 0) holds an advisory lock (flock) on <workspace>/run.lock for its whole
life. The file records who holds it (pid, host, start time) and, at the end, how the run ended: "stopped" (by a signal,
after saving a checkpoint), "done" or "failed" (an error ended it); a holder killed outright cannot write, and run_state
reads its "running" as "crashed" (the lock is free). Why flock: the kernel drops the lock when its holder exits, however
it dies (SIGKILL, the OOM killer), so a dead run's lock is taken over without any clean-up, and workers left running by
a launcher killed outright keep the workspace until they are gone. On NFS, Linux maps flock to the server's byte-range
locks, so runs on different nodes exclude each other; a file system without locks (Lustre without -o flock, NFS mounted
-o nolock) gets a warning and no lock.

Only the standard library: runner imports this without MXNet.
"""
import atexit
import errno
import fcntl
import json
import os
import socket
import time

LOCK_NAME = "run.lock"
# runner puts a file name here; rank 0 writes its ending into it (launcher-agnostic: horovodrun, mpirun and srun
# pass the environment on), so runner can tell a clean stop from a failure whatever the launcher's status says.
OUTCOME_ENV = "RN50_OUTCOME"
NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class WorkspaceBusy(Exception):
    """Another live process holds the workspace."""


def lock_path(workspace):
    return os.path.join(workspace, LOCK_NAME)


def read_record(path):
    """The record in a lock file ({} when absent, empty, being written or not a record: another tool's text)."""
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError, RecursionError):
        return {}
    return record if isinstance(record, dict) else {}


def describe(record):
    """'pid 123 on host node1 (started 2026-11-22 06:20:01 UTC)', or a vaguer phrase without a record."""
    if not record.get("pid"):
        return "another process"
    try:
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(record["started"]))
    except (KeyError, TypeError, ValueError, OverflowError, OSError):  # none, or not a time (a damaged file)
        started = "?"
    return f"pid {record['pid']} on host {record.get('host', '?')} (started {started})"


def busy_message(workspace, record):
    return (f"workspace {workspace} is in use by {describe(record)}, which holds {lock_path(workspace)}; "
            "wait for that run to end (or stop it), or give another --workspace")


def holder(workspace):
    """The record of the live process holding ``workspace``, or None when it is free. Creates nothing."""
    path = lock_path(workspace)
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None  # no lock file (or not ours to open): the worker's own attempt decides
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        return read_record(path)
    except OSError:
        return None
    finally:
        os.close(fd)  # closing drops the probe's lock at once


def run_state(workspace):
    """The lock file's record with the run's state as it is now: a record still saying "running" whose holder is
    gone (killed, crashed, or a machine that went down: the kernel dropped its lock) reads "crashed". {} when
    there is no lock file."""
    record = read_record(lock_path(workspace))
    if record.get("state") == "running" and holder(workspace) is None:
        record = dict(record, state="crashed", note="its holder ended without recording how (killed or crashed)")
    return record


class WorkspaceLock:
    """Held from ``acquire`` until the process exits (or ``release``)."""

    def __init__(self, workspace):
        self.workspace = workspace
        self.path = lock_path(workspace)
        self.fd = None
        self.record = {}

    def acquire(self, patience_s=2.0):
        """Take the lock; raise WorkspaceBusy naming the holder. Returns False on a file system without locks.

        ``patience_s``: a launcher's brief probe (see ``holder``) can overlap our first attempt."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by children (PEP 446)
        deadline = time.monotonic() + patience_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise WorkspaceBusy(busy_message(self.workspace, read_record(self.path)))
                time.sleep(0.1)
            except OSError as error:
                os.close(fd)
                if error.errno in NO_LOCKS:
                    return False
                raise
        self.fd = fd
        self.previous = read_record(self.path)  # the run before, if any ("running" here: it crashed)
        self.record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "state": "running"}
        self._write()
        atexit.register(self._ended_without_finish)
        return True

    def _ended_without_finish(self):
        """At exit (an exception, sys.exit, Ctrl-C before the end): a run that did not finish says so."""
        if self.fd is not None and self.record.get("state") == "running":
            self.finish("failed")

    def finish(self, state):
        """Record how the run ended ("stopped", "done" or "failed"), in the lock file and for runner."""
        self.record = dict(self.record, state=state, ended=time.time())
        if self.fd is not None:
            self._write()
        outcome = os.environ.get(OUTCOME_ENV)
        if outcome:
            try:
                with open(outcome, "w") as f:
                    json.dump(self.record, f)
            except OSError:
                pass  # rank 0 on another machine than runner: runner goes by the launcher's status

    def release(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _write(self):
        data = json.dumps(self.record).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)
        os.fsync(self.fd)


def read_outcome(path):
    """The state rank 0 recorded in runner's outcome file: "stopped", "done", or None (nothing recorded)."""
    return read_record(path).get("state") if path else None


if __name__ == "__main__":
    import sys
    usage = ("usage: python -m rn50kit.reliability.run_lock WORKSPACE   "
             "(prints how the run there ended, or that it runs)")
    if sys.argv[1:] in (["-h"], ["--help"]):
        print(usage)
        sys.exit(0)
    if len(sys.argv) != 2:
        sys.exit(usage)
    state = run_state(sys.argv[1])
    print(json.dumps(state) if state else f"no run has held {sys.argv[1]}")
