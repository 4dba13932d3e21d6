"""Elastic training: workers that come and go without stopping the run, on Horovod's elastic driver.

Horovod 0.28.1's MXNet binding has no ``elastic`` module; ``horovod.common.elastic`` gives the framework-free parts
(``run_fn``, ``State``, the host-update notices), and this module is the MXNet part. Every ``--commit-every``
optimizer steps and at each epoch's end, every worker keeps in host memory what must survive a reset (``save``):
the weights and BatchNorm statistics, the optimizer state (momentum, float32 master weights, update counts), the
loss scale, the EMA, and where the epoch is (the samples of its permutation read, the metric sums of all ranks).
When a worker fails, the others' next collective fails; the error (MXNet reports it as an engine error wherever
the array is read) becomes Horovod's ``HorovodInternalError``, and ``run_fn`` resets Horovod (the engine's stored
error cleared, ``hvd.shutdown()``, ``hvd.init()`` into the new world), then rank 0 of the new world broadcasts
its commit (``sync``). A host added by the discovery script raises ``HostsUpdatedInterrupt`` at the next commit and
goes the same way, the new worker starting from the broadcast commit.

The global batch stays the one asked for: per-worker batch x workers x accumulation steps (``plan_world``); the
record order (records.ElasticOrder) makes what was read a prefix of the epoch's permutation, so the new world
reads the rest, each record once. Nothing here is a pickle: plain values cross as JSON bytes, arrays as arrays.
"""
import collections
import contextlib
import dataclasses
import gc
import json
import logging
import math
import os
import time

import mxnet as mx
import numpy as np
from horovod.common.elastic import State, run_fn
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

from rn50kit.reliability import faults, run_lock
from rn50kit.weights import optimizer_state

log = logging.getLogger("rn50")
DEFAULT_COMMIT_EVERY = 50  # optimizer steps: a copy of the weights and optimizer state to host memory each time
# A lost rank 0's lock is free once the kernel (or a shared file system's lock manager) sees it gone; a rank 0
# only cut off from the others still holds it.
LOCK_PATIENCE_S = 10.0


@dataclasses.dataclass(frozen=True)
class WorldPlan:
    """How a world of ``workers`` makes an optimizer step: each worker's batch, and the accumulation steps."""
    workers: int
    per_worker: int
    accum: int

    @property
    def micro_batch(self):  # train.py's --batch-size: the images of one forward/backward pass of every worker
        return self.workers * self.per_worker

    @property
    def global_batch(self):
        return self.micro_batch * self.accum


def plan_world(global_batch, workers, max_per_worker):
    """The plan that keeps ``global_batch`` exactly with the fewest accumulation steps, each worker's batch at
    most ``max_per_worker`` (what the run started with: what fits in its memory); else the closest global batch
    (the caller scales the LR by the ratio and says so)."""
    for accum in range(1, global_batch + 1):
        per_worker, left = divmod(global_batch, workers * accum)
        if per_worker < 1:
            break
        if not left and per_worker <= max_per_worker:
            return WorldPlan(workers, per_worker, accum)
    accum = max(1, math.ceil(global_batch / (workers * max_per_worker)))
    per_worker = min(max_per_worker, max(1, round(global_batch / (workers * accum))))
    return WorldPlan(workers, per_worker, accum)


def describe_plan(plan, global_batch, keep=True):
    """The run's one line about how a world keeps the global batch, or what it does instead (``keep`` False:
    --elastic-batch scale-lr)."""
    how = f"{plan.workers} workers x {plan.per_worker} images x {plan.accum} accumulation step(s)"
    if plan.global_batch == global_batch:
        return f"{how} = the global batch {global_batch}"
    why = "--elastic-batch scale-lr" if not keep else \
        f"{plan.workers} workers cannot make the global batch {global_batch} exactly"
    return f"{how} = {plan.global_batch}: {why}, so the LR is scaled by {plan.global_batch}/{global_batch}"


def is_collective_failure(error):
    """A failed Horovod operation as MXNet reports it (a peer gone, Horovod shut down), not a bug of ours."""
    return isinstance(error, HorovodInternalError) or (isinstance(error, mx.base.MXNetError) and
                                                       faults.is_teardown(str(error)))


@contextlib.contextmanager
def collective_failures(elastic):
    """A failed collective (MXNet reports it as an engine error wherever the array is read) as Horovod's
    HorovodInternalError, which run_fn recovers from; the time it reached this worker noted."""
    try:
        yield
    except mx.base.MXNetError as error:
        if not is_collective_failure(error):
            raise
        elastic.failed_at = time.time()
        log.warning("Elastic: a collective failed (%s); going back to the last commit",
                    " ".join(str(error).split())[:200])
        raise HorovodInternalError(error) from None
    except (HorovodInternalError, HostsUpdatedInterrupt):
        elastic.failed_at = time.time()
        raise


class ElasticEpoch:
    """An epoch's iterator from step ``first_step`` on: its length is the whole epoch's, as the loop counts.
    ``consumed``: the epoch's samples read before it; ``epoch_samples``: the epoch's (state.samples_read)."""

    def __init__(self, iterator, first_step, steps, consumed=0, epoch_samples=0):
        self.iterator, self.first_step, self.steps = iterator, first_step, steps
        self.consumed, self.epoch_samples = consumed, epoch_samples

    def __len__(self):
        return self.first_step + self.steps

    def __iter__(self):
        return iter(self.iterator if self.steps else [])


@dataclasses.dataclass
class Segment:
    """The part of an epoch run in one world: where it started (samples read) and how it steps."""
    epoch: int
    consumed: int
    first_step: int
    plan: WorldPlan


@dataclasses.dataclass
class ElasticRun:
    """The loop's pieces (fit.py's) an elastic run drives one epoch at a time, in its world's plan."""
    cfg: object  # the FitConfig
    loop: object
    state: object  # the TrainState
    end_epoch: int
    save: object  # save(epoch, step, partials=None, best=False): a checkpoint
    finetune: object
    train_epochs: object  # fit.train_epochs
    open_outputs: object  # the outputs of rank 0 (its files), for a worker that becomes rank 0
    end_run: object  # end_run(stopped, reached, last_epoch): the outputs told the run's end (rank 0's: the report)
    consumed: object = None  # consumed(step): the samples of the epoch read after micro-step ``step``
    ended: object = None  # the outputs told the run's end (a reset after it tells only a new rank 0's again)

    def resume_consumed(self, global_batch):
        """The samples of the resumed epoch a checkpoint's step had read."""
        return self.state.step // self.cfg.grad_accum_steps * global_batch

    def train_epoch(self, plan, epoch, train_iter, val_iter, global_batch):
        cfg = dataclasses.replace(self.cfg, batch_size=plan.micro_batch, grad_accum_steps=plan.accum)
        self.loop.outputs.set_batch_size(plan.micro_batch)  # images/s in the world's steps
        for param in self.loop.net.collect_params().values():
            if param.grad_req != "null":
                param.grad_req = "add" if plan.accum > 1 else "write"
                param.zero_grad()
        schedule, scale = self.state.schedule, plan.global_batch / global_batch
        self.state.schedule = schedule if scale == 1 else lambda x: schedule(x) * scale

        def save(epoch, step, partials=None, best=False):
            # The step in the run's own plan, from the samples read (rounded down to a whole global batch where a
            # world could not make it exactly: that part is read again)
            self.save(epoch, self.consumed(step) // global_batch * self.cfg.grad_accum_steps if step else 0,
                      partials, best)
        try:
            return self.train_epochs(cfg, self.loop, self.state, range(epoch, epoch + 1), lambda e: train_iter,
                                val_iter, save, self.finetune)
        finally:
            self.state.schedule = schedule

    def world_changed(self, change):
        self.loop.outputs.world_changed(change)

    def end(self, result):
        """The run's end told to this worker's outputs, once (the report and the MLPerf log's end written once)."""
        if self.ended is not self.loop.outputs:
            self.ended = self.loop.outputs
            self.end_run(*result)

    def became_primary(self):
        """Rank 0 was lost and this worker is rank 0 now: it writes the run's files from here on (the logs append;
        the report, which every rank keeps, is written whole at the end)."""
        previous, self.loop.outputs = self.loop.outputs, self.open_outputs()
        previous.close()


class ElasticTraining(State):
    """The elastic run's state and its driver: ``train`` runs the epochs under ``run_fn``.

    ``make_iterators(plan, epoch, start, steps)`` builds (train, validation) iterators of this world: train from
    sample ``start`` of the epoch's permutation for ``steps`` micro-steps; ``epoch_samples``: the records an epoch
    has; ``make_trainer()`` a trainer for the current world (Horovod's divides by the world's size when built)."""

    def __init__(self, hvd, dist, net, global_batch, max_per_worker, epoch_samples, make_iterators, make_trainer,
                 commit_every=DEFAULT_COMMIT_EVERY, keep_batch=True, accum=1, workspace_lock=None):
        super().__init__(bcast_object=self.broadcast_json, get_rank=hvd.rank)
        self.hvd, self.dist, self.net = hvd, dist, net
        self.workspace_lock = workspace_lock  # run_lock.WorkspaceLock: rank 0's (held), taken by a new rank 0
        self.global_batch, self.max_per_worker, self.epoch_samples = global_batch, max_per_worker, epoch_samples
        self.make_iterators, self.make_trainer, self.commit_every = make_iterators, make_trainer, commit_every
        self.keep_batch, self.accum = keep_batch, accum  # --elastic-batch keep, or scale-lr: the run's own plan
        self.committed = None  # (arrays, values) kept in host memory
        self.live = None  # {"epoch", "consumed"} after the last optimizer step, kept through a reset until noted
        self.hosts = None  # every rank's host, from the first sync (no collective before it: see train.py)
        self.failed_at = None  # time.time() when the failure (or the hosts' update) reached this worker
        self.last_step_at = time.time()  # of the last optimizer step
        self.change = None  # a world change not told yet: told with the first step after it, which it cost
        self.validation = {}  # (rank, size) -> the validation iterator of that world

    def broadcast_json(self, value):
        """Rank 0's ``value`` (plain values: JSON) on every rank, as bytes: no pickle crosses (Horovod's own
        broadcast_object pickles). Tuples come back as lists; Horovod's host-update check compares numbers only."""
        data = np.frombuffer(json.dumps(value).encode(), np.uint8) if self.dist.rank == 0 else np.zeros(0, np.uint8)
        length = mx.nd.array([len(data)], dtype="int32")
        self.dist.broadcast_([length], "elastic.json.length")
        buffer = mx.nd.zeros(int(length.asscalar()), dtype="uint8")
        if self.dist.rank == 0:
            buffer[:] = data
        self.dist.broadcast_([buffer], "elastic.json")
        return json.loads(buffer.asnumpy().tobytes().decode())

    # --- what the loop calls ---------------------------------------------------------------------------------

    def train(self, cfg, loop, state, end_epoch, save, finetune, train_epochs, open_outputs, end_run):
        """Run fit.py's loop (``train_epochs`` and its pieces) from the state's epoch to ``end_epoch``, elastic,
        and its end (``end_run``) with every worker of the last world; returns what train_epochs returns for the
        last epoch run."""
        loop.after_update = self.after_update
        self.run = run = ElasticRun(cfg, loop, state, end_epoch, save, finetune, train_epochs, open_outputs,
                                    end_run, self.consumed_after)
        consumed = run.resume_consumed(self.global_batch)
        self.live = {"epoch": run.state.epoch, "consumed": consumed}
        self.save_now(run.state.epoch, consumed, partial=run.state.partial)
        result = run_fn(self._epochs, self._reset_horovod)(self)
        if self.change is not None:  # no step came after it
            self.tell_change(None)
        return result

    def tell_change(self, first_step_at):
        """Tell the outputs the pending world change, with the seconds from the last step before it to
        ``first_step_at``, the first step after it (None: none came)."""
        last_step_at = self.change.pop("last_step_at")
        self.change["seconds_lost"] = None if first_step_at is None else round(first_step_at - last_step_at, 2)
        self.run.world_changed(self.change)
        self.change = None

    def consumed_after(self, steps_done):
        """The samples of the epoch read once its first ``steps_done`` micro-steps (in the segment's plan) are
        done: what the segment started from, and its whole optimizer steps since."""
        segment = self.segment
        return segment.consumed + (steps_done - segment.first_step) // segment.plan.accum * segment.plan.global_batch

    def after_update(self, epoch, step, stats, counted):
        """After the optimizer step ending with micro-step ``step``: commit when due."""
        now, segment = time.time(), self.segment
        if self.change is not None:  # the first step in a new world: what the change cost, told now
            self.tell_change(now)
        self.last_step_at = now
        updates = (step + 1 - segment.first_step) // segment.plan.accum
        consumed = self.consumed_after(step + 1)
        self.live = {"epoch": epoch, "consumed": consumed}
        if updates % self.commit_every == 0:
            stats.add_hits(counted)  # the step's hits are read now: the commit's sums hold them
            counted.clear()
            self.commit_at(epoch, consumed, stats.sums())

    # --- Horovod's State -------------------------------------------------------------------------------------

    def commit_at(self, epoch, consumed, sums):
        total = self.dist.sum(sums, "elastic.sums")
        self.save_now(epoch, consumed, dict(zip(("loss", "steps", "correct1", "correct5", "samples"), total)))
        self.check_host_updates()

    def save_now(self, epoch, consumed, partial=None):
        run = self.run
        arrays, values = optimizer_state.snapshot(run.state.trainer)
        arrays = {f"opt.{k}": v for k, v in arrays.items()}
        for name, param in self.net.collect_params().items():
            arrays[f"param.{name}"] = param.list_data()[0].copyto(mx.cpu())
        if run.state.ema is not None:
            arrays.update({f"ema.{k}": v.copyto(mx.cpu()) for k, v in run.state.ema.saveable().items()})
        mx.nd.waitall()  # a failed collective shows here, and the commit before this one stays
        self.committed = (arrays, {
            "optimizer": values, "epoch": epoch, "consumed": consumed, "partial": partial,
            "scaler": run.state.scaler.state(), "best_top1": run.state.best_top1,
            "train_seconds": run.state.train_seconds, "target": run.state.target,
            "metrics": json.loads(json.dumps(run.state.report.metrics)),
            "global_batch": self.global_batch, "max_per_worker": self.max_per_worker, "end_epoch": run.end_epoch})

    def save(self):
        pass  # commit_at has saved already: Horovod's commit() calls this, then checks for host updates

    def restore(self):
        pass  # reset() and sync() put the commit into the new world's trainer

    def sync(self):
        """Rank 0's commit to every worker (a worker just added has none), then into the live objects. run_fn
        calls it outside the epochs: a failure here is converted the same way, and a sync that did not finish
        leaves the commit before it."""
        with collective_failures(self):
            arrays, values = self.committed
            values = self.broadcast_json(values if self.dist.rank == 0 else None)
            shapes = self.broadcast_json({k: [list(v.shape), np.dtype(v.dtype).name] for k, v in arrays.items()}
                                         if self.dist.rank == 0 else None)
            if self.dist.rank != 0:
                arrays = {k: mx.nd.zeros(tuple(shape), dtype=dtype) for k, (shape, dtype) in shapes.items()}
            self.dist.broadcast_([arrays[key] for key in sorted(arrays)], "elastic")
            mx.nd.waitall()
        self.committed = (arrays, values)
        self.put()

    def reset(self):
        """After hvd.init() into the new world: this process's place, a trainer for the world's size, the
        commit put back (sync follows, but not when hosts were only removed)."""
        was_primary = self.dist.is_primary
        self.dist.refresh()
        if self.dist.is_primary and not was_primary:
            self.run.became_primary()
            self.hold_workspace()
        self.run.state.trainer = self.make_trainer()
        self.validation.clear()  # a failure may have stopped one part-way through its pass
        self.put()

    def hold_workspace(self):
        """A worker that became rank 0 takes the workspace lock, which went with the lost rank 0: a second run
        there is refused again, and this worker records how the run ended (run.lock, runner's outcome)."""
        lock = self.workspace_lock
        if lock is None or lock.fd is not None:
            return
        try:
            lock.acquire(patience_s=LOCK_PATIENCE_S)
        except run_lock.WorkspaceBusy as error:
            log.warning("Elastic: this worker is rank 0 now, but the workspace lock is not free (%s); the run goes "
                        "on without it", error)

    def put(self):
        arrays, values = self.committed
        run = self.run
        for name, param in self.net.collect_params().items():
            param.set_data(arrays[f"param.{name}"])
        optimizer_state.put(run.state.trainer, {k[4:]: v for k, v in arrays.items() if k.startswith("opt.")},
                            values["optimizer"])
        if run.state.ema is not None:
            for name in run.state.ema.shadow:
                run.state.ema.shadow[name][:] = arrays[f"ema.{name}"]
        run.state.scaler.load(values["scaler"])
        run.state.best_top1, run.state.train_seconds = values["best_top1"], values["train_seconds"]
        run.state.target = values["target"]
        run.state.report.metrics.clear()
        run.state.report.metrics.update(values["metrics"])
        run.state.epoch, run.state.step = values["epoch"], 0
        self.global_batch, self.max_per_worker = values["global_batch"], values["max_per_worker"]  # rank 0's
        run.end_epoch = run.loop.end_epoch = values["end_epoch"]  # a worker added read a newer checkpoint
        run.state.partial = values["partial"] if self.dist.rank == 0 else None  # rank 0 carries the sums

    # --- the epochs ------------------------------------------------------------------------------------------

    def _epochs(self, _state):
        with collective_failures(self):
            self.note_world()  # every rank of the new world here, after a sync or a reset without one
            result = self._train_epochs()
            # The end in this world too: a worker lost while rank 0 writes the report fails the barrier after it,
            # and the world that is left ends the run again (its rank 0 writes the report every rank keeps).
            self.run.end(result)
            self.dist.finish()
            return result

    def _train_epochs(self):
        run, result = self.run, (False, False, self.run.state.epoch)
        while run.state.epoch < run.end_epoch:
            epoch, consumed = run.state.epoch, self.committed[1]["consumed"]
            plan = self.plan(self.dist.size)
            updates_left = (self.epoch_samples - consumed) // plan.global_batch
            first_step = consumed // plan.global_batch * plan.accum
            self.segment = Segment(epoch, consumed, first_step, plan)
            train, val = self.iterators(plan, epoch, consumed, updates_left * plan.accum)
            epoch_iter = ElasticEpoch(train, first_step, updates_left * plan.accum, consumed, self.epoch_samples)
            result = run.train_epoch(plan, epoch, epoch_iter, val, self.global_batch)
            stopped, reached, _ = result
            if stopped or reached:
                break
            self.commit_at(epoch + 1, 0, [0.0] * 5)
            run.state.epoch, run.state.partial = epoch + 1, None
        return result

    def plan(self, workers):
        """How ``workers`` make an optimizer step: the global batch kept, or (scale-lr) each worker's batch and
        the accumulation kept."""
        if self.keep_batch:
            return plan_world(self.global_batch, workers, self.max_per_worker)
        return WorldPlan(workers, self.max_per_worker, self.accum)

    def iterators(self, plan, epoch, start, steps):
        world = (self.dist.rank, self.dist.size)
        train, val = self.make_iterators(plan, epoch, start, steps, world not in self.validation)
        self.validation.setdefault(world, val)
        return train, self.validation[world]

    # --- resets ----------------------------------------------------------------------------------------------

    def _reset_horovod(self):
        # The failed operations' errors, kept by the engine in one unlocked list, raised once and cleared by a
        # waitall. Arrays in reference cycles (the failure's traceback) are freed before it, not by another
        # thread's garbage collection while the waitall walks that list; the list is kept whole by one collective
        # failing at a time (Distributed, optimizers.trainer_for; docs/design.md).
        gc.collect()
        gc.disable()
        try:
            mx.nd.waitall()
        except mx.base.MXNetError:
            pass
        finally:
            gc.enable()
        self.hvd.shutdown()
        self.hvd.init()
        faults.renumber(self.hvd.rank(), self.hvd.size())

    def world_hosts(self):
        """Every rank's host name (HOROVOD_HOSTNAME: the name in the host list), indexed by rank."""
        name = os.environ.get("HOROVOD_HOSTNAME", "") or os.uname().nodename
        codes = np.zeros(64)
        encoded = name.encode()[:64]
        codes[:len(encoded)] = list(encoded)
        rows = self.dist.gather(codes.tolist(), "elastic.hosts")
        return [bytes(int(c) for c in row if c).decode(errors="replace") for row in rows]

    def note_world(self):
        """Tell the outputs of a world that changed: from how many workers to how many, which hosts left or came,
        the steps redone since the commit, and the seconds from the failure to now."""
        hosts = self.world_hosts()
        if self.hosts is None or hosts == self.hosts and self.failed_at is None:
            self.hosts = hosts  # the first world, or a worker just added
            return
        before, self.hosts = self.hosts, hosts
        lost = list((collections.Counter(before) - collections.Counter(hosts)).elements())
        added = list((collections.Counter(hosts) - collections.Counter(before)).elements())
        values = self.committed[1]
        redone = 0
        if self.live is not None and self.live["epoch"] == values["epoch"]:
            redone = max(0, self.live["consumed"] - values["consumed"]) // self.global_batch
        change = {"time": time.time(), "epoch": values["epoch"] + 1, "workers_before": len(before),
                  "workers": len(hosts), "hosts_lost": lost, "hosts_added": added, "steps_redone": redone,
                  "detected_after": None if self.failed_at is None else round(self.failed_at - self.last_step_at, 2),
                  "plan": describe_plan(self.plan(len(hosts)), self.global_batch, self.keep_batch),
                  "last_step_at": self.last_step_at}
        self.failed_at = None
        self.live = {"epoch": values["epoch"], "consumed": values["consumed"]}  # counted: from the commit on
        if self.change is not None:  # no step came between the two changes
            self.tell_change(None)
        self.change = change
