"""Checkpoints: the original kit's file names plus a state file, written so that a kill never breaks one.

For each checkpoint, with tag NNNN (epochs completed) or NNNN-stepSSSSSS (stopped inside an epoch):
  <prefix>-symbol.json, <prefix>-<tag>.params   net.export() format (arg:/aux: names), loadable without this kit
  <prefix>-<tag>.states                         optimizer state (momentum, fp32 master weights)
  <prefix>-<tag>-ema.params                     EMA weights, when --ema-decay is set
  <prefix>-<tag>.state.json                     epoch, step, loss scale, best top-1, metric history, seeds
  <prefix>-best.params                          the parameters with the best validation top-1: the weights
                                                that were scored (the EMA weights with --ema-decay)
Every file goes to a temporary name, is flushed to disk, then renamed. The state file is written last and
names the others, so a checkpoint counts as complete only when its state file exists: a run killed at any
moment leaves either a complete checkpoint or none under the final names (plus stray .tmp files).
"""
import glob
import json
import os
import re
import shutil

import mxnet as mx

import models

STATE_SUFFIX = ".state.json"


class CheckpointError(Exception):
    """A checkpoint that cannot be used (another architecture, a file missing): reported as one line."""


def workspace_path(workspace, name):
    """``name`` inside ``workspace`` (an absolute ``name`` stays as it is)."""
    return name if os.path.isabs(name) else os.path.join(workspace, name)


def load_params(net, path, ctxs):
    """Load a .params file into ``net`` on the devices ``ctxs``; a file of another architecture is a
    CheckpointError."""
    try:
        models.load_parameters(net, path, ctxs)
    except ValueError as error:
        raise CheckpointError(f"{error}: it was saved from another architecture; check --arch/--num-layers/"
                              "--num-classes")


def _fsync(path):
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _commit(tmp, final):
    _fsync(tmp)
    os.replace(tmp, final)


def _fsync_dir(directory):
    fd = os.open(directory or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tag_for(epoch, step=0):
    return f"{epoch:04d}" if step == 0 else f"{epoch:04d}-step{step:06d}"


def save(prefix, net, trainer, state, ema=None, best=False):
    """Write one checkpoint (rank 0 only); ``state`` is a JSON-able dict with at least epoch and step. ``best``:
    True copies the parameters to <prefix>-best.params; a function is called with an ``export()`` that writes
    the network's current weights there (the caller puts the scored weights in place around it)."""
    directory, name = os.path.split(prefix)
    tag = tag_for(state["epoch"], state["step"])
    tmp_prefix = os.path.join(directory, f".tmp-{name}")
    files = {"symbol": f"{name}-symbol.json", "params": f"{name}-{tag}.params", "states": f"{name}-{tag}.states"}
    net.export(tmp_prefix, epoch=0)
    _commit(f"{tmp_prefix}-0000.params", f"{prefix}-{tag}.params")
    _commit(f"{tmp_prefix}-symbol.json", f"{prefix}-symbol.json")
    trainer.save_states(f"{tmp_prefix}.states")
    _commit(f"{tmp_prefix}.states", f"{prefix}-{tag}.states")
    if ema is not None:
        mx.nd.save(f"{tmp_prefix}-ema.params", ema)
        _commit(f"{tmp_prefix}-ema.params", f"{prefix}-{tag}-ema.params")
        files["ema"] = f"{name}-{tag}-ema.params"
    if best is True:
        shutil.copyfile(f"{prefix}-{tag}.params", f"{tmp_prefix}-best.params")
        _commit(f"{tmp_prefix}-best.params", f"{prefix}-best.params")
    elif best:  # the weights that were scored are not the live ones (EMA): best(export) writes them
        best(lambda: _export_as(net, tmp_prefix, f"{prefix}-best.params"))
    state = dict(state, files=files)
    with open(f"{tmp_prefix}{STATE_SUFFIX}", "w") as f:
        json.dump(state, f, indent=1)
    _commit(f"{tmp_prefix}{STATE_SUFFIX}", f"{prefix}-{tag}{STATE_SUFFIX}")
    _fsync_dir(directory)
    return f"{prefix}-{tag}.params"


def _export_as(net, tmp_prefix, final):
    """``net``'s current weights, exported (arg:/aux: names) to ``final`` atomically."""
    net.export(f"{tmp_prefix}-best", epoch=0)
    os.remove(f"{tmp_prefix}-best-symbol.json")
    _commit(f"{tmp_prefix}-best-0000.params", final)


def read_state(path):
    """The state dict of a complete checkpoint, with paths made absolute; None if incomplete or unreadable."""
    try:
        with open(path) as f:
            state = json.load(f)
        directory = os.path.dirname(path)
        state["paths"] = {k: os.path.join(directory, v) for k, v in state["files"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not all(os.path.isfile(p) for p in state["paths"].values()):
        return None
    state["state_path"] = path
    return state


def list_complete(prefix):
    """The complete checkpoints of ``prefix``, oldest first (by epochs, then steps)."""
    pattern = re.compile(re.escape(os.path.basename(prefix)) + r"-\d{4}(-step\d{6})?" + re.escape(STATE_SUFFIX) + "$")
    states = [read_state(p) for p in glob.glob(glob.escape(prefix) + "-*" + STATE_SUFFIX)
              if pattern.match(os.path.basename(p))]
    return sorted((s for s in states if s is not None), key=lambda s: (s["epoch"], s["step"]))


def find_latest(prefix):
    """The newest complete checkpoint of ``prefix`` (most epochs, then most steps), or None."""
    states = list_complete(prefix)
    return states[-1] if states else None


def to_score(load, workspace, model_prefix):
    """The parameters --mode val/pred score: --load, else the latest complete checkpoint of the workspace; None
    when there is none."""
    if load:
        return load
    latest = find_latest(workspace_path(workspace, model_prefix))
    return latest and latest["paths"]["params"]


def files_of(state):
    """The files one checkpoint owns, its state file first (the symbol file is shared by all of them)."""
    return [state["state_path"]] + [path for kind, path in state["paths"].items() if kind != "symbol"]


def prune(prefix, keep_last):
    """Remove the checkpoints a resume no longer needs: step checkpoints older than the newest checkpoint, and
    epoch checkpoints beyond the newest ``keep_last`` (0 keeps them all). <prefix>-best.params is a copy, so
    the best survives. The state file goes first: a kill in between leaves an incomplete checkpoint, never a
    complete one with missing files. Returns the removed checkpoints' parameter files."""
    states = list_complete(prefix)
    if not states:
        return []
    newest = states[-1]
    epochs = [s for s in states if s["step"] == 0]
    doomed = [s for s in states[:-1] if s["step"] > 0]
    if keep_last > 0:
        doomed += [s for s in epochs[:-keep_last] if s is not newest]
    for state in doomed:
        for path in files_of(state):
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
    return [s["paths"]["params"] for s in doomed]


def state_for_params(params_path):
    """The state beside a named ``<prefix>-<tag>.params`` file, or None (e.g. a -best or foreign file)."""
    if params_path.endswith(".params"):
        return read_state(params_path[:-len(".params")] + STATE_SUFFIX)
    return None


def why_not_resumable(path):
    """One line on why --resume ``path`` cannot continue a run: which case, what exists there, what is accepted."""
    directory = os.path.dirname(path) or "."
    name = os.path.basename(path)
    if not os.path.exists(path):
        case = "no such file"
    elif os.path.isdir(path):
        case = "a folder, not a checkpoint file"
    elif re.search(r"-best\.params$|-ema\.params$", name):
        case = "a -best or -ema copy holds weights only (no optimizer state or epoch): it can be scored or " \
               "loaded, not resumed"
    elif not name.endswith((".params", STATE_SUFFIX)):
        case = f"not a .params or {STATE_SUFFIX} file"
    else:
        state_path = path[:-len(".params")] + STATE_SUFFIX if name.endswith(".params") else path
        try:
            with open(state_path) as f:
                files = json.load(f).get("files", {})
            missing = [n for n in files.values() if not os.path.isfile(os.path.join(directory, n))]
            case = f"its files {', '.join(missing)} are missing" if missing else "its state file cannot be read"
        except FileNotFoundError:
            case = f"no {os.path.basename(state_path)} beside it (the state file is written last: the save did not " \
                   "finish, or the file comes from another tool)"
        except (OSError, ValueError, AttributeError):
            case = f"{os.path.basename(state_path)} is damaged"
    prefixes = sorted({m.group(1) for m in (re.match(r"^(.*)-\d{4}(?:-step\d{6})?" + re.escape(STATE_SUFFIX) + "$", f)
                                            for f in (os.listdir(directory) if os.path.isdir(directory) else []))
                       if m})
    complete = [os.path.basename(s["paths"]["params"]) for p in prefixes
                for s in list_complete(os.path.join(directory, p))]
    there = f"complete checkpoints in {directory}: {', '.join(complete[-5:])}" if complete else \
        f"no complete checkpoint in {directory}"
    return (f"--resume {path}: {case}; {there}; give --resume auto (the latest), none (start afresh) or a "
            f"<prefix>-NNNN.params / {STATE_SUFFIX} path")
