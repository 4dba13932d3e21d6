"""Stop signals: SIGTERM, SIGUSR1 and SIGINT ask the loop to save a checkpoint at the next step boundary and stop,
all ranks at the same step (a second SIGINT stops at once, unsaved)."""
import signal


_early_stop_signals = []  # stop signals that came before the loop's StopFlag existed (start-up)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)  # SIGINT: Ctrl-C on a terminal
stop_signals_received = []  # every stop signal of this process, in order (train.py's exit status: 130 for SIGINT)


def _note_stop(signum, queue):
    """A stop request; a second Ctrl-C does not wait for the step boundary (KeyboardInterrupt, as by default)."""
    if signum == signal.SIGINT and signal.SIGINT in stop_signals_received:
        raise KeyboardInterrupt
    stop_signals_received.append(signum)
    queue.append(signum)


def catch_stop_signals(pending=()):
    """From now on a SIGTERM/SIGUSR1/SIGINT is not fatal: it asks the loop (once it runs) to save and stop.
    ``pending``: such signals kept before this call."""
    _early_stop_signals.extend(pending)
    stop_signals_received.extend(pending)
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, frame: _note_stop(signum, _early_stop_signals))


class StopFlag:
    """SIGTERM/SIGUSR1/SIGINT ask for a checkpoint at the next step boundary (a second SIGINT: at once, unsaved).

    ``vote`` is the one small allreduce per step: it tells whether every rank's loss is finite, and carries
    the stop request along, so all ranks stop at the same step.
    """

    def __init__(self, dist):
        self.dist = dist
        self.requested = bool(_early_stop_signals)
        self.agreed = False
        self.votes = 0
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handler)

    def _handler(self, signum, frame):
        _note_stop(signum, [])
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
