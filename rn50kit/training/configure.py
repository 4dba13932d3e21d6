"""train.py's RunConfig, built once at its start from the parsed flags: the defaults that depend on this machine (its
devices), the data root, the model and, for --mode val/pred, the scored checkpoint (its saved settings, which a
contradicting flag cannot silently override) filled in, then every value checked. The Namespace stops here.

The parser and the MXNet-free defaults live in rn50kit.config (train_flags, settings); this step reads a
checkpoint and asks the machine, so it sits above them.
"""
import logging
import os

from rn50kit.common import rules
from rn50kit.config import settings, train_config, train_flags
from rn50kit.config.cli import UsageError
from rn50kit.config.model_flags import model_name_from_args
from rn50kit.hardware import devices
from rn50kit.weights import checkpoint


def configure(args, given, num_gpus):
    """The RunConfig of parsed flags: the defaults that depend on the machine, the data, a checkpoint and the
    recipe filled in, then every value checked (a UsageError). The Namespace stops here."""
    try:
        complete(args, given, num_gpus)
    except ValueError as error:
        raise UsageError(str(error))
    problem = rules.bfloat16_problem(args.dtype)  # this worker's CPU
    if problem:
        raise UsageError(problem)
    notes = train_flags.fill_hyper_parameters(args, given)
    cfg = train_config.from_args(args)
    train_flags.check_config(cfg)  # a refusal is the only line
    for note in notes:
        if args.mode in ("train", "train_val") and not args.test_io:  # --test-io trains nothing
            logging.info("%s", note)  # rank 0 only logs at INFO
    return cfg


def complete(args, given, num_gpus):
    """Fill every default that depends on the machine, the data root, the model or the scored checkpoint.
    Returns the checkpoint path scored or predicted with (or None). Raises ValueError for bad input."""
    settings.machine_defaults(args, num_gpus, given)
    settings.fill_data_files(args)
    workspace_given = args.workspace is not None
    if not workspace_given:
        args.workspace = settings.default_workspace(model_name_from_args(args))
    devices.apply_float16_gpu_defaults(args, given, num_gpus)  # NHWC, 4 channels: not flags the user typed
    if args.mode not in ("val", "pred"):
        return None
    if args.num_epochs is None:
        args.num_epochs = 1  # passes over the validation set, not the recipe's training epochs
    path = checkpoint.to_score(args.load, args.workspace, args.model_prefix)
    if path is None:
        return None
    if not os.path.isfile(path):
        raise ValueError(f"--load {path} does not exist")
    try:  # a damaged file is refused before its state's settings (or the defaults) are taken for it
        checkpoint.check_loadable(path)
    except checkpoint.CheckpointError as error:
        raise ValueError(str(error))
    state = checkpoint.trained_settings(path)
    if state is not None:
        settings.apply_trained_settings(args, state, given, path)
        devices.apply_float16_gpu_defaults(args, given, num_gpus)  # the 4th channel over the checkpoint's shape
    args.load = path
    if args.mode == "pred" and not workspace_given:  # the default predictions.csv goes beside the checkpoint, not
        args.workspace = os.path.dirname(os.path.abspath(path))  # into the default model's runs/resnet50_v1.5
    if args.report is None and args.mode == "val":
        tag = settings.score_tag(args.dtype, args.calib_mode, args.calib_batches) + \
            settings.score_variant(args.val_tta, args.data_val, state)
        args.report = os.path.abspath(settings.score_report_beside(path, tag))
    return path
