"""The training loop and its phases: prepare or resume the state, train an epoch, validate, save, stop on a signal.

Its helpers live in modules named for them: in rn50kit/training, state.py (the run's state, the partial sums of an
interrupted epoch), optimizers.py (the optimizer and trainer), targets.py (soft targets, mixup, CutMix, the loss),
ema.py, stop_signals.py, distributed.py (collectives), precision.py (loss scaling and the finite checks);
weights/checkpoint.py (files); config/fit_flags.py (FitConfig, the flags) and config/lr_schedules.py; scoring/scoring.py
(evaluation); reporting/output_table.py (the outputs the loop tells: console, JSON-lines log, report, MLPerf log)."""
import dataclasses
import logging
import math
import time

import numpy as np
from mxnet import autograd, gluon

from models import running_stats
from rn50kit.config import lr_schedules, settings
from rn50kit.config.finetune_flags import FinetuneConfig
from rn50kit.data import identity
from rn50kit.reporting import output_table
from rn50kit.reporting.outputs import OutputContext, Outputs, Step
from rn50kit.reporting.progress import format_seconds
from rn50kit.reporting.report import Report
from rn50kit.reporting.summary_csv import SUMMARY_CSV
from rn50kit.scoring.scoring import evaluate, split, topk_counts, valid_counts, with_tta
from rn50kit.training import distributed, optimizers
from rn50kit.training.distributed import Distributed, average_over_devices
from rn50kit.training.ema import EMA
from rn50kit.training.optimizers import accumulate_gradients, zero_accumulated
from rn50kit.training.precision import StatsGuard, grads_finite, make_loss_scaler
from rn50kit.training.state import (
    EpochStats,
    TrainState,
    changed_on_resume,
    gather_partial,
    resumed_partial,
    samples_read,
    sum_partial,
)
from rn50kit.training.stop_signals import StopFlag
from rn50kit.training.targets import make_loss, make_targets, mean_loss
from rn50kit.training.workspace import set_aside_superseded
from rn50kit.weights import checkpoint, optimizer_state
from rn50kit.weights.checkpoint import workspace_path
from rn50kit.weights.pretrained import backbone_lr_mult, set_backbone_lr_mult

log = logging.getLogger("rn50")


class TrainingError(Exception):
    """The run cannot go on (diverged, bad checkpoint): reported as one line."""


def train_step(net, trainer, scaler, loss_fn, datas, targets, batch_size, guard=None, vote=None,
               scan_grads=True, update=True, earlier_ok=True):
    """One step over the per-device slices; returns (mean loss, outputs, applied).

    Gradient accumulation (parameters with grad_req 'add'): ``update=False`` for each micro-batch but the last,
    which only adds its gradients (applied: None); the last one's step allreduces and applies the sum, with
    ``batch_size`` the images of all micro-batches and ``earlier_ok`` whether the earlier micro-batches' losses
    were finite, then zeroes the gradients.

    The update is skipped when the loss of any rank is NaN/inf (``vote(local_ok)`` tells whether every rank's
    is finite) or, with ``scan_grads`` (float16, where gradients overflow while the loss stays finite), when
    any gradient is, checked after the allreduce so every rank agrees. A bad loss never reaches the weights,
    nor (with ``guard``) the BatchNorm statistics. float32/bfloat16 need no scan (a finite loss has finite
    gradients in their range), which matters on CPU, where the scan costs up to half a step.
    """
    if guard is not None:
        guard.keep()
    with autograd.record():
        outputs = [net(x).astype("float32") for x in datas]
        losses = [loss_fn(out, t) for out, t in zip(outputs, targets)]
        scaled = [loss * scaler.scale for loss in losses] if scaler.scale != 1 else losses
    autograd.backward(scaled)
    if not update:
        return mean_loss(losses), outputs, None
    loss, finite = apply_step(trainer, scaler, losses, batch_size, guard, vote, scan_grads, earlier_ok)
    return loss, outputs, finite


def apply_step(trainer, scaler, losses, batch_size, guard=None, vote=None, scan_grads=True, earlier_ok=True):
    """train_step after backward: allreduce (an elastic run's returns done, the vote then the only collective in
    flight: optimizers.one_dtype_at_a_time), vote, scan, update (or not); returns (mean loss, applied)."""
    trainer.allreduce_grads()
    # Reading the loss waits for the forward pass only: backward and allreduce are queued and keep the device
    # busy meanwhile. The gradient scan waits for them, as the update needs. Nothing waits for the update: the
    # next step's reads do, so at most one step is ever queued.
    loss = mean_loss(losses)
    finite = (vote or bool)(earlier_ok and math.isfinite(loss))
    if finite and scan_grads:
        finite = grads_finite(trainer._params)
    if finite:
        trainer.update(batch_size * scaler.scale)
    elif guard is not None:
        guard.restore_if_bad()
    zero_accumulated(trainer._params)
    scaler.update(finite)
    return loss, finite


def prepare(cfg, run, net, ctxs, dist, broadcast=True):
    """A fresh TrainState: optimizer, loss scaler, EMA, LR schedule, report; rank 0's weights on every rank (an
    elastic run's first sync broadcasts them instead: ``broadcast`` False)."""
    optimizers.set_wd_groups(net, decay_all=cfg.wd_bn_bias)
    if cfg.grad_accum_steps > 1:
        accumulate_gradients(net.collect_params())
    if broadcast:
        dist.broadcast_parameters(net)  # rank 0's initial weights everywhere; identical updates keep them equal
    return TrainState(
        trainer=optimizers.trainer_for(net, dist, cfg),
        scaler=make_loss_scaler(cfg.loss_scale, cfg.dtype),
        ema=EMA(net, cfg.ema_decay) if cfg.ema_decay else None,
        schedule=lr_schedules.get_schedule(cfg.lr_schedule, cfg.lr, cfg.num_epochs, cfg.warmup_epochs,
                                        cfg.lr_steps, cfg.lr_factor, cfg.lr_power, cfg.lr_end),
        report=Report(model=run.model_name, ngpus=dist.size * len(ctxs), cmd=run.command, info=run.report_info,
                      untimed_iters=cfg.untimed_iters))


def resume(state, checkpoint_state, run, net, ctxs, dist):
    """Continue ``state`` from a checkpoint's state (checkpoint.find_latest/read_state): weights, optimizer, loss
    scale, EMA, metrics so far, where to start, and this rank's sums of an interrupted epoch."""
    saved_model = checkpoint_state.get("model")
    if saved_model not in (None, run.model_name):
        raise TrainingError(f"the checkpoint {checkpoint_state['state_path']} comes from another architecture "
                            f"({saved_model}; this run: {run.model_name}); use another --workspace/--model-prefix "
                            "or --resume none")
    problem = settings.resume_problem(checkpoint_state.get("args"), run.record.get("args"),
                                      checkpoint_state.get("state_path"))
    if problem:  # another dtype, layout or channel count: refused before anything is loaded
        raise TrainingError(problem)
    problem = identity.changed_records_problem(checkpoint_state.get("train_records"), run.record.get("train_records"),
                                               checkpoint_state["state_path"])
    if problem:  # the data set was rebuilt or swapped under the workspace
        raise TrainingError(problem)
    paths = checkpoint_state["paths"]
    checkpoint.load_params(net, paths["params"], ctxs)  # on every device: MXNet asserts the set
    try:  # arrays and plain values only: a checkpoint's optimizer state never runs code
        optimizer_state.restore(state.trainer, paths["states"], checkpoint_state.get("optimizer_state"),
                                checkpoint_state["state_path"])
    except optimizer_state.StateError as error:
        raise TrainingError(str(error)) from None
    state.scaler.load(checkpoint_state["loss_scaler"])
    if state.ema is not None and "ema" in paths:
        state.ema.load(paths["ema"])
    state.epoch, state.step = checkpoint_state["epoch"], checkpoint_state["step"]
    state.best_top1 = checkpoint_state["best_top1"]
    state.report.metrics.update(checkpoint_state["metrics"])
    state.report.per_class = checkpoint_state.get("per_class")  # the latest validation's, until the next one
    state.report.total_duration = checkpoint_state.get("total_duration", 0.0)
    state.partial = resumed_partial(checkpoint_state, dist)
    state.train_seconds = checkpoint_state.get("train_seconds", 0.0)
    state.target = checkpoint_state.get("target")
    if state.target:
        state.report.info["target"] = state.target
    if dist.is_primary:
        log.info("Resuming from %s: %s", checkpoint_state["state_path"], f"after epoch {state.epoch}"
                 if not state.step else f"epoch {state.epoch + 1}, step {state.step}")
        changes = changed_on_resume(checkpoint_state.get("args") or {}, run.record.get("args") or {})
        if changes:
            log.info("Note: this run continues the checkpoint with other settings: %s", changes)


def save_checkpoint(prefix, net, state, run, epoch, step, keep_last, seed, partials=None, best=False):
    """Rank 0: parameters, optimizer and the loop's state after ``step`` steps of ``epoch`` (0: a whole epoch),
    with each rank's sums of an interrupted epoch (``partials``); keeps the newest ``keep_last``."""
    saved = {"epoch": epoch, "step": step, "model": run.model_name, "best_top1": state.best_top1,
             "loss_scaler": state.scaler.state(), "metrics": state.report.metrics, "seed": seed,
             "total_duration": state.elapsed(), "train_seconds": state.train_seconds, "target": state.target,
             "partial": partials and sum_partial(partials),
             "partial_ranks": partials, "per_class": state.report.per_class, **run.record}
    if best and state.ema is not None:
        best = state.ema.exported  # validation scored the EMA weights: those are the best, not the live ones
        saved["best_weights"] = "ema"
    path = checkpoint.save(prefix, net, state.trainer, saved, state.ema.saveable() if state.ema else None, best)
    log.info("Saved checkpoint %s", path)
    checkpoint.prune(prefix, keep_last)


def average_statistics(net, ema, dist):
    """Each device and rank keeps its own BatchNorm statistics (and EMA of them): average them so validation and
    checkpoints do not depend on the device or rank. Collective names stay the same from epoch to epoch, so
    Horovod's response cache keeps serving them."""
    average_over_devices(running_stats(net))  # the devices of one process (--kv-store device)
    dist.average_(running_stats(net), "bn")
    if ema is not None:
        dist.average_(ema.running_stats(), "ema.bn")


@dataclasses.dataclass
class Loop:
    """What every step of a run shares and does not change: the pieces train_one_epoch needs besides the state."""
    net: object
    ctxs: list
    dist: Distributed
    stop: StopFlag
    guard: StatsGuard
    end_epoch: int
    num_classes: int
    loss_fn: object = dataclasses.field(default_factory=lambda: gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False))
    outputs: Outputs = dataclasses.field(default_factory=Outputs)  # none by default (a loop driven by a test)
    after_update: object = None  # (epoch, step, stats, counted) after each optimizer step: an elastic run's commits


def epoch_steps(cfg, train_iter, skip):
    """The steps of an epoch that train: whole optimizer steps only (the last few batches of an epoch are left
    out), at most --benchmark-iters. A resumed epoch (from step ``skip``) must start at an optimizer step."""
    accum = cfg.grad_accum_steps
    steps = len(train_iter) if cfg.benchmark_iters is None else min(len(train_iter), cfg.benchmark_iters)
    steps -= steps % accum
    if steps == 0:
        raise TrainingError(f"an epoch has fewer batches ({len(train_iter)}) than --grad-accum-steps {accum}")
    if skip % accum:
        raise TrainingError(f"the checkpoint stopped after batch {skip} of the epoch, inside an accumulation of "
                            f"--grad-accum-steps {accum}: resume with the run's own --grad-accum-steps")
    return steps


def step_targets(cfg, loop, epoch, step, datas, labels):
    """The step's inputs and soft targets per device: smoothing, mixup or CutMix (not in the last
    --mixup-off-epochs). Their draws depend only on (seed, epoch, rank, step), so a resumed run draws the same."""
    mix_off = epoch >= cfg.num_epochs - cfg.mixup_off_epochs
    rng = np.random.RandomState(None if cfg.seed is None else [cfg.seed, epoch, loop.dist.rank, step])
    pairs = [make_targets(label, loop.num_classes, cfg.label_smoothing, 0.0 if mix_off else cfg.mixup, rng, data,
                          0.0 if mix_off else cfg.cutmix, cfg.mixup_switch_prob) for data, label in zip(datas, labels)]
    return [pair[0] for pair in pairs], [pair[1] for pair in pairs]


def update_skipped(cfg, loop, scaler, epoch, step):
    """An optimizer step skipped for a NaN/inf loss or gradient: a warning, and the end of the run when too many
    come in a row."""
    if cfg.grad_accum_steps > 1:
        loop.guard.restore_if_bad()  # BatchNorm statistics as before the accumulation's first batch
    log.warning("Epoch[%d] Batch[%d]: non-finite loss/gradient, update skipped (loss scale now %g)",
                epoch + 1, step + 1, scaler.scale)
    if scaler.bad_steps >= cfg.max_bad_steps:
        raise TrainingError(f"{scaler.bad_steps} consecutive steps had NaN/inf loss or gradients "
                            f"(epoch {epoch + 1}, step {step + 1}); lower --lr or use float32")


def train_one_epoch(cfg, loop, state, train_iter, epoch, skip=0):
    """Train ``epoch`` (0-based) from step ``skip``; returns (EpochStats of this rank, steps in the epoch,
    the step after which a stop signal ended it, or None)."""
    net, ctxs, dist, accum = loop.net, loop.ctxs, loop.dist, cfg.grad_accum_steps
    first = getattr(train_iter, "first_step", 0)  # an elastic run's epoch goes on from its last commit
    skip = max(skip, first)
    steps = epoch_steps(cfg, train_iter, skip)
    updates = steps // accum  # optimizer steps in the epoch
    stats = EpochStats.resumed(state.partial)
    state.partial = None
    step_batch = cfg.batch_size // dist.size * len(ctxs) if cfg.kv_store == "horovod" else cfg.batch_size
    tic = epoch_tic = stats.started
    counted = []  # the last step's top-k hits, still on the device
    group_loss, group_ok = 0.0, True  # the micro-batches of the optimizer step under way
    for step, batch in enumerate(train_iter, first):
        if step >= steps:
            break
        if step < skip:  # resumed inside an epoch: the reseeded reader replays the same batches
            tic = time.time()
            continue
        first, last = step % accum == 0, step % accum == accum - 1
        if first:  # the LR of this optimizer step
            lr = state.schedule(epoch + step // accum / updates)
            state.trainer.set_learning_rate(lr)
            if accum > 1:
                loop.guard.keep()
        datas, labels = split(batch, ctxs, cfg.dtype)
        loss, outputs, applied = train_step(net, state.trainer, state.scaler, loop.loss_fn,
                                            *step_targets(cfg, loop, epoch, step, datas, labels), step_batch * accum,
                                            loop.guard if accum == 1 else None, loop.stop.vote,
                                            scan_grads=cfg.dtype == "float16" or state.scaler.dynamic,
                                            update=last, earlier_ok=group_ok)
        group_loss += loss
        group_ok = group_ok and math.isfinite(loss)
        if applied is False:
            update_skipped(cfg, loop, state.scaler, epoch, step)
        elif applied and state.ema is not None:
            state.ema.update()
        if applied:
            stats.loss += group_loss
            stats.steps += accum
        if last:
            group_loss, group_ok = 0.0, True
        if not cfg.no_metrics:
            # Read one step late: the device has long finished them, so reading never stalls its queue.
            stats.add_hits(counted)
            counted = [(*topk_counts(out, label, valid), valid) for out, label, valid in
                       zip(outputs, labels, valid_counts(batch, [out.shape[0] for out in outputs]))]
        if last and loop.after_update is not None:
            loop.after_update(epoch, step, stats, counted)
        now = time.time()
        stats.durations.append(now - tic)
        tic = now
        speed = cfg.batch_size * (step + 1 - skip) / max(now - epoch_tic, 1e-9)
        left = (steps - step - 1) + (loop.end_epoch - epoch - 1) * steps
        loop.outputs.iteration(Step(epoch + 1, step, steps, loss, stats.loss / max(stats.steps, 1), lr, speed,
                                    cfg.batch_size / stats.durations[-1], left * cfg.batch_size / max(speed, 1e-9),
                                    state.scaler.scale, samples_read(train_iter, epoch, step, steps, cfg.batch_size)))
        if last and loop.stop.agreed and step + 1 < steps:  # stops only between optimizer steps
            stats.add_hits(counted)
            return stats, steps, step + 1
    stats.add_hits(counted)
    return stats, steps, None


def validate(net, ema, val_iter, ctxs, dist, dtype, no_metrics, max_iters=None):
    """evaluate() with the EMA weights when there are any (the live weights are put back after)."""
    if ema is not None:
        ema.swap()
    try:
        return evaluate(net, val_iter, ctxs, dist, dtype, no_metrics, max_iters)
    finally:
        if ema is not None:
            ema.swap()


def record_train_epoch(cfg, loop, state, stats, epoch):
    """The epoch's training metrics, summed over the ranks, to the outputs; returns them for the epoch's record."""
    sums = loop.dist.sum(stats.sums(), "train")
    loss = sums[0] / max(sums[1], 1)
    values = {} if cfg.no_metrics else {"top1": sums[2] / max(sums[4], 1), "top5": sums[3] / max(sums[4], 1)}
    loop.outputs.trained(epoch + 1, {**values, "loss": loss}, stats.durations, state.schedule(epoch + 1 - 1e-9),
                         time.time() - stats.started)
    return {"train.loss": loss, **{f"train.{k}": v for k, v in values.items()}}


def validate_epoch(cfg, loop, state, val_iter, epoch):
    """Validate after ``epoch`` (0-based), tell the outputs; returns the metrics for the epoch's record and top-1."""
    loop.outputs.validation_start(epoch + 1)
    metrics = validate(with_tta(loop.net, cfg.val_tta), state.ema, val_iter, loop.ctxs, loop.dist, cfg.dtype,
                       cfg.no_metrics, cfg.benchmark_iters)
    loop.outputs.validation(epoch + 1, metrics, first=not state.report.metrics.get("val.top1"))
    return {"val.top1": metrics["top1"], "val.top5": metrics["top5"], "val.loss": metrics["loss"],
            "val.samples": metrics["samples"]}, metrics["top1"]


def evaluation_due(cfg, epoch, last):
    """--eval-every/--eval-offset: validate after ``epoch`` (0-based)? Always after the last epoch of the run."""
    return last or (epoch >= cfg.eval_offset and (epoch - cfg.eval_offset) % cfg.eval_every == 0)


def target_reached(cfg, state, top1, epoch):
    """--target-top1: record (in the state, saved with checkpoints, and the report) the first validation at or
    above it; returns whether it is reached."""
    if cfg.target_top1 is None or top1 < cfg.target_top1:
        return False
    state.target = {"top1": cfg.target_top1, "reached_top1": top1, "epoch": epoch + 1,
                    "train_seconds": state.train_seconds, "wall_seconds": state.elapsed()}
    state.report.info["target"] = state.target
    log.info("Target top-1 %g reached at epoch %d (top-1 %.4f) after %s of training, %s in all", cfg.target_top1,
             epoch + 1, top1, format_seconds(state.train_seconds), format_seconds(state.target["wall_seconds"]))
    return True


def run_epoch(cfg, loop, state, epoch, train_iter, val_iter, save):
    """Train ``epoch`` (0-based), validate when due, save when due; ``save(epoch, step, partials=None,
    best=False)`` writes a checkpoint. Returns (stopped by a signal, target reached)."""
    stats, steps, stopped_at = train_one_epoch(cfg, loop, state, train_iter, epoch,
                                               skip=state.step if epoch == state.epoch else 0)
    state.train_seconds += sum(stats.durations)
    loop.outputs.steps_end(epoch + 1, stopped_at is not None)
    if stopped_at is not None:  # a stop signal: save this epoch's progress and end
        average_statistics(loop.net, state.ema, loop.dist)  # as at the epoch's end: each rank's averages differ
        partials = gather_partial(stats, loop.dist, "partial")
        if loop.dist.is_primary:
            save(epoch, stopped_at, partials)
        return True, False
    record = record_train_epoch(cfg, loop, state, stats, epoch)
    average_statistics(loop.net, state.ema, loop.dist)
    improved = reached = False
    last = epoch + 1 == loop.end_epoch
    if val_iter is not None and cfg.mode == "train_val" and evaluation_due(cfg, epoch, last):
        validated, top1 = validate_epoch(cfg, loop, state, val_iter, epoch)
        record.update(validated)
        improved = top1 > state.best_top1
        state.best_top1 = max(state.best_top1, top1)
        reached = target_reached(cfg, state, top1, epoch)
    loop.outputs.epoch_end(epoch + 1, record)
    due = cfg.save_frequency > 0 and (epoch + 1) % cfg.save_frequency == 0
    if loop.dist.is_primary and (due or last or improved or reached):
        save(epoch + 1, 0, best=improved)
    if reached:
        return False, True
    if loop.stop.agreed_now() and not last:
        if loop.dist.is_primary and not (due or improved):
            save(epoch + 1, 0)
        return True, False
    return False, False


def start(cfg, run, net, ctxs, dist, prefix, broadcast=True):
    """A prepared state, resumed as --resume says (the files of a run not continued set aside); returns it and
    the checkpoint state resumed, or None."""
    state = prepare(cfg, run, net, ctxs, dist, broadcast)
    resumed = distributed.chosen_by_rank_0(lambda warn: checkpoint.resume_state(cfg.resume, prefix, warn), dist,
                                           log.warning)
    if resumed is not None:
        resume(state, resumed, run, net, ctxs, dist)
    if cfg.resume != "auto" and dist.is_primary:
        moved = set_aside_superseded(cfg.workspace, cfg.model_prefix, resumed,
                                     [run.report_path, cfg.json_log, SUMMARY_CSV, cfg.mllog, cfg.tensorboard])
        if moved:
            log.info("--resume %s: moved the files of the run not continued to %s", cfg.resume, moved)
    return state, resumed


def planned_end(cfg, state, dist):
    """The epoch (0-based, exclusive) this run trains up to: --run-epochs, and none left once the target is
    reached."""
    end_epoch = cfg.num_epochs if cfg.run_epochs < 0 else min(cfg.num_epochs, state.epoch + cfg.run_epochs)
    if state.target is not None:
        end_epoch = state.epoch  # reached in an earlier run: nothing left to do
        if dist.is_primary:
            log.info("The target top-1 %g was reached at epoch %d already; --resume none starts afresh",
                     state.target["top1"], state.target["epoch"])
    elif state.epoch >= end_epoch and dist.is_primary:
        log.info("All %d epochs are done already; --num-epochs N continues, --resume none starts afresh",
                 cfg.num_epochs)
    return end_epoch


def open_outputs(cfg, run, report, dist, ctxs, fresh, train_samples):
    """The run's outputs (reporting/output_table.py's rows, in order), opened for this run; their files are rank 0's.
    ``fresh``: not resumed; ``train_samples()``: an epoch's samples."""
    def rank0_file(name):
        return workspace_path(cfg.workspace, name) if dist.is_primary and name else None
    return output_table.open_outputs(OutputContext(
        cfg=cfg, run=run, report=report, is_primary=dist.is_primary, workers=dist.size * len(ctxs),
        device=ctxs[0].device_type, fresh=fresh, train_samples=train_samples, rank0_file=rank0_file))


def train_epochs(cfg, loop, state, epochs, epoch_iter, val_iter, save, finetune):
    """Train ``epochs`` (a range, 0-based) until a stop signal or the target; returns (stopped by a signal,
    target reached, the last epoch begun, 1-based)."""
    stopped = reached = False
    last_epoch = epochs.start
    for epoch in epochs:
        last_epoch = epoch + 1
        loop.outputs.epoch_start(epoch + 1)
        if finetune.changes_lr:  # Gluon's trainers read lr_mult at every update
            set_backbone_lr_mult(loop.net, backbone_lr_mult(epoch, finetune.backbone_lr_mult,
                                                            finetune.freeze_backbone_epochs))
        stopped, reached = run_epoch(cfg, loop, state, epoch, epoch_iter(epoch), val_iter, save)
        if stopped or reached:
            break
    return stopped, reached, last_epoch


def fit(cfg, run, net, make_train_iter, val_iter, ctxs, dist, num_classes, finetune=FinetuneConfig(),
        elastic=None):
    """Train ``net`` (initialised, hybridized; ``num_classes`` outputs) as ``cfg`` (a FitConfig) says, ``run``
    describing the run, the backbone's LR as ``finetune`` says, ``elastic`` (training/elastic.py) for a run whose
    workers come and go; returns (report, stopped_by_signal)."""
    prefix = workspace_path(cfg.workspace, cfg.model_prefix)
    state, resumed = start(cfg, run, net, ctxs, dist, prefix, elastic is None)
    first_epoch = state.epoch
    # The first epoch's pipeline, built once: the MLPerf log asks for an epoch's samples before the epoch begins
    # (asking make_train_iter twice would build epoch 0's pipeline again under --seed).
    first_iter = []

    def epoch_iter(epoch):
        return first_iter.pop() if epoch == first_epoch and first_iter else make_train_iter(epoch)

    def train_samples():
        first_iter[:] = first_iter or [make_train_iter(first_epoch)]
        return len(first_iter[0]) * cfg.batch_size
    run_outputs = open_outputs(cfg, run, state.report, dist, ctxs, resumed is None, train_samples)
    end_epoch = planned_end(cfg, state, dist)
    loop = Loop(net=net, ctxs=ctxs, dist=dist, stop=StopFlag(dist), guard=StatsGuard(net), end_epoch=end_epoch,
                num_classes=num_classes, loss_fn=make_loss(cfg), outputs=run_outputs)
    run_outputs.run_start(first_epoch + 1, end_epoch, resumed and resumed["state_path"])

    def save(epoch, step, partials=None, best=False):
        save_checkpoint(prefix, net, state, run, epoch, step, cfg.keep_last, cfg.seed, partials, best)

    def end_run(stopped, reached, last_epoch):
        finished = loop.end_epoch > first_epoch and not stopped and (reached or loop.end_epoch == cfg.num_epochs)
        loop.outputs.run_end(last_epoch, finished, reached, stopped, state.elapsed(), state.target)  # rank 0's now

    if elastic is not None:  # ends the run in its world: a worker lost while rank 0 writes the report is a reset
        stopped, _, _ = elastic.train(cfg, loop, state, end_epoch, save, finetune, train_epochs, lambda:
                                      open_outputs(cfg, run, state.report, dist, ctxs, False, None), end_run)
    else:
        stopped, reached, last_epoch = train_epochs(cfg, loop, state, range(first_epoch, end_epoch), epoch_iter,
                                                    val_iter, save, finetune)
        end_run(stopped, reached, last_epoch)
    loop.outputs.close()
    return state.report, stopped
