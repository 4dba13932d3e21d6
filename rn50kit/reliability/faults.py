"""What went wrong in a run, told in one line: each worker's record of itself, of its failure and of its
heartbeat, and runner's reading of them.

runner makes a folder and names it in RN50_FAULTS; every worker that can reach it (those on runner's machine, or
all of them where the folder is on a shared file system) keeps ``rank-R.json`` there: who it is (rank, host,
pid), where its main thread is (written every few seconds by the watchdog: its heartbeat), and its first
failure with a kind:
  "error"     the worker's own failure: an exception (its last line), a one-line error of train.py
  "stall"     the watchdog saw no progress for --stall-timeout seconds (naming the rank it found stalled)
  "teardown"  the collectives failed because another rank went away (Horovod shut down, Gloo lost a peer):
              noise after the real fault, which such a worker prints as one line instead of a traceback
runner then names the first real fault (see ``summarize``): the earliest error or stall, else the rank the
launcher saw die of a signal, else a rank its peers found silent. Only the standard library: runner imports this.
"""
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time

from rn50kit.reliability import world

FAULTS_ENV = "RN50_FAULTS"
# How a collective fails once another rank is gone: Horovod's shutdown, Gloo's and MPI's transport errors.
TEARDOWN_MARKS = ("Horovod has been shut down", "HorovodInternalError", "HorovodShutdown", "Connection reset by peer",
                  "Connection closed by peer", "Broken pipe", "Timed out waiting", "Read error", "Write error",
                  "MPI_ERR", "ncclRemoteError", "ncclSystemError")
TEARDOWN_EXIT = 1
SILENT_AFTER_S = 2.0  # a heartbeat older than this and than 3 of its periods: the rank is frozen or gone

_record = None  # this worker's record, once install() ran
_path = None


def is_teardown(text):
    return any(mark in text for mark in TEARDOWN_MARKS)


def first_line(error):
    """``ValueError: message``: the exception's type and the first line of its message (MXNet's errors carry
    their C++ stack trace below it)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if lines and lines[0].startswith("Traceback"):  # MXNet's C++ stack first, its message last
        lines = [line for line in lines if line.startswith(("MXNetError:", "Check failed"))] or lines[-1:]
    message = lines[0] if lines else ""
    name = type(error).__name__
    return message if message.startswith(name + ":") else f"{name}: {message}" if message else name


def install(rank, environ=os.environ):
    """Start this worker's record (when runner named a reachable folder) and catch its uncaught exceptions: a
    collective failing because another rank went away is one line and exit status 1, anything else is
    recorded (its traceback printed as usual)."""
    global _record, _path
    folder = environ.get(FAULTS_ENV)
    launched = world.launched_world(environ)
    _record = {"rank": rank, "host": host_name(environ.get("HOROVOD_HOSTNAME", "")), "pid": os.getpid(),
               "started": time.time()}
    if launched is not None and launched.local_rank is not None:  # the slot Horovod's elastic driver names it by
        _record["local_rank"] = launched.local_rank
    _path = os.path.join(folder, f"rank-{rank}.json") if folder and os.path.isdir(folder) else None
    _write()
    sys.excepthook = _excepthook


def host_name(name):
    """A worker's host as its record gives it: the name in runner's -H (horovodrun's HOROVOD_HOSTNAME), else, and
    for the local machine's names, the machine's own."""
    return name if name and name not in ("localhost", "127.0.0.1") else socket.gethostname()


def rank_in_slot(directory, host, local_rank):
    """The rank whose record is of the worker in slot ``local_rank`` of ``host`` (Horovod's elastic driver names
    a failed worker so: "localhost[0]"), or None where no record tells."""
    ranks = [rank for rank, record in read_all(directory).items()
             if record.get("host") == host_name(host) and record.get("local_rank") == local_rank]
    return ranks[0] if len(ranks) == 1 else None


def renumber(rank, size):
    """This worker's rank in a new elastic world of ``size``: its record moves to that rank's file (a worker's
    that left this world, or one that moved too, which its new owner writes); the records of ranks beyond the world
    are of workers gone from it, removed so that no one reads them as silent."""
    global _path
    if _record is None:
        return
    _record["rank"] = rank
    if _path is None:
        return
    folder = os.path.dirname(_path)
    _path = os.path.join(folder, f"rank-{rank}.json")
    _write()
    for name in os.listdir(folder):
        number = name[len("rank-"):-len(".json")] if name.startswith("rank-") and name.endswith(".json") else ""
        if number.isdigit() and int(number) >= size:
            try:
                os.unlink(os.path.join(folder, name))
            except OSError:
                pass


def _write():
    if _path is None:
        return
    tmp = f"{_path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(_record, f)
        os.replace(tmp, _path)
    except OSError:
        pass  # the report is a courtesy: never let it fail the run


def record_failure(line, kind="error", **extra):
    """Keep this worker's first failure (later ones are consequences)."""
    if _record is None or "failure" in _record:
        return
    _record.update(failure=line, kind=kind, failed=time.time(), **extra)
    _write()


def fail(prog, message, status=2, configuration=False):
    """``prog: error: message`` (cli.fail's line), recorded, then the end of this process (see ``end``)."""
    announce(prog, message, configuration)
    end(status)


WORKER_ERROR = "train.py: error: "  # how a worker's own one-line error begins (announce's line, prog train.py)


def worker_error(line):
    """The message of a worker's own one-line error ``line`` (its stderr, as a launcher relays it), or None."""
    return line[len(WORKER_ERROR):].strip() if line.startswith(WORKER_ERROR) else None


def told_failure(rank, message):
    """What a launcher knows of ``rank`` from its error line, for summarize's ``known``: the failure its record
    would hold, used only where the record has none (it could not be written: a full disk)."""
    return {"rank": rank, "kind": "error", "failure": message, "failed": time.time()}


def announce(prog, message, configuration=False):
    """``prog: error: message`` (cli.fail's line) on stderr, and recorded for runner; ``configuration``: a refusal
    of the run's configuration at start-up (the same command would fail again, so runner advises no rerun)."""
    record_failure(message, **({"configuration": True} if configuration else {}))
    _say(f"{prog}: error: {message}")


def end(status):
    """Exit with ``status``: a worker among several at once, as its exit would wait in Horovod's and MXNet's
    shutdown for ranks that wait for it."""
    if _is_worker():
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        os._exit(status)
    sys.exit(status)


def heartbeat(**fields):
    """The watchdog's periodic note: this worker is alive, and where its main thread is."""
    if _record is None:
        return
    _record.update(alive=time.time(), **fields)
    _write()


def _is_worker():
    """One of a launcher's workers (horovodrun, mpirun, srun), not a process run by hand."""
    return _path is not None or world.launched_world(os.environ) is not None


def _say(line):
    """A line on stderr, which may be gone with the launcher (an SSH session cut)."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _excepthook(kind, error, traceback):
    worker = _is_worker()
    try:
        line = first_line(error)
        if is_teardown(line) and not isinstance(error, KeyboardInterrupt):
            silent = silent_ranks(exclude=_record["rank"])
            record_failure(line, "teardown", silent=silent)
            who = f"rank(s) {', '.join(str(r['rank']) for r in silent)} silent" if silent else "another rank failed"
            _say(f"train.py: rank {_record['rank']}: stopped, as the collectives failed ({who}): {line[:200]}")
            worker = True  # no atexit: MXNet's and Horovod's shutdown would only repeat the error, or hang
        else:
            record_failure(line, "error")
            sys.__excepthook__(kind, error, traceback)
    except BaseException:  # noqa: B036  the hook must reach its end (a broken stderr, an interrupt)
        pass
    finally:
        if worker:
            # Horovod's and MXNet's shutdown at exit can wait for ranks that wait for this one, or crash and hang
            # (MXNotifyShutdown): end now (the kernel frees the workspace lock), so the launcher sees this rank
            # fail and stops the others at once.
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            os._exit(TEARDOWN_EXIT)


# --- reading the records (watchdog and runner) -----------------------------------------------------------------

def read_all(directory):
    """Every worker's record in ``directory``, by rank."""
    records = {}
    if not directory or not os.path.isdir(directory):
        return records
    for name in os.listdir(directory):
        if name.startswith("rank-") and name.endswith(".json"):
            try:
                with open(os.path.join(directory, name)) as f:
                    record = json.load(f)
                records[int(record["rank"])] = record
            except (OSError, ValueError, KeyError, TypeError):
                pass
    return records


def directory():
    """The folder of the records this worker writes into, or None."""
    return os.path.dirname(_path) if _path else None


def silent_ranks(exclude=None, now=None, folder=None):
    """Records of the ranks whose heartbeat stopped (frozen, stopped, or gone with their machine)."""
    folder = folder or directory()
    now = time.time() if now is None else now
    silent = []
    for rank, record in sorted(read_all(folder).items()):
        period = record.get("period", 5.0)
        if rank != exclude and "alive" in record and "failure" not in record and \
                now - record["alive"] > max(SILENT_AFTER_S, 3 * period):
            silent.append(dict(record, silent_for=now - record["alive"]))
    return silent


def who(record):
    return f"rank {record['rank']} (host {record.get('host', '?')}, pid {record.get('pid', '?')})"


# The signals a process dies of when its own code fails (train.py's faulthandler prints every thread's stack).
CRASHES = {"SIGSEGV": "a segmentation fault", "SIGBUS": "a bus error", "SIGABRT": "aborted",
           "SIGFPE": "an arithmetic fault", "SIGILL": "an illegal instruction"}


def signal_name(status):
    """SIGKILL for an exit status 137 (128 + 9, the shell's way) or -9 (Python's), else None."""
    number = -status if status < 0 else status - 128 if status > 128 else None
    try:
        return signal.Signals(number).name if number else None
    except ValueError:
        return None


RESUME = "rerun the same command to resume from the last complete checkpoint"
RESTART = "rerun the same command to start again (no checkpoint was saved)"


def summarize(directory, first_failed=None, known=None, ended="every worker has ended", resumable=True, advice=None):
    """runner's one line on a failed run, or None when the records say nothing. ``first_failed``: (rank, exit
    status) of the first worker the launcher saw end badly, when it tells; ``known``: what the launcher knows of
    that worker (its host as named in -H, its pid, a crash its output told), over its record or for want of one
    (it died before writing it); ``ended``: what became of the others; ``resumable``: whether a complete
    checkpoint exists to resume from (the advice says so only then, and never after a refusal of the
    configuration); ``advice``: instead of that advice (a run that ended well all the same)."""
    advice = advice or (RESUME if resumable else RESTART)
    records = read_all(directory)
    if known is not None:  # a failure the launcher saw (its error line) only for want of the worker's own record
        record = records.get(known["rank"], {})
        told = {k: v for k, v in known.items() if "kind" not in record or k not in ("kind", "failure", "failed")}
        records[known["rank"]] = dict(record, **told)
    faults = sorted((r for r in records.values() if r.get("kind") in ("error", "stall")), key=lambda r: r["failed"])
    if faults:
        fault = faults[0]
        if fault["kind"] == "stall":
            return f"{fault['failure']}; {ended}; {advice}"
        if fault.get("configuration"):
            return f"{who(fault)} failed: {fault['failure']} (its message is above); {ended}; fix it, then rerun"
        return (f"{who(fault)} failed: {fault['failure']} (its message is above); {ended}; fix the cause, then "
                "rerun" + (" (the same command resumes from the last complete checkpoint)" if resumable else ""))
    if first_failed is not None:
        rank, status = first_failed
        record = records.get(rank, {"rank": rank})
        name = signal_name(status) or record.get("crash")  # a crash its output told (ssh's status is 255)
        if name in CRASHES:
            return (f"{who(record)} crashed ({name}, {CRASHES[name]}; exit status {status}): its Python stack is "
                    f"above (\"Fatal Python error\"); {ended}; {advice}")
        if name and record.get("kind") != "teardown":
            return (f"{who(record)} was killed by {name} (exit status {status}): by hand, by the OOM killer (see "
                    f"`dmesg` on its host) or by the batch system; {ended}; {advice}")
    silent = [s for r in records.values() if r.get("kind") == "teardown" for s in r.get("silent", [])]
    if silent:
        first = min(silent, key=lambda s: s["alive"])
        return (f"{who(first)} stalled: no heartbeat for {first['silent_for']:.0f} s (stopped, frozen, or its "
                f"machine lost) and the others' collectives timed out; {ended}; {advice}")
    if first_failed is not None:
        rank, status = first_failed
        lost = (" (ssh's: the connection to its host ended: the host or the network lost, or the worker killed)"
                if status == 255 else "")
        return (f"{who(records.get(rank, {'rank': rank}))} exited with status {status}{lost}; its message is above; "
                f"{advice}")
    return None


# --- under srun: every task its own runner, one line for the step ----------------------------------------------

REPORTED = "reported"  # made by the one task that reports the step's failure
STEP_PREFIX = ".rn50-faults-"
REMOVED_SUFFIX = ".removed"  # a step's folder renamed so before its removal: a task killed part-way leaves this name
STALE_S = 3600.0  # a step's folder untouched this long (no heartbeat, no record) is left from a killed step


def step_directory(workspace, environ=os.environ):
    """The records' folder every task of this srun step shares: in the workspace when given (on several nodes the
    workspace is on a shared file system, as the checkpoints need), else in this node's temporary folder. Named
    by job, step and requeue count, so a requeued job's step starts afresh."""
    name = STEP_PREFIX + ".".join(environ.get(key, "0") for key in ("SLURM_JOB_ID", "SLURM_STEP_ID",
                                                                    "SLURM_RESTART_COUNT"))
    return os.path.join(os.path.abspath(workspace) if workspace else tempfile.gettempdir(), name)


def remove_stale_steps(directory, now=None):
    """Remove the folders beside ``directory`` left by earlier steps: one whose failure was reported (the task
    that reported it was killed with the step before it could remove it), or untouched for an hour."""
    now = time.time() if now is None else now
    parent = os.path.dirname(directory)
    try:
        names = [n for n in os.listdir(parent) if n.startswith(STEP_PREFIX)]
    except OSError:
        return
    for name in names:
        path = os.path.join(parent, name)
        try:
            if path != directory and (name.endswith(REMOVED_SUFFIX) or reported(path) or
                                      now - os.stat(path).st_mtime > STALE_S):
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass


def remove_step(directory):
    """Remove a step's folder: renamed first (one atomic step), so that a task killed part-way through the removal
    (srun ends a failed step's tasks at once) leaves a folder the next step's rank 0 knows to remove, never one
    that looks like a live step's."""
    doomed = f"{directory}.{os.getpid()}{REMOVED_SUFFIX}"
    try:
        os.rename(directory, doomed)
    except OSError:
        return  # gone already: another task removed it
    shutil.rmtree(doomed, ignore_errors=True)


def leave_step(directory, rank):
    """A task whose worker ended well: its worker's files out of the step's folder (a record being rewritten when
    the worker exited leaves its temporary file), and the folder removed by the last task to leave it."""
    for name in os.listdir(directory) if os.path.isdir(directory) else []:
        if name == f"rank-{rank}.json" or name.startswith(f"rank-{rank}.json."):
            try:
                os.remove(os.path.join(directory, name))
            except OSError:
                pass
    try:
        os.rmdir(directory)
    except OSError:
        pass  # another task's worker is still running or its task has not left yet


def claim_report(directory):
    """Whether this task is the first of the step to report a failure (the folder gone: another reported it)."""
    try:
        os.close(os.open(os.path.join(directory, REPORTED), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except OSError:
        return False


def reported(directory):
    return not os.path.isdir(directory) or os.path.exists(os.path.join(directory, REPORTED))
