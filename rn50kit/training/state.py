"""What a run carries: its description (RunInfo), the loop's state from step to step and into checkpoints
(TrainState), one rank's running sums over an epoch (EpochStats), and those sums of an epoch a stop signal
interrupted, gathered into the checkpoint and handed back to the ranks on resume."""
import dataclasses
import time

from rn50kit.reporting.report import Report
from rn50kit.training.precision import LossScaler

PARTIAL_KEYS = ("loss", "steps", "correct1", "correct5", "samples")


def gather_partial(stats, dist, name):
    """Every rank's partial sums of an interrupted epoch, indexed by rank (a collective): the epoch's metrics are
    sums over the ranks, so the checkpoint keeps them all."""
    return [dict(zip(PARTIAL_KEYS, values)) for values in dist.gather(stats.sums(), name)]


def samples_read(train_iter, epoch, step, steps, batch_size):
    """The samples the run has read after micro-step ``step`` (of ``steps``, ``batch_size`` samples each) of
    ``epoch`` (0-based): TensorBoard's step, which grows through a run whose steps per epoch change. An elastic
    epoch (training/elastic.ElasticEpoch) counts from the samples its world started at, in the run's own epoch
    size: a new world's steps differ, its samples go on (back to the commit only when steps are redone)."""
    first = getattr(train_iter, "first_step", 0)
    epoch_samples = getattr(train_iter, "epoch_samples", steps * batch_size)
    start = getattr(train_iter, "consumed", first * batch_size)
    return epoch * epoch_samples + start + (step + 1 - first) * batch_size


def sum_partial(partials):
    return {k: sum(p[k] for p in partials) for k in PARTIAL_KEYS}


def resumed_partial(state, dist):
    """This rank's partial sums of the interrupted epoch, or None to start from zero.

    With as many ranks as the checkpoint has sums for, each rank takes its own, and the resumed epoch reports
    exactly what an uninterrupted run would. With another worker count (or a checkpoint holding only the sums in
    "partial"), rank 0 carries the sums and the other ranks start from zero: every sample still counts once."""
    ranks = state.get("partial_ranks")
    if ranks and len(ranks) == dist.size and not getattr(dist, "elastic", False):  # elastic: the commit holds one
        return dict(ranks[dist.rank])
    total = sum_partial(ranks) if ranks else state.get("partial")
    return dict(total) if total and dist.is_primary else None


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What train.py derived for this run, kept apart from the user's arguments: the model's name (checkpoints
    record it, resume checks it), the command line, where the report goes, and ``record``, the run's description
    saved in every checkpoint's state and the JSON log ({"args": every resolved value, "given": the flags typed,
    "derived": what the kit filled in})."""
    model_name: str
    arch: str
    command: list
    report_path: str
    record: dict
    # how the run started (e.g. --pretrained), for the report
    report_info: dict = dataclasses.field(default_factory=dict)
    # a training run's resolved configuration as TOML tables (written into its workspace when training starts)
    resolved_config: dict = None


@dataclasses.dataclass
class EpochStats:
    """One rank's running sums over an epoch (carried across an interruption through the checkpoint)."""
    loss: float = 0.0
    steps: float = 0.0
    correct1: float = 0.0
    correct5: float = 0.0
    samples: float = 0.0
    durations: list = dataclasses.field(default_factory=list)  # seconds per step run in this process
    started: float = dataclasses.field(default_factory=time.time)

    @classmethod
    def resumed(cls, partial):
        return cls(**partial) if partial else cls()

    def sums(self):
        return [getattr(self, key) for key in PARTIAL_KEYS]

    def add_hits(self, counted):
        """Add [(top-1 NDArray, top-5 NDArray, valid)] of a step."""
        for c1, c5, valid in counted:
            self.correct1 += c1.asscalar()
            self.correct5 += c5.asscalar()
            self.samples += valid


@dataclasses.dataclass
class TrainState:
    """Everything the loop carries from step to step and into checkpoints."""
    trainer: object
    scaler: LossScaler
    ema: object  # EMA or None
    schedule: object  # fractional epoch -> LR
    report: Report
    epoch: int = 0  # the next epoch to run (0-based)
    step: int = 0  # steps of that epoch already done (a checkpoint saved after a stop signal)
    best_top1: float = -1.0
    partial: dict = None  # this rank's sums of the interrupted epoch
    run_start: float = dataclasses.field(default_factory=time.time)
    train_seconds: float = 0.0  # in training steps, all runs of this training so far
    target: dict = None  # --target-top1 reached: {"top1", "reached_top1", "epoch", "train_seconds", "wall_seconds"}

    def elapsed(self):
        return self.report.total_duration + time.time() - self.run_start


RESUME_SETTINGS = ("batch_size", "image_shape", "num_epochs", "lr", "lr_schedule", "dtype")


def changed_on_resume(saved, now):
    """'--batch-size 64 (was 32), ...' for the settings that shape training and differ from the checkpoint's run."""
    def show(value):
        return ",".join(str(v) for v in value) if isinstance(value, list) else f"{value:g}" \
            if isinstance(value, float) else str(value)
    return ", ".join(f"--{key.replace('_', '-')} {show(now[key])} (was {show(saved[key])})" for key in RESUME_SETTINGS
                     if key in saved and key in now and show(saved[key]) != show(now[key]))
