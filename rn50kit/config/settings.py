"""What a run takes when the user does not say, MXNet-free: the data backend, precision and batch of this machine
(machine_defaults), the data files of a data root (those its backend's row names) and their indexes, the workspace
runs/<model>/, the settings a scored checkpoint was trained with applied over the defaults (a contradicting flag is
refused, not silently overridden), where a score is written, and whether a checkpoint can be resumed by this run.

train.py fills them in with rn50kit.training.configure.complete, which also asks this machine's devices and reads
the scored checkpoint; runner checks a command's flags with these alone.
"""
import argparse
import hashlib
import os

from rn50kit.common import backends, rules
from rn50kit.config import cli
from rn50kit.config.model_flags import model_name_from_args

RUNS_DIR = "runs"
# What a checkpoint's state records about the data the network expects: scoring or predicting with other values
# gives silently wrong answers (a 32-pixel digit resized to 256 and centre-cropped is a blur).
CHECKPOINT_SETTINGS = ("num_classes", "image_shape", "data_val_resize", "rgb_mean", "rgb_std", "batchnorm_eps")
MODEL_FLAGS = ("model", "arch", "num_layers", "num_groups")


def given_flags(parser, argv):
    """The destinations of the flags present in ``argv`` (typed by the user, or by runner), whatever their value."""
    probe = argparse.ArgumentParser(add_help=False)  # abbreviations resolve as in train.py's parser
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            kwargs = {"action": "store_const", "const": True} if action.nargs == 0 else {"nargs": action.nargs}
            probe.add_argument(*action.option_strings, dest=action.dest, default=argparse.SUPPRESS, **kwargs)
    return set(vars(probe.parse_known_args(list(argv))[0]))


def flag_name(dest):
    return "--" + dest.replace("_", "-")


CPU_BATCH_SIZE = 32  # the global batch without a GPU when none is given: ResNet-50 at 224 px in about 5 GiB


def machine_defaults(args, num_gpus, given=()):
    """runner's choices: float16 and dali-gpu with GPUs, float32 and dali-cpu without; and without a GPU a batch
    a CPU can hold (CPU_BATCH_SIZE, unless --batch-size is given: the parser's 192 is the GPUs')."""
    if not num_gpus and "batch_size" not in given:
        args.batch_size = CPU_BATCH_SIZE
    if args.dtype is None:
        args.dtype = "float16" if num_gpus else "float32"
    if args.data_backend is None:
        args.data_backend = backends.default(num_gpus > 0)


def fill_data_files(args):
    """--data-root DIR gives the data files of DIR the backend's row names for the mode (those that exist; see
    backends.RootLayout) for the splits not given one by one; without any data flag the default root is used, as
    runner does; with --dtype int8 the training file too, when present (calibration). Each index defaults to the one
    beside its data file."""
    layout = backends.root_layout(args.data_backend)
    needed, optional = layout.splits_for(args.mode)
    if needed and (args.data_root or not (args.data_train or args.data_val)):
        root = args.data_root or cli.DEFAULT_DATA_ROOT
        problem = cli.data_root_problem(root, layout)
        if problem:
            raise ValueError(problem)
        # INT8 calibrates on training records: the root's train file when present, as runner passes it
        calibration = ["train"] if getattr(args, "dtype", None) == "int8" and "train" in layout.splits() else []
        for split in dict.fromkeys(needed + optional + calibration):
            name = layout.files(split).data
            if not getattr(args, f"data_{split}") and backends.present(os.path.join(root, name), name):
                setattr(args, f"data_{split}", os.path.join(root, name))
        for split in needed:
            if not getattr(args, f"data_{split}"):
                raise ValueError(f"{os.path.join(root, layout.files(split).data)} is missing; {cli.PREPARE_HINT}")
    for split in layout.splits():
        if getattr(args, f"data_{split}") and not getattr(args, f"data_{split}_idx"):
            setattr(args, f"data_{split}_idx", layout.files(split).index_beside(getattr(args, f"data_{split}")))


def default_workspace(model_name):
    return os.path.join(RUNS_DIR, model_name)



def _differs(dest, given_value, saved_value):
    if dest == "image_shape":  # 3 or 4 input channels load into each other; height and width must agree
        return list(given_value)[1:] != list(saved_value)[1:]
    if isinstance(saved_value, list):
        return [float(v) for v in given_value] != [float(v) for v in saved_value]
    return given_value != saved_value


def apply_trained_settings(args, state, given, source):
    """Take the model and data settings of a checkpoint's state; a given flag that contradicts one is a
    ValueError naming both values. Keys a state lacks are left to the flags."""
    saved = dict(state.get("args") or {})
    saved_model = state.get("model") or saved.get("model_name")
    if saved_model:
        if given & set(MODEL_FLAGS):
            wanted = model_name_from_args(args)
            if wanted != saved_model:
                flags = " ".join(f"{flag_name(d)} {getattr(args, d)}" for d in MODEL_FLAGS if d in given)
                raise ValueError(f"{flags} asks for {wanted}, but {source} is a {saved_model} (another "
                                 "architecture); leave the model flags out to use the checkpoint's")
        args.model = saved_model
        for dest in ("arch", "num_layers", "num_groups"):
            if dest in saved:
                setattr(args, dest, saved[dest])
    for dest in CHECKPOINT_SETTINGS:
        if dest not in saved:
            continue
        value = saved[dest]
        if dest in given:
            if _differs(dest, getattr(args, dest), value):
                shown = ",".join(str(v) for v in value) if isinstance(value, list) else value
                raise ValueError(f"{flag_name(dest)} {_show(getattr(args, dest))} contradicts {source}, trained "
                                 f"with {flag_name(dest)} {_show(shown)}; leave the flag out to use the checkpoint's")
            if dest == "image_shape":
                value = [getattr(args, dest)[0]] + list(value)[1:]
        setattr(args, dest, list(value) if isinstance(value, list) else value)


def _show(value):
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value) if isinstance(value, list) \
        else str(value)


def score_tag(dtype, calib_mode=None, calib_batches=None):
    """What a score depends on besides the checkpoint: the dtype, and INT8's calibration."""
    return f"int8-{calib_mode}-{calib_batches}" if dtype == "int8" else dtype


def score_variant(val_tta, data_val, state):
    """What else a score depends on, for its file name: flip TTA (".flip"), and validation records from another
    folder than the checkpoint's run read (".on-<folder>-<hash of the path>"), so neither overwrites the plain
    score. ``state``: the checkpoint's (trained_settings), or None."""
    parts = [val_tta] if val_tta and val_tta != "none" else []
    state = state or {}
    # the run's folders: its training records' (absolute, in checkpoints since issue 58) and its --data-val's
    records, run_val = (state.get("train_records") or {}).get("rec"), (state.get("args") or {}).get("data_val")
    known = [os.path.dirname(os.path.abspath(path)) for path in (records, run_val) if path]
    folder = os.path.dirname(os.path.abspath(data_val)) if data_val else None
    if folder and known and folder not in known:
        parts.append(f"on-{os.path.basename(folder) or 'data'}-{hashlib.sha256(folder.encode()).hexdigest()[:6]}")
    return "".join(f".{part}" for part in parts)


def score_report_beside(params_path, tag):
    """runs/x/model-0016.params -> runs/x/model-0016.float32.score.json (``tag``: score_tag): each checkpoint's
    score beside it, one per dtype and calibration (an INT8 score does not overwrite the float32 one)."""
    return f"{os.path.splitext(params_path)[0]}.{tag}.score.json"




def bfloat16_unsupported(cpuinfo="/proc/cpuinfo"):
    """Why this CPU cannot run --dtype bfloat16 (rules.bfloat16_problem), or None."""
    return rules.bfloat16_problem("bfloat16", rules.cpu_flags(cpuinfo))


# What a checkpoint's weights and optimizer state are shaped by, beyond the architecture: a float16 network keeps
# float16 weights with float32 master copies in its optimizer state (multi-precision SGD), NHWC convolutions keep
# (O, kh, kw, I) weights and momenta, a 4-channel stem has another weight shape. The weights alone convert
# (models.load_parameters); the optimizer state and EMA shadow would not (MXNet fails at the first update:
# "multi_mp_sgd_mom_update expects 16 inputs, but got 48").
RESUME_SETTINGS = ("dtype", "conv_layout", "image_shape")


def _resume_view(saved):
    """(float16 or not, compute layout, input channels) of a state's or a run's "args"; None where unrecorded."""
    shape = saved.get("image_shape")
    return {"dtype": None if saved.get("dtype") is None else saved["dtype"] == "float16",
            "conv_layout": saved.get("conv_layout"),
            "image_shape": None if not shape else int(shape[0])}


def resume_problem(saved_args, run_args, state_path):
    """One line refusing to resume a checkpoint trained with another dtype, compute layout or channel count than
    this run, or None. Older checkpoints without these records are not refused."""
    saved, run = _resume_view(saved_args or {}), _resume_view(run_args or {})
    differ = [k for k in RESUME_SETTINGS if saved[k] is not None and run[k] is not None and saved[k] != run[k]]
    if not differ:
        return None
    def show(args):
        shape = args.get("image_shape") or []
        return f"--dtype {args.get('dtype')} --conv-layout {args.get('conv_layout')}, {shape[0] if shape else '?'} " \
               "input channels"
    return (f"{state_path} was trained with {show(saved_args)} and this run asks for {show(run_args)}: its optimizer "
            "state cannot continue in this network; start afresh with --resume none (the old run is moved aside), or "
            "train in another --workspace (or give the checkpoint's settings)")
