"""The folders a run writes into, made before it starts, and the workspace a training run holds: rank 0 locks it
for this run, so a second run there is refused at once; from then on a stop signal means: save and stop. A run
that does not continue the latest checkpoint moves the earlier run's files aside first (set_aside_superseded)."""
import glob
import logging
import os
import shutil
import time

from rn50kit.config.cli import UsageError
from rn50kit.reliability import run_lock
from rn50kit.training import stop_signals
from rn50kit.training.prelaunch import trains
from rn50kit.training.run_record import absolute_report_path
from rn50kit.training.start_checks import refuse_together
from rn50kit.weights import checkpoint


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


def set_aside(workspace, names, copies=()):
    """Move files of an earlier run into <workspace>/previous-<time>/ so no later resume picks them up, and
    copy ``copies`` (files still in use here) beside them; returns that folder (None if nothing moved)."""
    paths = [os.path.join(workspace, n) for n in names if os.path.exists(os.path.join(workspace, n))]
    if not paths:
        return None
    target = os.path.join(workspace, time.strftime("previous-%Y%m%d-%H%M%S"))
    suffix = 1
    while os.path.exists(target):
        suffix += 1
        target = os.path.join(workspace, time.strftime("previous-%Y%m%d-%H%M%S") + f"-{suffix}")
    os.makedirs(target)
    for path in paths:
        os.replace(path, os.path.join(target, os.path.basename(path)))
    for name in copies:
        if os.path.isfile(os.path.join(workspace, name)):
            shutil.copy2(os.path.join(workspace, name), os.path.join(target, name))
    return target


def previous_run_files(workspace, prefix, extra_names):
    """Names of everything a run with ``prefix`` leaves in ``workspace``: checkpoints, best, scores, and the
    report and JSON log named in ``extra_names``."""
    names = [os.path.basename(p) for p in glob.glob(os.path.join(glob.escape(workspace), glob.escape(prefix) + "-*"))]
    names += [n for n in extra_names if n and not os.path.isabs(n)]
    return sorted(set(names))


def set_aside_superseded(workspace, prefix_name, state, other_files=()):
    """Before a run that does not continue the latest checkpoint: with ``state`` None (--resume none) the whole
    earlier run (checkpoints, best, scores, ``other_files`` such as its report and log), else (--resume PATH)
    the checkpoints later than ``state``. Moved aside, not deleted, so that a later --resume auto cannot
    continue the abandoned run. Returns the folder they went to, or None."""
    if state is None:
        names = previous_run_files(workspace, prefix_name, other_files)
    else:
        later = [s for s in checkpoint.list_complete(os.path.join(workspace, prefix_name))
                 if (s["epoch"], s["step"]) > (state["epoch"], state["step"])]
        names = [os.path.basename(path) for s in later for path in checkpoint.files_of(s)]
        # The symbol file is shared with the checkpoints kept: a copy keeps the moved ones complete.
        return set_aside(workspace, names, copies=[f"{prefix_name}-symbol.json"])
    return set_aside(workspace, names)
