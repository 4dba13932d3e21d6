"""--launcher slurm: srun has already started one runner per worker (an srun step); each becomes one task whose
worker is its child.

Nothing oversees an srun step's workers, and when one dies srun ends the others at once (Slurm's PMIx plugin
cancels the step when a worker leaves without MPI_Finalize): staying alive as their parent, each task's runner sees
its own worker's end, and the first task to see a failure reads every worker's record (faults.step_directory,
shared by the step's tasks) and prints the one line naming the rank, its host and the cause, before srun's own
lines about the tasks."""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from rn50kit.config.cli import UsageError
from rn50kit.launch import supervision
from rn50kit.launch.launchers import base
from rn50kit.reliability import faults

# A task whose worker ended only because the collectives failed (another rank is the cause) leaves the step's
# report this long to that rank's task.
TEARDOWN_GRACE_S = 3.0


class Srun(base.Launcher):
    name = "slurm"
    help = "none (srun has already started one process per worker)"
    places_workers = True

    def check(self, args, environ):
        base.require_horovod_mpi(self.name)
        use_srun_step(args, environ)

    def workers_on_this_node(self, args, environ):
        if hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) < (os.cpu_count() or 1):
            return 1  # Slurm bound this task to its own cores (task/affinity, task/cgroup): they are its share
        return slurm_tasks_on_this_node(environ) or args.ngpus

    def supervises(self, args):
        return False  # each task's runner watches its own worker (run_alone)

    def run_alone(self, command, workspace):
        run_srun_task(command, workspace)


def use_srun_step(args, environ):
    """Under --launcher slurm, srun has started one runner per worker: take the world's size from it."""
    tasks = environ.get("SLURM_STEP_NUM_TASKS", "")
    if not tasks.isdigit():
        raise UsageError("--launcher slurm runs inside an srun step, one runner per worker, e.g. "
                         "`srun -n 8 ./runner --launcher slurm ...` in an sbatch script or a salloc shell")
    if args.ngpus not in (1, int(tasks)):  # 1 is the default: -n was not given
        raise UsageError(f"-n {args.ngpus} but srun started {tasks} tasks; leave -n out under --launcher slurm")
    args.ngpus = int(tasks)
    mpi_type = environ.get("SLURM_MPI_TYPE", "none")
    # Open MPI joins srun's tasks through PMIx only (with pmi2 or none its MPI_Init aborts, checked with 4.1.4).
    if mpi_type == "none" or (not mpi_type.startswith("pmix") and shutil.which("ompi_info")):
        raise UsageError(f"srun started the tasks with --mpi={mpi_type}, through which MPI cannot join them; "
                         "run `srun --mpi=pmix ...` (`srun --mpi=list` shows what this Slurm offers)")


def slurm_tasks_on_this_node(environ):
    """Tasks of this srun step on this task's node: SLURM_STEP_TASKS_PER_NODE ("2(x3),1") at SLURM_NODEID."""
    counts = []
    for part in environ.get("SLURM_STEP_TASKS_PER_NODE", "").split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            return None
        counts += [int(match[1])] * int(match[2] or 1)
    node = environ.get("SLURM_NODEID", "0")
    return counts[int(node)] if node.isdigit() and int(node) < len(counts) else None


def run_srun_task(command, workspace):
    """One srun task: its worker as a child, then exit as the worker did (0 after a stop that saved a checkpoint;
    killed by the same signal), so srun and the batch system see what they saw of the worker."""
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    folder = step_records(workspace, rank)
    # Slurm signals every process of a task, the worker too: a Ctrl-C on srun must not reach it twice (a second
    # one stops at once, unsaved). A SIGTERM/SIGUSR1 sent to this task's process alone goes on to the worker.
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    worker = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, errors="replace", bufsize=1)
    said = []  # the worker's own error line, should its record be unwritable (a full disk where the records are)
    relay = threading.Thread(target=relay_stderr, args=(worker.stderr, said), daemon=True)
    relay.start()
    restore = supervision.forward_stop_signals(lambda signum: worker.send_signal(signum))
    status = worker.wait()
    relay.join(timeout=2.0)
    # srun ends the step's tasks as soon as one worker fails: its SIGTERM waits until the line is out and the
    # records removed (Slurm's KillWait, 30 s by default, before SIGKILL), then ends this task as before.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    restore()
    if status != 0 and folder is not None:
        report_step_failure(folder, rank, status, worker.pid, said[-1] if said else None)
    elif folder is not None:
        faults.leave_step(folder, rank)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    if status < 0:  # killed by a signal: end the same way
        if -status in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):  # this process's handlers: the default back
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    sys.exit(status if status >= 0 else 128 - status)


def step_records(workspace, rank):
    """The folder of the step's records (faults.step_directory), named to this task's worker; None where it cannot
    be made (the worker then runs without a record: a read-only workspace is train.py's to report)."""
    folder = faults.step_directory(workspace)
    try:
        os.makedirs(folder, exist_ok=True)
        if rank == 0:
            faults.remove_stale_steps(folder)
        os.environ[faults.FAULTS_ENV] = folder
    except OSError:
        return None
    return folder


def relay_stderr(stream, said):
    """Copy the worker's stderr to ours line by line, keeping in ``said`` its own one-line errors."""
    for line in stream:
        sys.stderr.write(line)
        sys.stderr.flush()
        if (message := faults.worker_error(line)) is not None:
            said.append(message)


def report_step_failure(folder, rank, status, pid, said=None):
    """The step's one line on a failure, printed by the first task to see one: the task of the worker that died
    (a signal) or recorded the cause (its error, or the stall its watchdog saw; ``said``: its error line, where
    its record could not be written); a task whose worker only saw the collectives fail waits a little for that
    one's line first."""
    own = faults.read_all(folder).get(rank, {})
    known = {"rank": rank, "host": socket.gethostname(), "pid": pid}
    if said and own.get("kind") not in ("error", "stall"):  # srun may end this task at once: no record to wait for
        own = known = dict(known, **faults.told_failure(rank, said))
    if status > 0 and own.get("kind") not in ("error", "stall"):
        deadline = time.monotonic() + TEARDOWN_GRACE_S
        while not faults.reported(folder) and time.monotonic() < deadline:
            time.sleep(0.1)
    if not faults.claim_report(folder):
        return
    summary = faults.summarize(folder, (rank, status if status > 0 else 128 - status), known=known,
                               ended="srun ends the step's other tasks")
    print(f"runner: error: {summary}", file=sys.stderr, flush=True)
    faults.remove_step(folder)


SRUN = Srun()
