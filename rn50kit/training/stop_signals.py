"""Stop signals, kept in one record per process. SIGTERM, SIGUSR1 and SIGINT ask a training run to save a
checkpoint at the next step boundary and stop, all ranks at the same step (a second SIGINT stops at once,
unsaved). The phases of a worker, in order:

- start-up (keep_early_stops, train.py's first lines, before MXNet loads): a SIGTERM/SIGUSR1 is kept, not fatal;
  a Ctrl-C ends the process at once with one line and status 130 (nothing to save yet);
- a run that does not train (end_at_once): the default handlers are back, and a kept signal ends it now;
- training (catch_stop_signals, once it holds its workspace; then the loop's StopFlag): each one is a request
  to save and stop, a kept one included.
"""
import os
import signal
import sys

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)  # SIGINT: Ctrl-C on a terminal
KEPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)  # those a start-up keeps for the training to honour
INTERRUPTED = 130  # 128 + SIGINT, the shell's status for a command ended by Ctrl-C


class StopRecord:
    """This process's stop signals: ``pending``, those that came before the loop's StopFlag existed (it starts
    requested, and takes them up), and ``received``, every one in order (train.py's exit status: 130 after a
    SIGINT)."""

    def __init__(self):
        self.pending = []
        self.received = []

    def note(self, signum, pending=True):
        """A stop request; a second Ctrl-C does not wait for the step boundary (KeyboardInterrupt, as by default)."""
        if signum == signal.SIGINT and signal.SIGINT in self.received:
            raise KeyboardInterrupt
        self.received.append(signum)
        if pending:
            self.pending.append(signum)


RECORD = StopRecord()


def interrupted_at_once(signum=None, frame=None):
    """Ctrl-C before training can save (start-up, scoring, prediction): one line and status 130, at once."""
    sys.stdout.flush()
    print("train.py: interrupted (Ctrl-C); nothing was saved since the last checkpoint", file=sys.stderr, flush=True)
    os._exit(INTERRUPTED)


def keep_early_stops():
    """train.py's start as a worker: a SIGTERM/SIGUSR1 while its modules load is kept for the training to honour
    at its first step (a run that does not train dies of it later: end_at_once); a Ctrl-C ends it at once."""
    for sig in KEPT_SIGNALS:
        signal.signal(sig, lambda signum, frame: RECORD.note(signum))
    signal.signal(signal.SIGINT, interrupted_at_once)


def end_at_once():
    """A run that does not train (no lock, nothing to save): SIGTERM/SIGUSR1 get their default back, and one kept
    during start-up ends the process now."""
    for sig in KEPT_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    if RECORD.pending:
        os.kill(os.getpid(), RECORD.pending[0])


def catch_stop_signals():
    """From now on a SIGTERM/SIGUSR1/SIGINT is not fatal: it asks the loop (once it runs) to save and stop."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, frame: RECORD.note(signum))


def interrupted():
    """Whether a Ctrl-C (SIGINT) was among the stop signals (the exit status is then 130)."""
    return signal.SIGINT in RECORD.received


def stop_cause():
    return "Ctrl-C (SIGINT)" if interrupted() else "signal"


class StopFlag:
    """SIGTERM/SIGUSR1/SIGINT ask for a checkpoint at the next step boundary (a second SIGINT: at once, unsaved).

    ``vote`` is the one small allreduce per step: it tells whether every rank's loss is finite, and carries
    the stop request along, so all ranks stop at the same step.
    """

    def __init__(self, dist):
        self.dist = dist
        self.requested = bool(RECORD.pending)  # taken up here: a later run in this process starts without them
        RECORD.pending.clear()
        self.agreed = False
        self.votes = 0
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handler)

    def _handler(self, signum, frame):
        RECORD.note(signum, pending=False)
        self.requested = True

    def vote(self, loss_ok):
        self.votes += 1
        # One name for every vote: Horovod's response cache then serves it (a new name per step evicts cached
        # responses); the votes never overlap, each is read before the next starts.
        bad, stops = self.dist.sum([0.0 if loss_ok else 1.0, 1.0 if self.requested else 0.0], "vote")
        self.agreed = stops > 0
        return bad == 0

    def agreed_now(self):
        """Outside a step (epoch end): do all ranks agree to stop?"""
        self.vote(True)
        return self.agreed
