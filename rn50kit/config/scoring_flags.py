"""The scoring flags (INT8, Prediction): QuantizeConfig, PredictConfig, their argparse groups and the check of
--data-pred/--pred-out; the scoring and prediction they ask for are rn50kit/scoring's."""
import dataclasses
import os

from rn50kit.config import cli

# MXNet's third mode, 'none' (ranges measured at run time), gave near-uniform outputs here: not offered.
CALIB_MODES = ["naive", "entropy"]


@dataclasses.dataclass(frozen=True)
class QuantizeConfig:
    """The INT8 flags' values."""
    calib_batches: int = 10
    calib_mode: str = "naive"


def add_quantize_args(parser):
    group = parser.add_argument_group("INT8", "--dtype int8: scoring and prediction with oneDNN on the CPU")
    group.add_argument("--calib-batches", type=int,
                       help="int8: training batches (of --batch-size per worker) used to calibrate")
    group.add_argument("--calib-mode", choices=CALIB_MODES,
                       help="int8: naive (min/max of each layer's output), entropy (KL-optimal thresholds, slower "
                            "to calibrate)")
    parser.set_defaults(**cli.config_defaults(QuantizeConfig))
    return group


@dataclasses.dataclass(frozen=True)
class PredictConfig:
    """The Prediction flags' values."""
    data_pred: str = None
    class_names: str = None
    pred_out: str = None
    pred_top_k: int = 5


def add_pred_args(parser):
    group = parser.add_argument_group("Prediction", "--mode pred")
    group.add_argument("--data-pred",
                       help="pred: what to classify: an image (its top classes printed), or many: a folder (its "
                            "images, in subfolders too), a quoted glob ('photos/*/*.jpg'), or a list file (.txt or "
                            ".lst: a path per line, relative to the list's folder), written to --pred-out")
    group.add_argument("--pred-out", metavar="FILE",
                       help="pred: the predictions, one row per image (path, error, top-k names and probabilities): "
                            "CSV, or JSON for a .json name (relative: from the current directory; default "
                            "predictions.csv beside the checkpoint, or in --workspace, when --data-pred names many "
                            "images)")
    group.add_argument("--pred-top-k", type=int, help="pred: the classes listed per image (default 5)")
    group.add_argument("--class-names",
                       help="file with one class name per line, in label order (default: the names saved with the "
                            "checkpoint, else classes.txt or the .lst beside --data-train; training saves the "
                            "names in its checkpoints)")
    parser.set_defaults(**cli.config_defaults(PredictConfig))
    return group


LIST_SUFFIXES = (".txt", ".lst")  # --data-pred: a list of images, not one
OUT_SUFFIXES = (".csv", ".json")


def is_glob(pattern):
    return any(char in pattern for char in "*?[")


def check_pred_args(data_pred, pred_out=None, top_k=5):
    """Raise ValueError unless --data-pred names an existing file or folder, or a glob, and --pred-out a .csv or
    .json file."""
    if not data_pred:
        raise ValueError("--mode pred needs an image: --data-pred IMAGE (or a folder, a glob or a list file)")
    if not (os.path.exists(data_pred) or is_glob(data_pred)):
        raise ValueError(f"--data-pred {data_pred} does not exist")
    if pred_out and not pred_out.lower().endswith(OUT_SUFFIXES):
        raise ValueError(f"--pred-out {pred_out}: give a .csv or a .json file name")
    if top_k < 1:
        raise ValueError(f"--pred-top-k must be at least 1, got {top_k}")
