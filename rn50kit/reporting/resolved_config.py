"""A training run's resolved configuration, <workspace>/config.toml (every field of every config as the run uses
it, which `./runner --config` replays), written by rank 0 when training starts: once the run has passed every
check, resume's included, so a refused command leaves an earlier run's file as it was."""
from rn50kit.common import config_files
from rn50kit.reporting.outputs import Output

RESOLVED_CONFIG = "config.toml"


class ResolvedConfig(Output):
    def __init__(self, path, tables):
        """``path``: where to write (None: not this rank, or not a training run); ``tables``: the TOML tables."""
        self.path, self.tables = path, tables

    def run_start(self, first_epoch, last_epoch, resumed_from):
        if self.path and self.tables:
            config_files.write_resolved(self.path, self.tables)
