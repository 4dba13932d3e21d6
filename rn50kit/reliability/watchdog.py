"""A stalled run ends instead of waiting for ever: a thread in each worker watches its main thread.

When one rank stops (SIGSTOP, a hung file system, a GPU fault, a lost machine) the others wait in their next
collective, using no CPU, for ever under MPI (under horovodrun, Gloo gives up after HOROVOD_GLOO_TIMEOUT_SECONDS,
30 by default, for a rank that is frozen, not for one that is alive but stuck). Horovod's own stall check does not
end that: it runs in rank 0's background thread (horovod/common/controller.cc, v0.28.1), which a frozen rank
blocks in the same communication, and its shutdown (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS) is off by default.

Progress here is the main thread's CPU time: it grows with every step (the loop's Python work between the
engine's waits) and stands still while the thread waits in a collective or in the kernel. When it has not grown
for --stall-timeout seconds, the worker looks at the others' heartbeats (faults.py) to name the rank that stalled,
prints one line, records it for runner, and exits with status 124 (no clean-up: the kernel frees its workspace
lock). Every waiting rank does the same; the launcher then ends the stalled one.

The same thread notices when the worker's launcher is gone (its parent process changed: an SSH session cut, a
launcher killed outright) and asks for a stop, as SIGTERM does: save at the next step boundary and end.
"""
import os
import signal
import sys
import threading
import time

import rn50kit
from rn50kit.reliability import faults, world

ELASTIC_RESET = "ElasticTraining._reset_horovod"  # the frame of an elastic run's hvd.shutdown()/hvd.init()
STALL_EXIT = 124


def where(frame):
    """(the innermost frames of the kit, 'fit.py:203 Distributed.sum < fit.py:520 StopFlag.vote', and how the
    thread waits: "collective" (in Horovod, or the kit's Distributed), "engine" (inside an MXNet call: a read
    waits for the engine, which may wait for the collectives the step queued, or for a stuck device), or None)."""
    in_mxnet = frame is not None and f"{os.sep}mxnet{os.sep}" in frame.f_code.co_filename
    kit, waiting = [], None
    while frame is not None:
        code = frame.f_code
        name = getattr(code, "co_qualname", code.co_name)
        if rn50kit.is_kit_file(code.co_filename):
            kit.append(f"{os.path.basename(code.co_filename)}:{frame.f_lineno} {name}")
            if name.startswith("Distributed.") or "broadcast" in name:
                waiting = "collective"
        elif "horovod" in code.co_filename:
            waiting = "collective"
        frame = frame.f_back
    return " < ".join(kit[:3]) or "start-up", waiting or ("engine" if in_mxnet else None)


class Watchdog(threading.Thread):
    def __init__(self, timeout, rank, main_thread=None):
        super().__init__(name="rn50-watchdog", daemon=True)
        self.timeout = timeout
        self.first_rank = rank
        self.main = main_thread or threading.main_thread()
        self.period = min(5.0, max(0.5, timeout / 10))  # the heartbeat's; faults.silent_ranks allows 3 of them
        self.clock = time.pthread_getcpuclockid(self.main.ident)

    @property
    def rank(self):
        """This worker's rank now (an elastic reset renumbers it: faults.renumber)."""
        return faults._record["rank"] if faults._record else self.first_rank

    def run(self):
        cpu, since = time.clock_gettime(self.clock), time.monotonic()
        launched, parent = world.launched_world(os.environ) is not None, os.getppid()
        # A first heartbeat at once: a rank frozen before its first period is named by the others too
        faults.heartbeat(where=where(sys._current_frames().get(self.main.ident))[0], waiting=None, idle=0.0,
                         period=self.period)
        while self.main.is_alive():
            time.sleep(self.period)
            if launched and os.getppid() != parent:
                parent = os.getppid()
                self.launcher_gone()
            try:
                now_cpu = time.clock_gettime(self.clock)
            except OSError:  # the main thread is gone
                return
            now = time.monotonic()
            if now_cpu != cpu:
                cpu, since = now_cpu, now
            frame = sys._current_frames().get(self.main.ident)
            place, waiting = where(frame)
            del frame
            if place and ELASTIC_RESET in place:  # an elastic run waiting for its new world: not a stall
                since = now  # (horovodrun's --elastic-timeout bounds that wait)
            faults.heartbeat(where=place, waiting=waiting, idle=now - since, period=self.period)
            if now - since > self.timeout:
                self.fire(place, waiting, now - since)

    def launcher_gone(self):
        """This worker's launcher went away (its SSH session cut, its mpirun or horovodrun killed outright): save
        and stop as on SIGTERM, rather than train on unseen, holding the workspace. Where the other ranks are gone
        too, the collectives fail and the worker ends at once."""
        line = f"rank {self.rank}: the process that started this worker is gone; saving a checkpoint and stopping"
        faults.heartbeat(launcher_gone=time.time())
        try:
            print(f"train.py: {line}", file=sys.stderr, flush=True)
        except OSError:
            pass  # the output went with the launcher
        os.kill(os.getpid(), signal.SIGTERM)

    def fire(self, place, waiting, idle):
        me = {"rank": self.rank, "host": faults._record["host"], "pid": os.getpid()} if faults._record else \
            {"rank": self.rank}
        seen = f"after {idle:.0f} s without progress (--stall-timeout {self.timeout:g})"
        silent = faults.silent_ranks(exclude=self.rank)
        stuck = [r for r in faults.read_all(faults.directory()).values()
                 if r["rank"] != self.rank and not r.get("waiting", True) and r.get("kind") in (None, "stall")]
        # A rank without a heartbeat is frozen or gone: the cause, whatever this rank's own wait looks like.
        if silent:
            culprit = min(silent, key=lambda r: r["alive"])
            line = (f"{faults.who(culprit)} stalled: no sign of life for {culprit['silent_for']:.0f} s (stopped, "
                    f"frozen, or its machine lost), last in {culprit.get('where', '?')}; seen by rank {self.rank} "
                    f"{seen}")
        elif waiting and stuck:  # this rank waits, another is stuck outside any wait
            culprit = stuck[0]
            line = f"{faults.who(culprit)} stalled: stuck in {culprit.get('where')}; seen by rank {self.rank} {seen}"
        elif waiting != "collective":  # stuck in its own work, or its engine in its own device's
            culprit, line = me, f"{faults.who(me)} stalled: stuck in {place} {seen}"
        else:
            culprit = None
            line = (f"a rank stalled (no record of the others tells which); {faults.who(me)} waited in {place} "
                    f"{seen}")
        faults.record_failure(line, "stall", culprit=culprit and culprit["rank"])
        print(f"train.py: error: {line}; ending this worker", file=sys.stderr, flush=True)
        os._exit(STALL_EXIT)


def start(timeout, rank):
    """Watch this process's main thread (``timeout`` seconds; 0 or less: no watchdog). Returns the thread."""
    if not timeout or timeout <= 0:
        return None
    dog = Watchdog(timeout, rank)
    dog.start()
    return dog
