"""runner watching a launcher's run: stop signals relayed to the workers, none left running, and the run's end
told in one line with runner's exit status.

The workers' own account (rank 0's outcome file, each worker's fault record) wins over the launcher's status: on a
signal sent to every process of the job the launcher's shells die of it and report a failure while the workers
saved and ended cleanly."""
import dataclasses
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

from rn50kit.reliability import faults, run_lock, world

INTERRUPTED = 130  # 128 + SIGINT: a shell's status for a command ended by Ctrl-C
FINISHED_ALL_THE_SAME = "rank 0 had finished the run all the same (every epoch trained, its report written)"


@dataclasses.dataclass
class Ended:
    """How a launcher's run ended, as the launcher saw it."""
    status: int
    failure: str = ""  # its one line on a failure
    first_failed: tuple = None  # (rank, exit status) of the first worker it saw fail
    known: dict = None  # what it knows of that worker (its host), beyond the worker's own record
    driver_ended: bool = False  # the elastic driver ended the run: ``failure`` says why, no worker's record does
    slot: tuple = None  # (host, local rank) of that worker where the launcher names it so (Horovod's elastic driver)
    crashes: dict = None  # rank -> the signal its output or its shell told of (horovodrun.CrashWatch.seen)


def supervise(launcher, args, command, workspace, checkpoint_prefix):
    """Run ``command`` through ``launcher`` (a launchers.Launcher) to its end, the workers' records kept in a
    folder of their own and none of them left running: runner's exit status. ``checkpoint_prefix``
    (check_train_flags'): where a failed run may resume from."""
    outcome = tempfile.NamedTemporaryFile(prefix="rn50-outcome-", suffix=".json", delete=False)
    outcome.close()
    os.environ[run_lock.OUTCOME_ENV] = outcome.name
    os.environ[faults.FAULTS_ENV] = fault_dir = tempfile.mkdtemp(prefix="rn50-faults-")  # faults: records
    reaper = Reaper(fault_dir)  # faults: no worker outlives runner
    try:
        ended = launcher.start(args, command)
        reaper.finish()
        wait_for_workspace(workspace, fault_dir)
        account = run_lock.read_outcome(outcome.name)
        return conclude(ended.status, ended.failure, account,
                        failure_summary(ended, fault_dir, checkpoint_prefix, finished=account == "done"))
    finally:
        reaper.finish()
        os.unlink(outcome.name)
        shutil.rmtree(fault_dir, ignore_errors=True)


def failure_summary(ended, fault_dir, checkpoint_prefix, finished=False):
    """The one line on a failed run, with the advice to resume only where a complete checkpoint exists; None when
    the run did not fail. ``finished``: rank 0 had ended the run well all the same (a worker whose connection was
    cut lives on and finishes): the line says so instead."""
    if ended.status in (0, INTERRUPTED):
        return None
    if ended.first_failed is None and ended.slot is not None:  # its rank from the records of who is in that slot
        rank = faults.rank_in_slot(fault_dir, *ended.slot)
        crash = (ended.crashes or {}).get(rank)
        ended = dataclasses.replace(ended, first_failed=None if rank is None else (rank, ended.status),
                                    known={"rank": rank, "crash": crash} if rank is not None and crash else None)
    if finished:
        line = faults.summarize(fault_dir, ended.first_failed, ended.known, advice=FINISHED_ALL_THE_SAME)
        return line or f"{ended.failure}; {FINISHED_ALL_THE_SAME}"
    resumable = has_checkpoint(checkpoint_prefix)
    if ended.driver_ended:
        return ended.failure + (faults.RESUME if resumable else faults.RESTART)
    return faults.summarize(fault_dir, ended.first_failed, ended.known, resumable=resumable)


def has_checkpoint(prefix):
    """Whether a complete checkpoint of ``prefix`` (check_train_flags') exists to resume from (asked only once a
    run has failed): checkpoint.find_latest, as a resume reads it (its files' sizes and checksums, no MXNet)."""
    if not prefix:
        return False
    from rn50kit.weights import checkpoint  # numpy's import, which runner's start does without
    try:
        return checkpoint.find_latest(prefix) is not None
    except (OSError, ValueError):  # a workspace that cannot be read has nothing to resume from
        return False


def conclude(status, failure, outcome, summary=None):
    """runner's exit status. A stop by SIGTERM/SIGUSR1 is 0 (requeue scripts go by run.lock); an interactive
    Ctrl-C is 130, as for any command a shell sees interrupted. ``outcome``: rank 0's account (run_lock);
    ``summary``: the workers' records' account of a failure (faults.summarize), else ``failure``."""
    if outcome == "stopped":
        cause = "Ctrl-C" if status == INTERRUPTED else "signal"
        print(f"runner: stopped by {cause} after saving a checkpoint; rerun the same command to resume",
              file=sys.stderr)
        return INTERRUPTED if status == INTERRUPTED else 0
    if status == INTERRUPTED:
        print("runner: interrupted (Ctrl-C) before the workers had saved a checkpoint", file=sys.stderr)
        return INTERRUPTED
    if outcome == "done" or status == 0:
        if status != 0 and summary:
            print(f"runner: note: {summary}", file=sys.stderr)
        return 0
    print(f"runner: error: {summary or failure}", file=sys.stderr)
    return status if status > 0 else 1


def wait_for_workspace(workspace, fault_dir, patience_s=60.0):
    """Workers on other hosts are out of the Reaper's reach: wait (bounded) until the one holding the workspace
    lock has ended, so that the same command can be rerun at once. A worker of this run on this machine that is
    stopped (SIGSTOP, a debugger) would never end: it is ended at once (end_stopped_workers)."""
    end_stopped_workers(fault_dir)
    if not workspace:
        return
    deadline = time.monotonic() + patience_s
    holder = run_lock.holder(workspace)
    if holder is not None:
        print(f"runner: note: waiting for {run_lock.describe(holder)} to end and free {workspace}", file=sys.stderr)
    while holder is not None and time.monotonic() < deadline:
        time.sleep(0.5)
        holder = run_lock.holder(workspace)
    if holder is not None:
        print(f"runner: note: {run_lock.describe(holder)} still holds {workspace}; it ends when its collectives "
              "fail or --stall-timeout passes, or stop it by hand", file=sys.stderr)


def end_stopped_workers(fault_dir):
    """End (SIGKILL) every worker of this run on this machine that is stopped (SIGSTOP, a debugger), each with a
    note: it would never end, and would hold the workspace or, in an elastic run, keep Horovod's driver waiting for
    its state. This run's workers are those whose environment names its records' folder (RN50_FAULTS) and a
    launcher's rank, those reached over SSH to a name of this machine included. Returns their pids."""
    import psutil  # a dependency of Horovod's launcher
    ended = []
    for process in psutil.process_iter(["status"]):
        try:
            if process.info["status"] not in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
                continue
            environ = process.environ()
            if environ.get(faults.FAULTS_ENV) != fault_dir or world.launched_world(environ) is None:
                continue  # not this run's, or not a worker (runner's other children have the folder too)
            process.kill()
            process.wait(timeout=10)
        except (psutil.Error, OSError):
            continue  # gone, or not ours to read
        ended.append(process.pid)
        record = next((r for r in faults.read_all(fault_dir).values() if r.get("pid") == process.pid), None)
        who = faults.who(record) if record else f"pid {process.pid}"
        print(f"runner: note: ended {who}, a worker of this run that was stopped (SIGSTOP or a debugger)",
              file=sys.stderr)
    return ended


def worker_processes(mark="HOROVOD_RANK"):
    """This run's worker processes on this machine: horovodrun marks them with HOROVOD_RANK (its shells and
    ssh clients do not have it), mpirun with OMPI_COMM_WORLD_RANK."""
    import psutil  # a dependency of Horovod's launcher
    workers = []
    for process in psutil.Process().children(recursive=True):
        try:
            if mark in process.environ() and mark not in process.parent().environ():
                workers.append(process)
        except (psutil.Error, AttributeError):
            pass  # gone, or not ours to inspect
    return workers


def forward_stop_signals(forward):
    """SIGTERM and SIGUSR1 to runner ask the workers to save and stop (``forward(signum)``); returns a function
    that puts the previous handlers back."""
    previous = {sig: signal.signal(sig, lambda signum, frame: forward(signum)) for sig in (signal.SIGTERM,
                                                                                          signal.SIGUSR1)}
    return lambda: [signal.signal(sig, handler) for sig, handler in previous.items()]


REMOTE_RELAY_EVERY = 5  # seconds between the stop requests sent over SSH, while the run has not ended


class StopRelay:
    """Passes a stop request on to the workers as SIGTERM: those running now, and any that start later (a
    request during start-up would otherwise be lost). Signal handlers only set flags; a thread does the rest."""

    def __init__(self, remote=None):
        self.requested = threading.Event()
        self.done = threading.Event()
        self.signalled = set()
        self.interrupted = False  # a Ctrl-C (SIGINT) asked for the stop: runner ends with status 130
        self.remote = remote  # passes the request on to the workers on other hosts (horovodrun over SSH)

    def request(self):
        if not self.requested.is_set():
            self.requested.set()
            threading.Thread(target=self._relay, daemon=True).start()

    def _relay(self):
        tick = 0
        while not self.done.is_set():
            for worker in worker_processes():
                if worker.pid not in self.signalled:
                    try:
                        worker.send_signal(signal.SIGTERM)
                        self.signalled.add(worker.pid)
                    except Exception:  # gone meanwhile
                        pass
            if self.remote is not None and tick % REMOTE_RELAY_EVERY == 0:  # again for those starting meanwhile
                self.remote()
            tick += 1
            self.done.wait(1.0)

    def note(self):
        return " after a stop signal, before the workers had saved a checkpoint" if self.requested.is_set() else ""


class Reaper:
    """Keeps track of the run's workers on this machine (a thread looks every half second) and, once the launcher
    is done, ends any it left behind (a worker stopped by SIGSTOP, or stuck in the kernel, outlives horovodrun's
    teardown) and waits until they are gone: their workspace lock goes with them, so the same command can be
    rerun at once. Meanwhile, once a worker has found another stalled (a "stall" record in ``fault_dir``), it ends
    the stopped ones (end_stopped_workers): Horovod's elastic driver would wait for them for ever."""

    def __init__(self, fault_dir=None):
        self.seen = {}
        self.fault_dir = fault_dir
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self):
        while not self.done.is_set():
            for mark in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK"):
                for worker in worker_processes(mark):
                    self.seen.setdefault(worker.pid, worker)
            if self.fault_dir and any(r.get("kind") == "stall" for r in faults.read_all(self.fault_dir).values()):
                end_stopped_workers(self.fault_dir)
            self.done.wait(0.5)

    def finish(self, patience_s=10.0):
        """End the workers still running (SIGKILL, after ``patience_s`` for the launcher's own teardown); returns
        their pids."""
        import psutil
        if self.done.is_set():
            return []
        self.done.set()
        self.thread.join()
        alive = [p for p in self.seen.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        alive = psutil.wait_procs(alive, timeout=patience_s)[1] if alive else []
        for process in alive:
            try:
                process.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=patience_s)
        if alive:
            print(f"runner: note: ended {len(alive)} worker(s) the launcher left running (pid "
                  f"{', '.join(str(p.pid) for p in alive)})", file=sys.stderr)
        return [p.pid for p in alive]
