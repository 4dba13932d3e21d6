"""--tensorboard DIR: the run as TensorBoard event files, written by tensorboardX (no TensorFlow or PyTorch).

Scalars, each with its step:
  train/loss, train/lr, train/images_per_s, train/loss_scale   every logged iteration (step: the samples the
                                                                run has read, which grows even when an elastic
                                                                run's new world has other steps per epoch)
  train/epoch_loss                                              every epoch (step: the epoch, from 1)
  val/top1, val/top5, val/loss                                  every validation (step: the epoch); with
                                                                --ema-decay validation scores the EMA weights,
                                                                named so: val_ema/top1, val_ema/top5, val_ema/loss
The run's settings (its "args" record) go once, at a fresh run's start, as TensorBoard's HParams.
"""
import numbers
import os
import time

from rn50kit.reporting.outputs import Output

WRITER_PACKAGE = "tensorboardX"


def hparams_of(args):
    """The run's settings as HParams accepts them: numbers, strings and booleans; lists as text; None left out."""
    values = {}
    for key, value in sorted(args.items()):
        if isinstance(value, (bool, numbers.Number, str)):
            values[key] = value
        elif isinstance(value, (list, tuple)):
            values[key] = ",".join(str(v) for v in value)
    return values


class TensorBoard(Output):
    """Writes event files into ``logdir`` (None: nothing, on the ranks but 0); ``args``: the run's settings;
    ``ema``: validation scores the EMA weights."""

    def __init__(self, logdir, args, ema=False):
        self.writer = None
        self.args = args or {}
        self.val_prefix = "val_ema" if ema else "val"
        if logdir:
            from tensorboardX import SummaryWriter  # optional: fit_flags.check says how to install it
            # tensorboardX names a file by the second it opens it: a run resumed within that second would
            # overwrite the last one's
            self.writer = SummaryWriter(logdir, filename_suffix=f".{os.getpid()}.{time.time_ns()}")

    @classmethod
    def open(cls, context):
        return cls(context.file(context.cfg.tensorboard), context.run.record.get("args"),
                   ema=context.cfg.ema_decay > 0)

    def run_start(self, first_epoch, last_epoch, resumed_from):
        if self.writer is None or resumed_from is not None:
            return
        from tensorboardX.summary import hparams
        # the metrics HParams' table shows beside the settings: the validation scalars themselves
        metrics = {f"{self.val_prefix}/{name}": None for name in ("top1", "top5", "loss")}
        for summary in hparams(hparams_of(self.args), metrics):
            self.writer.file_writer.add_summary(summary)

    def iteration(self, step):
        if self.writer is None:
            return
        for name, value in (("loss", step.loss), ("lr", step.lr), ("images_per_s", step.ips),
                            ("loss_scale", step.loss_scale)):
            self.writer.add_scalar(f"train/{name}", value, step.samples)

    def trained(self, epoch, metrics, durations, lr, seconds):
        if self.writer is not None:
            self.writer.add_scalar("train/epoch_loss", metrics["loss"], epoch)

    def validation(self, epoch, metrics, first):
        if self.writer is None:
            return
        for name in ("top1", "top5", "loss"):
            self.writer.add_scalar(f"{self.val_prefix}/{name}", metrics[name], epoch)

    def epoch_end(self, epoch, record):
        if self.writer is not None:
            self.writer.flush()

    def close(self):
        if self.writer is not None:
            self.writer.close()
            self.writer = None
