"""--launcher horovod (the default): horovodrun on Gloo, run inside runner's process, fixed or elastic.

horovodrun's launcher runs in this process, so that a failed worker ends the run with one line (the worker's own
message is above it) rather than the launcher's traceback.

A SIGTERM/SIGUSR1 to runner goes on to the workers, which save at the next step boundary and exit 0. Horovod's own
answer (terminate the workers, kill them 5 seconds later) would lose that checkpoint whenever a step and the save
take longer, so it is kept for SIGINT (Ctrl-C) only."""
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

from rn50kit.config.cli import UsageError
from rn50kit.launch import horovod_build, supervision
from rn50kit.launch.launchers import elastic
from rn50kit.launch.launchers.base import Launcher
from rn50kit.reliability import faults


class Horovodrun(Launcher):
    name = "horovod"
    help = "horovodrun"
    elastic = True

    def env(self, args):
        return {}  # horovodrun takes --network-interface as a flag: it sets Open MPI's and NCCL's variables itself

    def prefix(self, args, env):
        if args.kv_store != "horovod":
            return []  # one process drives every GPU
        hosts = ["--hostfile", str(args.hostfile)] if args.hostfile else \
            ["-H", args.hosts or f"localhost:{args.ngpus}"]
        nics = ["--network-interfaces", args.network_interface] if args.network_interface else []
        if elastic.is_elastic(args):
            hosts = elastic.elastic_flags(args)
        return [horovodrun(), "-np", str(args.ngpus), *hosts, *nics, "--gloo"]

    def start(self, args, command):
        if elastic.is_elastic(args):
            elastic.drop_elastic_unsafe_env(os.environ)
        return run_horovodrun(command[1:])


def horovodrun_path():
    """horovodrun beside this Python (a venv's bin need not be on PATH), else from PATH, else None."""
    beside = Path(sys.executable).parent / "horovodrun"
    return str(beside) if beside.is_file() else shutil.which("horovodrun")


def horovodrun():
    found = horovodrun_path()
    if found is None:
        raise UsageError("horovodrun is not installed; run `make setup` (it builds Horovod into .venv)")
    return found


def run_horovodrun(arguments):
    """horovodrun's command line ``arguments`` run to their end in this process: a supervision.Ended."""
    from horovod.runner import gloo_run
    from horovod.runner import launch as horovod_launch
    from horovod.runner.common.util.timeout import TimeoutException
    build = horovod_build.horovod_build()
    if build is not None:  # horovodrun's own check of --gloo, answered without importing MXNet
        horovod_launch.gloo_built = lambda verbose=False: build["gloo"]
    stop = supervision.StopRelay(remote=lambda: stop_remote_workers(remote_hosts(arguments)))
    gloo_run.register_shutdown_event = shutdown_on_second_interrupt(stop)
    drivers = elastic.record_elastic_drivers(gloo_run)
    restore = supervision.forward_stop_signals(lambda signum: stop.request())
    sys.argv = ["horovodrun", *arguments]
    logs = DriverLogs("--min-np" in arguments)
    crashes = sys.stderr = CrashWatch(sys.stderr)  # Horovod forwards the workers' output to sys.stderr
    try:
        horovod_launch.run_commandline()
    except RuntimeError as error:  # "Horovod detected that one or more processes exited with non-zero status"
        if logs.driver.ended:
            return supervision.Ended(1, logs.driver.ended, driver_ended=True)
        return failed_run(error, stop, crashes.seen, crashes.said)
    except TimeoutException as error:  # the elastic driver's wait for the first slots (gloo_run.py)
        for driver in drivers:  # its discovery thread would go on running the script while runner ends
            driver.stop(str(error))
        return supervision.Ended(1, f"horovodrun: {elastic.elastic_start_timeout(error)}")
    except KeyboardInterrupt:
        return supervision.Ended(supervision.INTERRUPTED, "interrupted")
    finally:
        sys.stderr = crashes.stream
        stop.done.set()
        restore()
        logs.remove()
    return supervision.Ended(supervision.INTERRUPTED, "interrupted") if stop.interrupted else supervision.Ended(0)


def remote_hosts(arguments):
    """The hosts of horovodrun's -H/--hostfile that it reaches over SSH: those whose address is not this machine's,
    as Horovod decides it (gloo_run's _exec_command_fn); none for an elastic run (its hosts are discovered)."""
    from horovod.runner.common.util import hosts
    from horovod.runner.util import network
    if "-H" in arguments:
        spec = arguments[arguments.index("-H") + 1]
    elif "--hostfile" in arguments:
        spec = hosts.parse_host_files(arguments[arguments.index("--hostfile") + 1])
    else:
        return []
    local = network.get_local_host_addresses()
    return [h.hostname for h in hosts.parse_hosts(spec) if network.resolve_host_address(h.hostname) not in local]


# On a host reached over SSH: SIGTERM to this run's workers there, found by their environment (the run's records'
# folder and a Horovod rank: not the ssh clients or shells, which have no rank).
REMOTE_STOP = ("for e in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $e 2>/dev/null | grep -qxF {mark} || continue; "
               "tr '\\0' '\\n' < $e | grep -q ^HOROVOD_RANK= || continue; p=${{e#/proc/}}; kill -TERM ${{p%/environ}}; "
               "done 2>/dev/null; true")


def stop_remote_workers(hosts_over_ssh):
    """A stop request for workers that runner's signals cannot reach (horovodrun's workers on other hosts; ssh
    passes no signal on): SIGTERM sent to them over SSH, as horovodrun reaches them, one host at a time. Any one
    rank's stop is every rank's (the loop agrees on it), so a host that cannot be reached only costs its wait."""
    mark = f"{faults.FAULTS_ENV}={os.environ.get(faults.FAULTS_ENV, '')}"
    for host in hosts_over_ssh:
        try:
            subprocess.run(["ssh", "-o", "PasswordAuthentication=no", "-o", "StrictHostKeyChecking=no", "-o",
                            "ConnectTimeout=10", host, REMOTE_STOP.format(mark=shlex.quote(mark))],
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            pass


def shutdown_on_second_interrupt(stop):
    """horovodrun's hook for the event that makes it terminate the workers: a Ctrl-C asks them to save and stop
    as SIGTERM does (``stop``, a supervision.StopRelay), a second one sets the event (at once)."""
    shutdown = threading.Event()

    def interrupt(signum, frame):
        if stop.interrupted:
            shutdown.set()
        stop.interrupted = True
        stop.request()

    def register_shutdown_event():
        signal.signal(signal.SIGINT, interrupt)
        return shutdown
    return register_shutdown_event


class DriverLogs:
    """The root logger while horovodrun runs: the elastic driver's lines without tracebacks (elastic.
    ElasticDriverLog) and, for an elastic run, its progress (Horovod logs it at INFO)."""

    def __init__(self, elastic_run):
        self.driver, self.progress = elastic.ElasticDriverLog(), elastic.ElasticProgress()
        self.level = logging.getLogger().level
        logging.getLogger().addFilter(self.driver)
        if elastic_run:
            logging.getLogger().addHandler(self.progress)
            logging.getLogger().setLevel(logging.INFO)

    def remove(self):
        logging.getLogger().removeFilter(self.driver)
        logging.getLogger().removeHandler(self.progress)
        logging.getLogger().setLevel(self.level)


# faulthandler's first line (train.py enables it) for each signal a native crash is, by the signal's name
CRASH_LINES = {"Segmentation fault": "SIGSEGV", "Bus error": "SIGBUS", "Floating point exception": "SIGFPE",
               "Aborted": "SIGABRT", "Illegal instruction": "SIGILL"}
CRASH_LINE = re.compile(r"\[(\d+)\]<stderr>:Fatal Python error: (" + "|".join(CRASH_LINES) + ")")
# The shell a worker runs in (Horovod runs each through /bin/sh, over SSH the login shell) says "Killed" when a
# SIGKILL ended it: dash's line, or bash's "bash: line 1: 1234 Killed    python ...".
KILLED_LINE = re.compile(r"\[(\d+)\]<stderr>:(?:\S+: line \d+: +\d+ +)?Killed\b")
# A worker's own one-line error (faults.WORKER_ERROR), kept for one whose record could not be written (a full disk)
ERROR_LINE = re.compile(r"\[(\d+)\]<stderr>:(" + re.escape(faults.WORKER_ERROR) + ".*)")


class CrashWatch:
    """sys.stderr while horovodrun forwards the workers' lines ("[rank]<stderr>:..."): passes each on and keeps
    which rank's faulthandler reported a native crash, or its shell a SIGKILL (``seen``: rank -> signal name).
    Over SSH a worker's status is ssh's 255 whatever ended it; the last words of the worker or its shell tell a
    crash or a kill from a lost connection."""

    def __init__(self, stream):
        self.stream, self.seen, self.said = stream, {}, {}  # said: rank -> its train.py error line

    def write(self, text):
        found, killed, said = CRASH_LINE.search(text), KILLED_LINE.search(text), ERROR_LINE.search(text)
        if found:
            self.seen.setdefault(int(found.group(1)), CRASH_LINES[found.group(2)])
        elif killed:
            self.seen.setdefault(int(killed.group(1)), "SIGKILL")
        elif said:
            self.said.setdefault(int(said.group(1)), faults.worker_error(said.group(2)))
        return self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def failed_run(error, stop, crashes=None, said=None):
    """horovodrun's RuntimeError as a supervision.Ended: the first worker to fail (its rank, or under the elastic
    driver its host[slot]) and its status (``crashes``, CrashWatch.seen: its crash or kill, where its output or
    its shell told one; ``said``, CrashWatch.said: its error line, for a worker whose record could not be written),
    or horovodrun's refusal before it started any (its reason per host is printed above)."""
    codes = re.findall(r"Exit code: (-?\d+)", str(error))
    if not codes:
        return supervision.Ended(1, f"horovodrun: {horovodrun_refusal(error)}")
    workers = re.findall(r"Process name: (\S+)", str(error))
    first = (int(workers[0]), int(codes[0])) if workers and workers[0].isdigit() else None  # rank, status
    if first and faults.signal_name(first[1]) is None and first[0] not in (crashes or {}) and crashes:
        # Horovod names the first worker whose end it timed: a peer's plain exit (its collectives failed) may come
        # before the end of a worker killed or crashed, which its output told: that one is the cause
        rank = min(crashes)
        first = (rank, 128 + signal.Signals[crashes[rank]].value)  # as its shell reports it
    slot = re.fullmatch(r"(.+)\[(\d+)\]", workers[0]) if workers else None  # the elastic driver's host[slot]
    crash = (crashes or {}).get(first[0]) if first else None
    line = (said or {}).get(first[0]) if first else None
    known = {"rank": first[0], "crash": crash} if crash else faults.told_failure(first[0], line) if line else None
    return supervision.Ended(int(codes[0]), f"worker {workers[0] if workers else '?'} exited with status {codes[0]}"
                                            f"{stop.note()}; its message is above", first, known=known,
                             slot=(slot.group(1), int(slot.group(2))) if slot else None, crashes=dict(crashes or {}))


def horovodrun_refusal(error):
    """One line for a horovodrun failure before any worker started, with what to do where it is known."""
    message = " ".join(str(error).split())
    if "via ssh" in message:
        return (f"{message}: each host in -H/--hostfile must accept `ssh HOST true` without a password from this "
                "machine (docs/multi-node.md), or use --launcher mpi")
    return message


HOROVODRUN = Horovodrun()
