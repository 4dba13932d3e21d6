"""--launcher mpi: Open MPI's mpirun as runner's child, its stderr relayed (and read for the first worker to die of
a signal).

A SIGTERM/SIGUSR1 to runner goes on as SIGUSR1, which Open MPI's mpirun forwards to every process and then waits
for them; a SIGTERM to mpirun itself makes it end the job, with a grace for the workers' save (MPIRUN_GRACE_ENV)."""
import os
import re
import shutil
import signal
import subprocess
import sys
import threading

from rn50kit.config.cli import UsageError
from rn50kit.launch import supervision
from rn50kit.launch.launchers import base
from rn50kit.reliability import faults, run_lock, world

# Open MPI's mpirun refuses to start as root without both (CI and containers run as root).
MPIRUN_ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
# mpirun signalled itself (scancel, a preemption, a time limit: SIGTERM to every process; a Ctrl-C) sends its workers
# SIGTERM and kills them this many seconds later: Open MPI's 1 s comes before a worker reaches a step boundary and
# saves (the fault campaign, seed 100032). The cost: mpirun ending a job whose workers did not end by themselves (a
# worker failed) waits twice as long. A value in the caller's environment wins (environment.build_env).
MPIRUN_GRACE_ENV = {"OMPI_MCA_odls_base_sigkill_timeout": "10"}
# What mpirun passes on to every worker, remote ones included: runner's variables, and these when set.
MPIRUN_EXPORTS = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH")
MPIRUN_EXPORT_PREFIXES = ("HOROVOD_", "NCCL_", "MXNET_", "OMP_", "DALI_", "CUDA_VISIBLE_DEVICES")
# Open MPI's own diagnosis of the first worker to die of a signal (its stderr, before it ends the others), naming
# its host as -H does (the worker's own host name may differ: a short name, an alias)
MPIRUN_SIGNALLED = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")
# ... and of the first worker to exit with a non-zero status ("Process name: [[13296,1],0]", then "Exit code:    2")
MPIRUN_EXITED = re.compile(r"Process name: \[\[\d+,\d+\],(\d+)\]")
MPIRUN_EXIT_CODE = re.compile(r"^\s*Exit code:\s+(\d+)")


class Mpirun(base.Launcher):
    name = "mpi"
    help = "mpirun"

    def check(self, args, environ):
        if shutil.which("mpirun") is None:
            raise UsageError(f"--launcher mpi: mpirun is not installed; {world.MPI_ADVICE}, or use --launcher "
                             "horovod")
        base.require_horovod_mpi(self.name)

    def env(self, args):
        return {**(MPIRUN_ROOT_ENV if os.geteuid() == 0 else {}), **MPIRUN_GRACE_ENV, **super().env(args)}

    def prefix(self, args, env):
        if args.kv_store != "horovod":
            return []  # one process drives every GPU
        mpirun = shutil.which("mpirun")
        if mpirun is None:
            raise UsageError("mpirun is not installed; install Open MPI and build Horovod with MPI "
                             "(HOROVOD_WITH_MPI=1), or use --launcher horovod")
        hosts = ["-hostfile", str(args.hostfile)] if args.hostfile else ["-H", args.hosts or f"localhost:{args.ngpus}"]
        # run_lock.OUTCOME_ENV and faults.FAULTS_ENV are set just before mpirun starts (supervision.supervise)
        exported = [x for key in mpirun_exports(env, os.environ) + [run_lock.OUTCOME_ENV, faults.FAULTS_ENV]
                    for x in ("-x", key)]
        return [mpirun, "-np", str(args.ngpus), *hosts, "-bind-to", "none", "-map-by", "slot", *exported]

    def start(self, args, command):
        return run_mpirun(command)


def mpirun_exports(env, environ):
    """Variables for mpirun to pass on: runner's own (env) and those of the caller's that workers read. Only
    variables that will be set: mpirun warns about each one that is not."""
    names = [key for key in env if key not in MPIRUN_ROOT_ENV]
    names += [key for key in environ if key in MPIRUN_EXPORTS or key.startswith(MPIRUN_EXPORT_PREFIXES)]
    return list(dict.fromkeys(names))


def relay_stderr(stream, found, seen):
    """Copy mpirun's stderr to ours line by line, noting in ``found`` (a list) the (rank, 128 + signal, host) of
    the first worker it says died of a signal, and in ``seen`` (a dict) the first worker it says exited non-zero
    ("rank", "status") and the workers' own error lines ("said")."""
    for line in stream:
        sys.stderr.write(line)
        sys.stderr.flush()
        match, exited, code = MPIRUN_SIGNALLED.search(line), MPIRUN_EXITED.search(line), MPIRUN_EXIT_CODE.match(line)
        if match and not found:
            found.append((int(match[1]), 128 + int(match[3]), match[2]))
        elif exited and "rank" not in seen:
            seen["rank"] = int(exited[1])
        elif code and "rank" in seen and "status" not in seen:
            seen["status"] = int(code[1])
        elif (said := faults.worker_error(line)) is not None:
            seen.setdefault("said", []).append(said)


def run_mpirun(command):
    """mpirun as a child, to its end: a supervision.Ended naming the first worker that died of a signal, and its
    host, when mpirun says."""
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, errors="replace", bufsize=1)
    found, seen = [], {}
    relay = threading.Thread(target=relay_stderr, args=(process.stderr, found, seen), daemon=True)
    relay.start()
    restore = supervision.forward_stop_signals(lambda signum: process.send_signal(signal.SIGUSR1))
    try:
        status = process.wait()
    except KeyboardInterrupt:  # mpirun got the Ctrl-C too (same terminal) and forwards it to the workers
        process.wait()
        return supervision.Ended(supervision.INTERRUPTED, "interrupted")
    finally:
        restore()
        # mpirun's own lines are read by now; a worker it left behind (stopped) may hold the pipe open until the
        # Reaper ends it, so the relay goes on as a daemon after this wait
        relay.join(timeout=5)
    failure = f"mpirun exited with status {status}; the workers' messages are above"
    if found:
        rank, signalled, host = found[0]
        return supervision.Ended(status, failure, (rank, signalled), {"rank": rank, "host": host})
    return exited_run(status, failure, seen)


def exited_run(status, failure, seen):
    """mpirun's run whose first failed worker exited (no signal): that rank and status, and its own error line
    where it was the one such line (its record may be unwritable: a full disk; the fault campaign, seed 200033)."""
    if "rank" not in seen or "status" not in seen:
        return supervision.Ended(status, failure)
    said = seen.get("said", [])
    known = faults.told_failure(seen["rank"], said[0]) if len(said) == 1 else None
    return supervision.Ended(status, failure, (seen["rank"], seen["status"]), known)


MPIRUN = Mpirun()
