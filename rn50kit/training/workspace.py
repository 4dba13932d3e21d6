"""The folders a run writes into, made before it starts, and the workspace a training run holds: rank 0 locks it
for this run, so a second run there is refused at once; from then on a stop signal means: save and stop."""
import logging
import os

from rn50kit.config.cli import UsageError
from rn50kit.reliability import run_lock
from rn50kit.training import checkpoint, stop_signals
from rn50kit.training.prelaunch import trains
from rn50kit.training.run_record import absolute_report_path
from rn50kit.training.start_checks import refuse_together


def prepare_workspace(cfg, info, dist):
    """The folders the run writes into, made now, then the workspace held (hold_workspace): the lock, or None."""
    fit_cfg = cfg.fit
    writes = trains(cfg)  # --test-io writes nothing
    if writes:
        os.makedirs(fit_cfg.workspace, exist_ok=True)
        # --model-prefix may name a folder inside the workspace: make it now, not at the first checkpoint
        os.makedirs(os.path.dirname(checkpoint.workspace_path(fit_cfg.workspace, fit_cfg.model_prefix)) or ".",
                    exist_ok=True)
    if fit_cfg.mode != "pred" and not cfg.data.test_io:
        os.makedirs(os.path.dirname(absolute_report_path(cfg, info)), exist_ok=True)
    return hold_workspace(fit_cfg.workspace, writes, dist)


def hold_workspace(workspace, writes, dist):
    """Training writes into ``workspace``: rank 0 (the writer) locks it for this run, so a second run there is
    refused at once. Every rank learns the answer, so none is left waiting in a collective. A run that does not
    train (scoring, prediction, --test-io) takes no lock, and its stop signals end it at once."""
    if not writes:
        stop_signals.end_at_once()
        return None
    lock, busy = run_lock.WorkspaceLock(workspace), ""
    if dist.is_primary:
        try:
            if not lock.acquire():
                logging.warning("The file system of %s has no locks: nothing stops a second run from writing "
                                "into this workspace", workspace)
        except run_lock.WorkspaceBusy as error:
            busy = str(error)
    if dist.elastic and busy:  # no collective before an elastic run's first sync (a worker added joins there)
        raise UsageError(busy)
    if not dist.elastic and dist.sum([1.0 if busy else 0.0], "workspace.lock")[0]:
        refuse_together(dist, busy)
    stop_signals.catch_stop_signals()  # from here on a SIGTERM/SIGUSR1 means: save at the next step boundary
    return lock
