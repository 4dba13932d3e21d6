"""The optimizer state of a checkpoint as arrays and plain values, never a pickle.

MXNet's ``Trainer.save_states`` pickles the updater's states and the optimizer object, and ``load_states``
unpickles them: a checkpoint handed over by someone else could run code on resume. Here the state arrays
(momentum, float32 master weights, LAMB's moments) go to an MXNet NDArray file (``mx.nd.save`` of a dict of names,
read by MXNet's C++ parser), and the plain values (the per-weight update counts LAMB's bias correction uses, the
nesting of each weight's state) to a JSON-able dict the checkpoint's state file holds.

The arrays are written from host copies and loaded onto each of the trainer's own devices: an array saved from a
GPU would come back on that GPU (MXNet records its context), i.e. every rank of a job on rank 0's GPU 0.

Checkpoints written before this module hold a pickle; they are refused, and ``tools/convert_states.py`` (the
one place that unpickles, for files the user trusts) rewrites them.
"""
import struct

import mxnet as mx

FORMAT = 1
NDARRAY_MAGIC = struct.pack("<Q", 0x112)  # the first 8 bytes of an mx.nd.save file (kMXAPINDArrayListMagic)
# Optimizer attributes that change as training goes, besides the update counts (MXNet's LARS momentum correction)
EVOLVING = ("num_update", "last_lr", "cur_lr")
CONVERTER = "tools/convert_states.py"


class StateError(Exception):
    """The optimizer state of a checkpoint cannot be used: one line for the user."""


def _ready(trainer):
    """The trainer's updaters exist (as Trainer.save_states/load_states make sure)."""
    if not trainer._kv_initialized:
        trainer._init_kvstore()
    if trainer._params_to_init:
        trainer._init_params()


def optimizer_name(optimizer):
    """MXNet's registered name of ``optimizer``'s class (ours subclass MXNet's and keep its name)."""
    return type(optimizer).__name__.lower()


def _flatten(state, key, arrays):
    """The JSON shape of one weight's state (None, an array's name, or a list of shapes), its arrays put in
    ``arrays`` as host copies."""
    if state is None:
        return None
    if isinstance(state, mx.nd.NDArray):
        arrays[key] = state.copyto(mx.cpu())
        return key
    if isinstance(state, (tuple, list)):
        return [_flatten(item, f"{key}.{k}", arrays) for k, item in enumerate(state)]
    raise TypeError(f"optimizer state of type {type(state).__name__} cannot be saved")


def _build(shape, arrays, ctx):
    if shape is None:
        return None
    if isinstance(shape, str):
        return arrays[shape].copyto(ctx)  # a copy per device: each updater updates its own in place
    return tuple(_build(item, arrays, ctx) for item in shape)


def as_plain(states, optimizer, index_update_count):
    """(arrays, values): the arrays by name (host copies) and the JSON-able rest of an updater's ``states`` and
    its ``optimizer``."""
    arrays = {}
    shapes = {str(index): _flatten(state, f"s{index}", arrays) for index, state in sorted(states.items())}
    values = {"format": FORMAT, "optimizer": optimizer_name(optimizer), "states": shapes,
              "index_update_count": {str(index): int(count) for index, count in index_update_count.items()},
              **{name: getattr(optimizer, name) for name in EVOLVING if hasattr(optimizer, name)}}
    return arrays, values


def save(trainer, path):
    """Write the trainer's optimizer state's arrays to ``path`` (an NDArray file); returns its plain values."""
    arrays, values = snapshot(trainer)
    mx.nd.save(path, arrays)
    return values


def file_kind(path):
    """'ndarray', 'pickle' or 'other', from the first bytes of ``path`` (nothing is parsed)."""
    with open(path, "rb") as f:
        head = f.read(len(NDARRAY_MAGIC))
    return "ndarray" if head == NDARRAY_MAGIC else "pickle" if head[:1] == b"\x80" else "other"


def refusal(path, state_path):
    """One line: why the optimizer state ``path`` (a pickle) is not loaded, and the command that converts it."""
    return (f"{path} holds the optimizer state as a Python pickle (a checkpoint written before this version), "
            "which can run code when loaded, so it is not loaded; if you trust where it came from, convert it "
            f"once with: python {CONVERTER} {state_path}")


def _key(index):
    return int(index) if index.lstrip("-").isdigit() else index


def restore(trainer, path, values, state_path):
    """Put the optimizer state of ``path`` (arrays) and ``values`` (from the state file ``state_path``) into
    ``trainer``: each updater gets its own copy on its own device. StateError when it is a pickle or does not fit
    this trainer's optimizer."""
    kind = file_kind(path)
    if kind == "pickle" or not values:
        raise StateError(refusal(path, state_path))
    if kind != "ndarray" or values.get("format") != FORMAT:
        raise StateError(f"{path} is not an optimizer state file this version reads (named by {state_path})")
    _ready(trainer)
    optimizer = trainer._optimizer
    if values["optimizer"] != optimizer_name(optimizer):
        raise StateError(f"the checkpoint {state_path} holds the state of --optimizer {values['optimizer']}, this "
                         f"run uses {optimizer_name(optimizer)}: resume with --optimizer {values['optimizer']}, or "
                         "start afresh with --resume none")
    try:
        arrays = mx.nd.load(path)
    except mx.base.MXNetError:
        raise StateError(f"{path} is damaged or not an optimizer state file (named by {state_path})") from None
    try:
        put(trainer, arrays, values)
    except (KeyError, TypeError):
        raise StateError(f"{path} does not hold the arrays {state_path} names") from None


def snapshot(trainer):
    """(arrays, values) of the trainer's optimizer state, as save() writes them: host copies and plain values
    (an elastic run's commit keeps them in memory)."""
    _ready(trainer)
    optimizer = trainer._updaters[0].optimizer
    optimizer._set_current_context(trainer._contexts[0].device_id)
    return as_plain(trainer._updaters[0].states, optimizer, optimizer._index_update_count)


def put(trainer, arrays, values):
    """Put the optimizer state (``arrays`` by name, ``values`` from as_plain) into ``trainer``, each updater's own
    copy on its own device. KeyError/TypeError when they do not fit."""
    _ready(trainer)
    optimizer = trainer._optimizer
    for updater, ctx in zip(trainer._updaters, trainer._contexts):
        updater.states = {_key(index): _build(shape, arrays, ctx) for index, shape in values["states"].items()}
        updater.states_synced = dict.fromkeys(updater.states, True)
        updater.optimizer = optimizer
    counts = {_key(index): count for index, count in values["index_update_count"].items()}
    for ctx in trainer._contexts:
        optimizer._all_index_update_counts[ctx.device_id] = dict(counts)
    optimizer._set_current_context(trainer._contexts[0].device_id)
    for name in EVOLVING:
        if name in values:
            setattr(optimizer, name, values[name])
