"""What can be known about a run before any worker starts, each check one line naming the problem and the fix.

start_checks.check_before_start runs these (with the flags' own checks, validate_args, and the memory estimate) in
runner's check of train.py's flags, so `./runner` and `./runner --dry-run` refuse them before launching, and at
a worker's start (train.py run by hand or under a launcher of the user's own). Cheap by design: the label check
reads what the start-up index check reads (a bounded sample of each record file) and the .lst lists beside
them; the resume check reads the checkpoint's state file and verifies its files, as the run would.
"""
import os
import tempfile

from rn50kit.config import settings
from rn50kit.data.protocol import DataError
from rn50kit.data.record_files import class_count_problem, label_problem, record_labels
from rn50kit.weights import checkpoint

TRAINING_MODES = ("train", "train_val")


def trains(cfg):
    """Whether the run writes a workspace (training; --test-io writes nothing)."""
    return cfg.fit.mode in TRAINING_MODES and not cfg.data.test_io


def problem(cfg, resume=True):
    """The first problem of ``cfg`` (a RunConfig, completed by train.py's configure) that is known before any worker
    starts, in one line, or None. ``resume``: the checkpoint too (at a worker's start fit.resume checks it after
    the workspace lock: a workspace another run holds is refused as busy first)."""
    return labels_problem(cfg) or workspace_problem(cfg) or (resume_problem(cfg) if resume else None)


def labels_problem(cfg):
    """Labels outside 0 to --num-classes - 1 in the records or their .lst lists (training and scoring)."""
    if cfg.fit.mode == "pred":
        return None
    try:
        labels = record_labels(cfg.data)
        bad = label_problem(cfg.data, cfg.model.num_classes)
    except DataError as error:
        return str(error)
    return bad or class_count_problem(cfg.data.data_train, cfg.data.data_val, cfg.model.num_classes,
                                               labels)[0]


def unwritable(folder):
    """Why ``folder`` cannot be made or written into, or None: a file written and removed in it, or in the
    nearest folder above it that exists (a permission check would pass for root on a read-only file system)."""
    existing = os.path.abspath(folder)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{existing} is a file, not a folder"
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".rn50-write-check-"):
            pass
    except OSError as error:
        return f"cannot write into {existing} ({error.strerror})"
    return None


def workspace_problem(cfg):
    """A training run's workspace (and a relative --model-prefix's folder in it) that cannot be written."""
    if not trains(cfg):
        return None
    prefix_folder = os.path.dirname(checkpoint.workspace_path(cfg.fit.workspace, cfg.fit.model_prefix))
    for flag, folder in (("--workspace", cfg.fit.workspace), ("--model-prefix", prefix_folder)):
        why = folder and unwritable(folder)
        if why:
            return f"{flag} {folder}: {why}; give a folder you can write to"
    return None


def checkpoint_prefix(cfg):
    """The path prefix of a training run's checkpoints (None for a run that does not train)."""
    if not trains(cfg):
        return None
    return os.path.abspath(checkpoint.workspace_path(cfg.fit.workspace, cfg.fit.model_prefix))


def resume_problem(cfg):
    """A checkpoint --resume cannot continue: a bad path, every checkpoint damaged, another architecture, or
    another dtype, layout or channel count (fit.resume's refusals, made before any worker starts)."""
    if not trains(cfg):
        return None
    try:
        state = checkpoint.resume_state(cfg.fit.resume, checkpoint_prefix(cfg))
    except checkpoint.CheckpointError as error:
        return str(error)
    if state is None:
        return None
    saved_model = state.get("model")
    if saved_model not in (None, cfg.model.name):
        return (f"the checkpoint {state['state_path']} comes from another architecture ({saved_model}; this run: "
                f"{cfg.model.name}); use another --workspace/--model-prefix or --resume none")
    run = {"dtype": cfg.fit.dtype, "conv_layout": cfg.model.conv_layout, "image_shape": list(cfg.data.image_shape)}
    return settings.resume_problem(state.get("args"), run, state.get("state_path"))
