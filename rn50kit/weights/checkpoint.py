"""Checkpoints: the original kit's file names plus a state file, written so that a kill never breaks one.

For each checkpoint, with tag NNNN (epochs completed) or NNNN-stepSSSSSS (stopped inside an epoch):
  <prefix>-symbol.json, <prefix>-<tag>.params   net.export() format (arg:/aux: names), loadable without this kit
  <prefix>-<tag>.states                         optimizer state's arrays (momentum, fp32 master weights), an
                                                NDArray file (optimizer_state.py: no pickle), host copies
  <prefix>-<tag>-ema.params                     EMA weights, when --ema-decay is set
  <prefix>-<tag>.state.json                     epoch, step, loss scale, best top-1, metric history, seeds,
                                                the optimizer state's plain values (update counts)
  <prefix>-best.params                          the parameters with the best validation top-1: the weights
                                                that were scored (the EMA weights with --ema-decay)
Every file goes to a temporary name, is flushed to disk, then renamed. The state file is written last and
names the others, so a checkpoint counts as complete only when its state file exists: a run killed at any
moment leaves either a complete checkpoint or none under the final names (plus stray .tmp files).

Damage after the fact (a truncated copy, a flipped bit, a lost file): the state file records each file's size
and SHA-256 and a checksum of its own contents. Listing checkpoints checks the sizes; find_latest (what a resume
and a scoring run pick) checks the contents too and falls back to the newest checkpoint that is whole, with a
warning naming each bad file. A save that fails (the disk full) removes what it wrote and raises
CheckpointError: the earlier checkpoints are untouched.
"""
import errno
import glob
import hashlib
import json
import os
import re
import shutil
import sys

import numpy as np

# MXNet (and models and optimizer_state, which import it) load where a file is read or written through them:
# runner's launch check reads state files and checksums in its own process, without MXNet.

STATE_SUFFIX = ".state.json"
TAG = r"-\d{4}(?:-step\d{6})?"
# Errors of a full disk, a full quota or the process's file-size limit (RLIMIT_FSIZE: EFBIG, SIGXFSZ ignored).
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class CheckpointError(Exception):
    """A checkpoint cannot be written (the disk is full), read (it is damaged) or used (another architecture):
    one line for the user."""


def workspace_path(workspace, name):
    """``name`` inside ``workspace`` (an absolute ``name`` stays as it is)."""
    return name if os.path.isabs(name) else os.path.join(workspace, name)


def load_params(net, path, ctxs):
    """Load a .params file into ``net`` on the devices ``ctxs``; a file of another architecture is a
    CheckpointError."""
    import mxnet as mx

    import models
    try:
        models.load_parameters(net, path, ctxs)
    except ValueError as error:
        raise CheckpointError(f"{error}: it was saved from another architecture; check --arch/--num-layers/"
                              "--num-classes")
    except mx.base.MXNetError as error:  # faults: a truncated or foreign file
        raise CheckpointError(f"{path} is damaged or not a parameter file ({mxnet_message(error)})")


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


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def state_checksum(state):
    """SHA-256 of a state's contents (without its own "checksum" and the paths read_state adds)."""
    body = {k: v for k, v in state.items() if k not in ("checksum", "paths", "state_path")}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def tag_for(epoch, step=0):
    return f"{epoch:04d}" if step == 0 else f"{epoch:04d}-step{step:06d}"


def mxnet_message(error):
    """The line of an MXNetError that says what failed (its text may start with the C++ traceback)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    said = [line for line in lines if line.startswith("MXNetError:")]
    return (said[0] if said else lines[-1] if lines else "MXNetError").replace("MXNetError: ", "MXNet: ", 1)


def _export(net, tmp_prefix):
    """models.export of ``net`` to ``tmp_prefix``; returns the parameter file. MXNet's file writer reports a failed
    write as "FileStream.Write incomplete" without the cause, and drops an error at close (leaving a short file):
    so the file is read back, and on failure a write of the same size from Python finds the cause (OSError)."""
    import mxnet as mx

    import models
    path = f"{tmp_prefix}-0000.params"
    try:
        models.export(net, tmp_prefix)
        mx.nd.load(path)
        return path
    except mx.base.MXNetError as error:
        arrays = [p.list_data()[0] for p in net.collect_params().values()]
        raise _write_error(path, sum(a.size * np.dtype(a.dtype).itemsize for a in arrays)) or error


def _write_error(path, size):
    """The OSError that writing ``size`` bytes to ``path`` meets now, or None."""
    block = bytes(1 << 20)
    try:
        with open(path, "wb") as f:
            for start in range(0, size, len(block)):
                f.write(block[:size - start])
            f.flush()
            os.fsync(f.fileno())
    except OSError as error:
        return error
    return None


def save(prefix, net, trainer, state, ema=None, best=False):
    """Write one checkpoint (rank 0 only); ``state`` is a JSON-able dict with at least epoch and step. ``best``:
    True copies the parameters to <prefix>-best.params; a function is called with an ``export()`` that writes
    the network's current weights there (the caller puts the scored weights in place around it).

    Raises CheckpointError when a file cannot be written (the disk full, its quota, a file-size limit): what this
    save wrote is removed first, so no part of it is taken for a checkpoint later."""
    import mxnet as mx

    from rn50kit.weights import optimizer_state
    directory, name = os.path.split(prefix)
    tag = tag_for(state["epoch"], state["step"])
    tmp_prefix = os.path.join(directory, f".tmp-{name}")
    files = {"symbol": f"{name}-symbol.json", "params": f"{name}-{tag}.params", "states": f"{name}-{tag}.states"}
    checks = {}  # kind: size and SHA-256 of each file this checkpoint owns
    written = []  # those files under their final names, removed if the save fails

    def commit(tmp, final, kind=None):
        _commit(tmp, final)
        if kind:
            written.append(final)
            checks[kind] = {"size": os.path.getsize(final), "sha256": sha256(final)}

    try:
        commit(_export(net, tmp_prefix), f"{prefix}-{tag}.params", "params")
        commit(f"{tmp_prefix}-symbol.json", f"{prefix}-symbol.json")
        optimizer_values = optimizer_state.save(trainer, f"{tmp_prefix}.states")
        commit(f"{tmp_prefix}.states", f"{prefix}-{tag}.states", "states")
        if ema is not None:
            # host copies: MXNet records an array's device and loads it back there (GPU 0 for every rank)
            mx.nd.save(f"{tmp_prefix}-ema.params", {name: value.as_in_context(mx.cpu()) for name, value in ema.items()})
            mx.nd.load(f"{tmp_prefix}-ema.params")
            files["ema"] = f"{name}-{tag}-ema.params"
            commit(f"{tmp_prefix}-ema.params", f"{prefix}-{tag}-ema.params", "ema")
        if best is True:
            shutil.copyfile(f"{prefix}-{tag}.params", f"{tmp_prefix}-best.params")
            commit(f"{tmp_prefix}-best.params", f"{prefix}-best.params")
        elif best:  # the weights that were scored are not the live ones (EMA): best(export) writes them
            def export_best():
                commit(_export(net, tmp_prefix), f"{prefix}-best.params")
                os.remove(f"{tmp_prefix}-symbol.json")  # the checkpoint's own is in place already
            best(export_best)
        state = dict(state, files=files, checks=checks, optimizer_state=optimizer_values)
        state["checksum"] = state_checksum(state)
        with open(f"{tmp_prefix}{STATE_SUFFIX}", "w") as f:
            json.dump(state, f, indent=1)
        _commit(f"{tmp_prefix}{STATE_SUFFIX}", f"{prefix}-{tag}{STATE_SUFFIX}")
        _fsync_dir(directory)
    except (OSError, mx.base.MXNetError) as error:
        for path in written + glob.glob(glob.escape(tmp_prefix) + "*"):
            try:
                os.remove(path)
            except OSError:
                pass
        raise CheckpointError(save_failure(prefix, tag, error)) from None
    return f"{prefix}-{tag}.params"


def save_failure(prefix, tag, error):
    """One line: why checkpoint ``tag`` was not saved, where, what is still there, and what to do."""
    where = os.path.abspath(os.path.dirname(prefix) or ".")
    previous = find_latest(prefix)
    kept = f"the last complete checkpoint, {previous['state_path']}, is intact" if previous else \
        "there is no earlier complete checkpoint"
    name = f"{os.path.basename(prefix)}-{tag}"
    if isinstance(error, OSError) and error.errno in DISK_FULL:
        return (f"the disk is full: cannot save checkpoint {name} in {where} ({error.strerror}); {kept}; free "
                "space there (or give another --workspace) and rerun the same command to resume")
    detail = (getattr(error, "strerror", None) or str(error)).strip().splitlines()
    return (f"cannot save checkpoint {name} in {where} ({detail[0] if detail else type(error).__name__}); "
            f"{kept}; fix that and rerun the same command to resume")


def write_failure(error):
    """One line for a full disk met writing a log or the report (a checkpoint's: save_failure), or None."""
    if isinstance(error, OSError) and error.errno in DISK_FULL:
        return (f"the disk is full: cannot write {error.filename or 'the logs'} ({error.strerror}); the checkpoints "
                "saved are intact; free space there (or give another --workspace) and rerun the same command to resume")
    return None


def inspect(path, verify=False):
    """(state, None) for the complete checkpoint whose state file is ``path``, paths made absolute; (None, why)
    for one that is incomplete or damaged. ``verify``: compare the files' contents with their recorded SHA-256
    (else only their sizes). Checkpoints saved before sizes and checksums were recorded pass on what they have."""
    try:
        with open(path) as f:
            state = json.load(f)
    except FileNotFoundError:
        return None, f"{path} does not exist"
    except OSError as error:
        return None, f"{path} cannot be read ({error.strerror})"
    except (ValueError, RecursionError):  # RecursionError: arrays nested past Python's limit (a hostile file)
        return None, f"{path} is damaged (not valid JSON)"
    if not isinstance(state, dict) or "checksum" in state and state["checksum"] != state_checksum(state):
        return None, f"{path} is damaged (its contents do not match their checksum)"
    try:
        directory = os.path.dirname(path)
        state["paths"] = {k: os.path.join(directory, v) for k, v in state["files"].items()}
        int(state["epoch"]), int(state["step"])
    except (KeyError, TypeError, AttributeError, ValueError):
        return None, f"{path} is damaged (no epoch, step or file list)"
    for kind, file in state["paths"].items():
        if not os.path.isfile(file):
            return None, f"{file} is missing (named by {os.path.basename(path)})"
        check = (state.get("checks") or {}).get(kind)
        if check and os.path.getsize(file) != check["size"]:
            return None, f"{file} is damaged ({os.path.getsize(file)} bytes, {check['size']} when saved)"
        if check and verify and sha256(file) != check["sha256"]:
            return None, f"{file} is damaged (its contents differ from when it was saved)"
    state["state_path"] = path
    return state, None


def read_state(path, verify=False):
    """The state dict of a complete checkpoint, with paths made absolute; None if incomplete or damaged."""
    return inspect(path, verify)[0]


def _state_files(prefix):
    pattern = re.compile(re.escape(os.path.basename(prefix)) + TAG + re.escape(STATE_SUFFIX) + "$")
    return [p for p in glob.glob(glob.escape(prefix) + "-*" + STATE_SUFFIX) if pattern.match(os.path.basename(p))]


def _order(tag_path):
    """(epoch, step) of a checkpoint file's name."""
    match = re.search(r"-(\d{4})(?:-step(\d{6}))?(?:\.state\.json|\.params)$", tag_path)
    return (int(match[1]), int(match[2] or 0)) if match else (-1, -1)


def list_complete(prefix, problems=None):
    """The complete checkpoints of ``prefix``, oldest first (by epochs, then steps). ``problems``: a list that
    gets (epoch, step, why) for each state file that names a missing or damaged file."""
    states = []
    for path in _state_files(prefix):
        state, why = inspect(path)
        if state is not None:
            states.append(state)
        elif problems is not None:
            problems.append(_order(path) + (why,))
    return sorted(states, key=lambda s: (s["epoch"], s["step"]))


def orphans(prefix):
    """<prefix>-<tag>.params files without their state file: a save cut short, or a state file lost."""
    pattern = re.compile(re.escape(os.path.basename(prefix)) + TAG + r"\.params$")
    return [p for p in glob.glob(glob.escape(prefix) + "-*.params") if pattern.match(os.path.basename(p))
            and not os.path.exists(p[:-len(".params")] + STATE_SUFFIX)]


def find_latest(prefix, warn=None, problems=None):
    """The newest complete checkpoint of ``prefix`` (most epochs, then most steps) whose files are whole, or None.

    Damaged or incomplete checkpoints newer than the one returned are skipped; ``warn`` (a function of one
    string, e.g. logging.warning) hears of each, naming the bad file; ``problems`` (a list) gets (epoch, step,
    why) for each state file skipped."""
    problems = [] if problems is None else problems
    states = list_complete(prefix, problems)
    chosen = None
    for state in reversed(states):
        verified, why = inspect(state["state_path"], verify=True)
        if verified is not None:
            chosen = verified
            break
        problems.append((state["epoch"], state["step"], why))
    if warn is not None:
        floor = (chosen["epoch"], chosen["step"]) if chosen else (-1, -1)
        lost = [_order(p) + (f"{p} has no {os.path.basename(p)[:-len('.params')]}{STATE_SUFFIX} beside it "
                             "(a save cut short, or the file was lost)",) for p in orphans(prefix)]
        fallback = f"falling back to {chosen['state_path']}" if chosen else "no whole checkpoint is left"
        for epoch, step, why in sorted(p for p in problems + lost if p[:2] > floor):
            warn(f"skipping checkpoint {os.path.basename(prefix)}-{tag_for(epoch, step)}: {why}; {fallback}")
    return chosen


def resume_point(prefix, warn=None):
    """find_latest for --resume auto, which refuses to start afresh over checkpoints that are all damaged."""
    problems = []
    latest = find_latest(prefix, warn, problems)
    if latest is None and problems:
        raise CheckpointError(f"every checkpoint of {prefix} is damaged or incomplete ({problems[-1][2]}); "
                              "restore one, or start afresh with --resume none (the damaged files are moved aside)")
    return latest


def resume_state(resume, prefix, warn=None):
    """The checkpoint state --resume asks to continue from (``prefix``: the workspace's checkpoint prefix), or
    None to start afresh. ``warn`` hears of damaged checkpoints skipped."""
    if resume == "none":
        return None
    if resume == "auto":
        return resume_point(prefix, warn)
    state, why = named(resume)  # faults: verified, or why not
    if state is None:
        raise CheckpointError(f"--resume {resume}: {why}" if why and "damaged" in why else why_not_resumable(resume))
    return state



def named(path):
    """(state, None) for the checkpoint a user names by its .params or state file, its files verified; else
    (None, why)."""
    if path.endswith(STATE_SUFFIX):
        return inspect(path, verify=True)
    if re.search(TAG + r"\.params$", path):
        return inspect(path[:-len(".params")] + STATE_SUFFIX, verify=True)
    return None, f"{path} is not a <prefix>-NNNN[-stepSSSSSS].params or {STATE_SUFFIX} file"


def not_parameters(path):
    """What the kit's other files are when named where its .params is wanted (--load), and what to pass instead;
    None for any other file (a .states file loads as NDArrays and then looked like another architecture, an export
    like a damaged file)."""
    base = re.sub(r"(\.states|\.state\.json|-symbol\.json)$", "", path)
    if path.endswith((".states", STATE_SUFFIX)):
        return (f"{path} is a checkpoint's {'optimizer state' if path.endswith('.states') else 'state file'}, not "
                f"its weights: pass --load {base}.params")
    if path.endswith("-symbol.json"):
        return f"{path} is a checkpoint's graph, not its weights: pass --load {base}-NNNN.params or {base}-best.params"
    if path.lower().endswith((".safetensors", ".pth", ".pt")):
        return (f"{path} is exported weights (tools/export_weights.py, or another library's), not the kit's "
                f".params: --load the .params it was exported from, or train from it with --pretrained {path}")
    return None


def check_loadable(params_path):
    """Refuse (CheckpointError) a named parameter file that is damaged or not one (not_parameters): checked
    against its state file when one is beside it, else by reading it (a truncated or foreign file does not load);
    where MXNet is not loaded (runner's launch check), a Python that imports train reads it."""
    problem = not_parameters(params_path)
    if problem:
        raise CheckpointError(problem)
    state_path = state_beside(params_path)
    if state_path and os.path.exists(state_path):
        state, why = inspect(state_path, verify=True)
        if state is None and os.path.abspath(params_path) in os.path.abspath(why.split(" is ")[0]):
            raise CheckpointError(why)
        if state is not None:
            return
    if "mxnet" in sys.modules:
        read_params(params_path)
    else:
        from rn50kit.hardware import mxnet_answers
        problem = mxnet_answers.params_problem(params_path)
        if problem:
            raise CheckpointError(problem)


def read_params(params_path):
    """A CheckpointError where MXNet's loader cannot read ``params_path`` (a truncated or foreign file)."""
    import mxnet as mx
    try:
        mx.nd.load(params_path)
    except mx.base.MXNetError as error:
        raise CheckpointError(f"{params_path} is damaged or not a parameter file ({mxnet_message(error)})") \
            from None


def to_score(load, workspace, model_prefix, warn=None):
    """The parameters --mode val/pred score: --load, else the latest complete checkpoint of the workspace whose
    files are whole (``warn`` hears of damaged ones skipped); None when there is none."""
    latest = None if load else find_latest(workspace_path(workspace, model_prefix), warn)
    return load or (latest and latest["paths"]["params"])


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


def trained_settings(params_path):
    """The state (with its "args") saved with a checkpoint's parameters: beside <prefix>-NNNN[-stepS][-ema].params,
    or, for <prefix>-best.params, the latest of the same run. None for a file without one (another kit's)."""
    state_path = state_beside(params_path)
    if state_path:
        return read_state(state_path)
    best = re.match(r"^(.*)-best\.params$", params_path)
    if best:
        return find_latest(best.group(1))
    return None


def state_beside(params_path):
    """The state file of a tagged ``<prefix>-<tag>[-ema].params``, or None (a -best, foreign or untagged file)."""
    tagged = re.match(r"^(.*" + TAG + r")(?:-ema)?\.params$", params_path)
    return tagged.group(1) + STATE_SUFFIX if tagged else None


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
        except (OSError, ValueError, AttributeError, RecursionError):
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
