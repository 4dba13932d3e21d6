"""A run's resolved configuration (every field of every config as the run uses it, which `./runner --config`
replays): a training run's <workspace>/config.toml, written by rank 0 when training starts, once the run has passed
every check, resume's included, so a refused command leaves an earlier run's file as it was. Scoring and prediction
write theirs beside their output (train.py). Paths from the current directory are written absolute, so the file
replays from any directory; those inside the workspace (model_prefix, report, json_log, mllog,
tensorboard) stay as given, so a replay with --workspace elsewhere writes there."""
import os

from rn50kit.config import config_files
from rn50kit.reporting.outputs import Output

RESOLVED_CONFIG = "config.toml"
# {table: fields} naming files or folders from the current directory (--recipe PATH.toml is absolute already)
FROM_CURRENT_DIRECTORY = {"data": ("data_root", "data_train", "data_train_idx", "data_val", "data_val_idx"),
                          "fit": ("workspace", "load"), "finetune": ("pretrained",),
                          "predict": ("data_pred", "pred_out", "class_names")}


def with_absolute_paths(tables):
    """``tables`` with the paths of FROM_CURRENT_DIRECTORY made absolute (a glob stays a glob)."""
    return {name: {key: os.path.abspath(value) if key in FROM_CURRENT_DIRECTORY.get(name, ()) and value else value
                   for key, value in fields.items()}
            for name, fields in tables.items()}


class ResolvedConfig(Output):
    def __init__(self, path, tables):
        """``path``: where to write (None: not this rank, or not a training run); ``tables``: the TOML tables."""
        self.path, self.tables = path, tables

    @classmethod
    def open(cls, context):
        return cls(context.file(RESOLVED_CONFIG), context.run.resolved_config)

    def run_start(self, first_epoch, last_epoch, resumed_from):
        if self.path and self.tables:
            config_files.write_resolved(self.path, self.tables)
