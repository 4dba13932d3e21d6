"""The training loop's outputs as one list: each output (the console, the JSON-lines log, the report, the MLPerf
log here; summary.csv, TensorBoard, the resolved config in modules of their own) is an Output that hears the loop's
events, and the loop tells an Outputs list, which tells each of them in turn. A run opens the outputs
output_table.py lists, each with its ``open(context)`` from the run's OutputContext: adding an output is one new
module and one row there (docs/extending.md, "An output").

Epochs are numbered from 1 in every event, as every output shows them.
"""
import dataclasses
import logging
from typing import Callable

from rn50kit.reporting.mlperf_log import MLPerfLog
from rn50kit.reporting.progress import JsonLog, Progress, format_seconds

log = logging.getLogger("rn50")


@dataclasses.dataclass(frozen=True)
class Step:
    """One training step (a micro-batch with --grad-accum-steps), as the loop reports it."""
    epoch: int
    step: int  # from 0, within the epoch
    steps: int  # in the epoch
    loss: float  # this step's mean loss
    mean_loss: float  # the epoch's so far
    lr: float
    speed: float  # images/s since the epoch (this run's part of it) began
    ips: float  # images/s of this step alone
    eta_seconds: float  # left in this run
    loss_scale: float
    samples: int = 0  # read by the run after this step, all epochs so far (TensorBoard's step)


@dataclasses.dataclass(frozen=True)
class OutputContext:
    """What a run gives its outputs when it opens them (fit.open_outputs); every rank opens them all."""
    cfg: object  # the FitConfig: the flags (cfg.batch_size, cfg.json_log, cfg.tensorboard, ...)
    run: object  # the run's description (state.RunInfo: record, report_path, resolved_config)
    report: object  # the report.Report the run fills (every rank keeps one; rank 0 saves it)
    is_primary: bool  # rank 0: the rank that writes files
    workers: int  # devices over all workers
    device: str  # "cpu" or "gpu"
    fresh: bool  # a new run, not a resumed one (nor an elastic run's new world)
    train_samples: Callable = None  # an epoch's samples, when asked (None: not known at this opening)
    rank0_file: Callable = None  # a file name in the workspace -> its path on rank 0, None on the other ranks

    def file(self, name):
        """Where this rank writes the workspace file ``name``: its path on rank 0; None elsewhere or without a name."""
        return self.rank0_file(name) if self.rank0_file and name else None


class Output:
    """One output of the loop: every event does nothing unless the output needs it."""

    @classmethod
    def open(cls, context):
        """This output for the run an OutputContext describes (output_table.py opens each row so), or None to stay
        out of this run."""
        raise NotImplementedError(f"{cls.__name__} has no open(context): output_table.py cannot open it")

    def run_start(self, first_epoch, last_epoch, resumed_from):
        """Training epochs ``first_epoch`` to ``last_epoch`` (none when first > last) begin; ``resumed_from``: the
        checkpoint state continued, or None for a fresh run."""

    def epoch_start(self, epoch):
        pass

    def iteration(self, step):
        """A Step done."""

    def steps_end(self, epoch, stopped):
        """The epoch's steps are over (``stopped``: part-way, by a stop signal; nothing else of it follows)."""

    def trained(self, epoch, metrics, durations, lr, seconds):
        """The epoch's training ``metrics`` over all ranks ({"top1", "top5" unless --no-metrics, "loss"}), this
        rank's step ``durations``, the LR at its end and its wall ``seconds``."""

    def validation_start(self, epoch):
        pass

    def validation(self, epoch, metrics, first):
        """scoring.evaluate's ``metrics`` after ``epoch``; ``first``: the training's first validation."""

    def epoch_end(self, epoch, record):
        """The epoch's metrics, {"train.loss": ..., "val.top1": ...}."""

    def run_end(self, epoch, finished, reached, stopped, total_duration, target):
        """The run ends after ``epoch``: ``finished`` training (its last epoch, or the target ``reached``), or
        ``stopped`` by a signal; ``total_duration``: seconds of all runs of this training; ``target``: the
        --target-top1 record, or None."""

    def world_changed(self, change):
        """An elastic run's world changed (training/elastic.py), told with the first step after it: {"epoch",
        "workers_before", "workers", "hosts_lost", "hosts_added", "steps_redone" (since the last commit),
        "detected_after" (seconds from the last step to the failure's notice, or None for hosts added),
        "seconds_lost" (from the last step before the change to the first after it), "plan", "time"}."""

    def close(self):
        pass


def describe_world_change(change):
    """The log's line for an elastic run's world change."""
    who = ", ".join([f"lost {host}" for host in change["hosts_lost"]] +
                    [f"added {host}" for host in change["hosts_added"]]) or "same hosts"
    found = "" if change["detected_after"] is None else \
        f"noticed {change['detected_after']:.1f} s after the last step, "
    lost = "" if change["seconds_lost"] is None else \
        f", the next step {change['seconds_lost']:.1f} s after the last one"
    return (f"Elastic: {change['workers_before']} -> {change['workers']} workers in epoch {change['epoch']} "
            f"({who}): {found}{change['steps_redone']} step(s) redone since the last commit{lost}; {change['plan']}")


class Outputs(Output):
    """The run's outputs: each event goes to every output, in the list's order."""

    def __init__(self, outputs=()):
        self.outputs = list(outputs)

    def _tell(self, event, *args):
        for output in self.outputs:
            getattr(output, event)(*args)

    def run_start(self, first_epoch, last_epoch, resumed_from):
        self._tell("run_start", first_epoch, last_epoch, resumed_from)

    def epoch_start(self, epoch):
        self._tell("epoch_start", epoch)

    def iteration(self, step):
        self._tell("iteration", step)

    def steps_end(self, epoch, stopped):
        self._tell("steps_end", epoch, stopped)

    def trained(self, epoch, metrics, durations, lr, seconds):
        self._tell("trained", epoch, metrics, durations, lr, seconds)

    def validation_start(self, epoch):
        self._tell("validation_start", epoch)

    def validation(self, epoch, metrics, first):
        self._tell("validation", epoch, metrics, first)

    def epoch_end(self, epoch, record):
        self._tell("epoch_end", epoch, record)

    def run_end(self, epoch, finished, reached, stopped, total_duration, target):
        self._tell("run_end", epoch, finished, reached, stopped, total_duration, target)

    def world_changed(self, change):
        self._tell("world_changed", change)

    def set_batch_size(self, batch_size):
        """The images of a step from now on, for the outputs that count them (an elastic run's new world)."""
        for output in self.outputs:
            if hasattr(output, "batch_size"):
                output.batch_size = batch_size

    def close(self):
        """Close every output, even when one fails (the first failure is raised after)."""
        failure = None
        for output in self.outputs:
            try:
                output.close()
            except Exception as error:  # noqa: BLE001 -- the others still close; raised below
                failure = failure or error
        if failure is not None:
            raise failure


class Console(Output):
    """progress.Progress (a bar per epoch, or a line every --disp-batches steps) and the epochs' summary lines;
    silent where the Progress is disabled (ranks but 0)."""

    def __init__(self, progress, batch_size):
        self.progress = progress
        self.batch_size = batch_size

    @classmethod
    def open(cls, context):
        cfg = context.cfg
        return cls(Progress(context.is_primary, cfg.disp_batches, num_epochs=cfg.num_epochs), cfg.batch_size)

    def iteration(self, step):
        self.progress.update(step.epoch, step.step + 1, step.steps, step.speed, step.mean_loss, step.lr,
                             step.eta_seconds)

    def steps_end(self, epoch, stopped):
        self.progress.end_epoch()

    def trained(self, epoch, metrics, durations, lr, seconds):
        if self.progress.enabled:
            log.info("Epoch[%d] train loss %.4f%s, %.1f img/s, time %s", epoch, metrics["loss"],
                     f" top1 {metrics['top1']:.4f}" if "top1" in metrics else "",
                     self.batch_size * len(durations) / max(sum(durations), 1e-9), format_seconds(seconds))

    def validation(self, epoch, metrics, first):
        if self.progress.enabled:
            log.info("Epoch[%d] validation top1 %.4f top5 %.4f loss %.4f (%d samples)", epoch,
                     metrics["top1"], metrics["top5"], metrics["loss"], metrics["samples"])

    def world_changed(self, change):
        if self.progress.enabled:
            self.progress.end_epoch()
            log.warning("%s", describe_world_change(change))


class JsonLines(Output):
    """progress.JsonLog (--json-log): the run's "params", a record per step ("iter") and per epoch, a "summary"."""

    def __init__(self, json_log, record):
        self.json_log = json_log
        self.record = record  # the run's description (state.RunInfo.record)

    @classmethod
    def open(cls, context):
        return cls(JsonLog(context.file(context.cfg.json_log)), context.run.record)

    def run_start(self, first_epoch, last_epoch, resumed_from):
        self.json_log.write("params", **self.record, resumed_from=resumed_from)

    def iteration(self, step):
        self.json_log.write("iter", epoch=step.epoch, step=step.step, loss=step.loss, lr=step.lr, ips=step.ips,
                            loss_scale=step.loss_scale)

    def epoch_end(self, epoch, record):
        self.json_log.write("epoch", epoch=epoch, **record)

    def run_end(self, epoch, finished, reached, stopped, total_duration, target):
        self.json_log.write("summary", total_duration=total_duration, stopped=stopped, target=target)

    def world_changed(self, change):
        self.json_log.write("world_change", **change)

    def close(self):
        self.json_log.close()


class ReportOutput(Output):
    """report.Report (--report): every epoch's metrics, the latest validation per class, saved at the run's end
    to ``path`` (None: kept in memory only, on the ranks but 0)."""

    def __init__(self, report, batch_size, path):
        self.report = report
        self.batch_size = batch_size
        self.path = path

    @classmethod
    def open(cls, context):
        return cls(context.report, context.cfg.batch_size, context.file(context.run.report_path))

    def trained(self, epoch, metrics, durations, lr, seconds):
        self.report.add_epoch("train", durations=durations, batch_size=self.batch_size, **metrics)
        self.report.add("train.lr", lr)

    def validation(self, epoch, metrics, first):
        self.report.add_epoch("val", epoch=epoch, top1=metrics["top1"], top5=metrics["top5"], loss=metrics["loss"],
                              durations=metrics["durations"], batch_size=self.batch_size)
        self.report.add_per_class(metrics.get("confusion"), epoch)  # the latest validation's, per class

    def world_changed(self, change):
        self.report.info.setdefault("world_changes", []).append(change)

    def run_end(self, epoch, finished, reached, stopped, total_duration, target):
        self.report.total_duration = total_duration
        if self.path:
            self.report.save(self.path)


class MLPerf(Output):
    """mlperf_log.MLPerfLog (--mllog): the MLPerf keys of a fresh run's start, each epoch and validation, and the
    end of training. ``train_samples()`` gives an epoch's samples (asked once, at a fresh run's start)."""

    def __init__(self, mllog, cfg, workers, device, train_samples, fresh):
        self.mllog = mllog
        self.cfg = cfg
        self.workers, self.device = workers, device
        self.train_samples = train_samples
        self.fresh = fresh

    @classmethod
    def open(cls, context):
        return cls(MLPerfLog(context.file(context.cfg.mllog), fresh=context.fresh), context.cfg, context.workers,
                   context.device, context.train_samples, context.fresh)

    def run_start(self, first_epoch, last_epoch, resumed_from):
        if self.cfg.mllog and self.fresh and first_epoch <= last_epoch:  # a resumed run continues the log
            self.mllog.run_begins(self.cfg, self.workers, self.device, self.train_samples())

    def epoch_start(self, epoch):
        self.mllog.epoch_start(epoch)

    def steps_end(self, epoch, stopped):
        if not stopped:
            self.mllog.epoch_stop(epoch)

    def validation_start(self, epoch):
        self.mllog.eval_start(epoch)

    def validation(self, epoch, metrics, first):
        self.mllog.eval_result(epoch, metrics["top1"], metrics["samples"], first=first)

    def run_end(self, epoch, finished, reached, stopped, total_duration, target):
        if finished:
            self.mllog.run_ends(reached, epoch)

    def world_changed(self, change):
        """Not an MLPerf key (the rules have no elastic runs): a point in time the checker passes over."""
        self.mllog.event("elastic_world_change", change["workers"], workers_before=change["workers_before"],
                         hosts_lost=change["hosts_lost"], hosts_added=change["hosts_added"],
                         steps_redone=change["steps_redone"], seconds_lost=change["seconds_lost"])

    def close(self):
        self.mllog.close()
