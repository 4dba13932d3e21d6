"""The training loop: recipes, mixed precision with loss scaling, validation, checkpoints, resume, modes."""
import dataclasses
import logging
import math
import os
import signal
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import checkpoint
import cli
import models
import schedules
import settings
from data import out_dtype
from progress import JsonLog, Progress, format_seconds
from report import Report

log = logging.getLogger("rn50")


class TrainingError(Exception):
    """The run cannot go on (diverged, bad checkpoint): reported as one line."""


def add_fit_args(parser):
    group = parser.add_argument_group("Training", "--recipe gives the defaults marked recipe:; a flag given wins")
    group.add_argument("--mode", default="train_val", choices=["train_val", "train", "val", "pred"],
                       help="train_val: train and validate each epoch; train: no validation; val: score a "
                            "checkpoint --num-epochs times; pred: top-5 classes of --data-pred")
    group.add_argument("--recipe", default=schedules.DEFAULT_RECIPE, choices=list(schedules.RECIPES),
                       help="hyper-parameter preset: the defaults of the flags marked 'recipe:' (a flag given "
                            "on the command line wins)")
    group.add_argument("--seed", type=int, default=None, help="random seed (python, numpy, MXNet and DALI)")
    group.add_argument("--kv-store", default="horovod", choices=cli.KV_STORES,
                       help="horovod: one process per device; device/local: one process, all --gpus")
    group.add_argument("--gpus", default=None, help="device mode: GPU ids, e.g. 0,1,2,3 (default: all)")
    group.add_argument("--cpu-contexts", type=int, default=1,
                       help="device mode without GPUs: split each batch over this many CPU contexts, one data "
                            "pipeline each (the multi-GPU code path on a CPU; no faster than 1)")
    group.add_argument("--dtype", default=None, choices=cli.DTYPES,
                       help="model precision (default: float16 with a GPU, float32 without; float16: fp32 master "
                            "weights and loss scaling; bfloat16: CPU; int8: scoring on the CPU, the checkpoint "
                            "quantized by oneDNN, see --calib-mode)")
    group.add_argument("--batch-size", type=int, default=192, help="global batch size (all workers)")
    group.add_argument("--num-epochs", type=int, default=None, help=f"epochs ({schedules.recipe_help('num_epochs')})")
    group.add_argument("--run-epochs", type=int, default=-1, help="stop after this many epochs in this run")
    group.add_argument("--lr", type=float, default=None,
                       help="absolute LR for the global batch (default: the recipe's LR per 256 x batch/256; "
                            f"{schedules.recipe_help('lr_per_256')} per 256)")
    group.add_argument("--lr-schedule", default=None, choices=schedules.SCHEDULES,
                       help=f"LR schedule ({schedules.recipe_help('lr_schedule')})")
    group.add_argument("--lr-steps", type=lambda s: [float(x) for x in s.split(",") if x], default=None,
                       help="step schedule: epochs at which the LR is multiplied by --lr-factor "
                            f"({schedules.recipe_help('lr_steps')})")
    group.add_argument("--lr-factor", type=float, default=None,
                       help=f"step schedule: decay factor ({schedules.recipe_help('lr_factor')})")
    group.add_argument("--lr-power", type=float, default=2.0, help="poly schedule: exponent")
    group.add_argument("--warmup-epochs", type=float, default=None,
                       help=f"linear warmup from 0, in epochs ({schedules.recipe_help('warmup_epochs')})")
    group.add_argument("--optimizer", default=None, choices=["sgd", "nag"],
                       help=f"sgd (momentum) or nag (Nesterov) ({schedules.recipe_help('optimizer')})")
    group.add_argument("--mom", type=float, default=None, help=f"momentum ({schedules.recipe_help('mom')})")
    group.add_argument("--wd", type=float, default=None, help=f"weight decay ({schedules.recipe_help('wd')})")
    group.add_argument("--wd-bn-bias", action="store_true",
                       help="also decay BatchNorm gamma/beta and biases (default: they get no weight decay)")
    group.add_argument("--label-smoothing", type=float, default=None,
                       help=f"label smoothing factor ({schedules.recipe_help('label_smoothing')})")
    group.add_argument("--mixup", type=float, default=None,
                       help=f"mixup Beta(a, a) parameter; 0 = off ({schedules.recipe_help('mixup')})")
    group.add_argument("--mixup-off-epochs", type=int, default=0, help="no mixup in the last N epochs")
    group.add_argument("--ema-decay", type=float, default=0.0,
                       help="keep an exponential moving average of the weights (e.g. 0.9999); 0 = off. "
                            "Validation uses the EMA weights; they are saved beside each checkpoint")
    group.add_argument("--loss-scale", default=None,
                       help="'dynamic' or a fixed number (default: dynamic for float16, 1 otherwise)")
    group.add_argument("--max-bad-steps", type=int, default=50,
                       help="stop when this many consecutive steps have a NaN/inf loss or gradient")
    group.add_argument("--horovod-num-groups", type=int, default=0, help="grouped allreduce: number of groups")
    group.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to float16 for allreduce")
    group.add_argument("--disp-batches", type=int, default=20, help="log every N iterations")
    group.add_argument("--benchmark-iters", type=int, default=None, help="cap iterations per epoch (benchmarks)")
    group.add_argument("--no-metrics", action="store_true", help="skip accuracy computation (benchmarks)")
    group.add_argument("--workspace", default=None,
                       help="directory for checkpoints, logs and the report (default: runs/<model>, e.g. "
                            "runs/resnet50_v1.5, in the current directory)")
    group.add_argument("--model-prefix", default="model", help="checkpoint file prefix, inside --workspace")
    group.add_argument("--save-frequency", type=int, default=1,
                       help="checkpoint every N epochs (0: only the last; the best is always kept)")
    group.add_argument("--keep-last", type=int, default=3,
                       help="keep the newest K epoch checkpoints (0: all) besides <prefix>-best.params; a step "
                            "checkpoint (after SIGTERM) is removed once a newer checkpoint exists")
    group.add_argument("--resume", default="auto",
                       help="auto: continue from the latest complete checkpoint; none: start afresh (the earlier "
                            "run's files move to <workspace>/previous-<time>/); or a <prefix>-NNNN.params / "
                            ".state.json path (later checkpoints move aside the same way)")
    group.add_argument("--load", default=None,
                       help="val/pred: parameters to score (default: the latest checkpoint of --workspace); the "
                            "model, classes, image shape, resize and normalisation come from its saved state")
    group.add_argument("--report", default=None,
                       help="JSON report (relative: inside --workspace; default report.json, and for --mode val "
                            "<checkpoint>.score.json beside the checkpoint scored)")
    group.add_argument("--json-log", default="log.jsonl",
                       help="JSON-lines log (relative: inside --workspace); empty to disable")
    return group


@dataclasses.dataclass(frozen=True)
class FitConfig:
    """The values of train.py's flags the loop reads, made once at the boundary (fit_config): a function here
    that takes a FitConfig reads only these."""
    mode: object
    arch: object
    num_classes: object
    dtype: object
    kv_store: object
    batch_size: object
    num_epochs: object
    run_epochs: object
    seed: object
    optimizer: object
    lr: object
    lr_schedule: object
    lr_steps: object
    lr_factor: object
    lr_power: object
    warmup_epochs: object
    mom: object
    wd: object
    wd_bn_bias: object
    label_smoothing: object
    mixup: object
    mixup_off_epochs: object
    ema_decay: object
    loss_scale: object
    max_bad_steps: object
    horovod_num_groups: object
    fp16_allreduce: object
    disp_batches: object
    benchmark_iters: object
    no_metrics: object
    workspace: object
    model_prefix: object
    save_frequency: object
    keep_last: object
    resume: object
    load: object
    json_log: object
    data_backend: object


def fit_config(args):
    """The FitConfig of train.py's parsed (and completed) arguments."""
    return FitConfig(**{field.name: getattr(args, field.name) for field in dataclasses.fields(FitConfig)})


def workspace_path(workspace, name):
    return name if os.path.isabs(name) else os.path.join(workspace, name)


def check_args(args):
    """Raise ValueError for inconsistent hyper-parameters."""
    if args.num_epochs <= 0:
        raise ValueError(f"--num-epochs must be positive, got {args.num_epochs}")
    if args.lr_schedule == "step":
        late = [s for s in args.lr_steps if s >= args.num_epochs]
        if late:
            raise ValueError(f"--lr-steps {late} lie at or beyond the last epoch ({args.num_epochs}); "
                             "give steps below --num-epochs")
    if not 0 <= args.ema_decay < 1:
        raise ValueError(f"--ema-decay must be in [0, 1), got {args.ema_decay}")
    if args.loss_scale not in (None, "dynamic"):
        try:
            if float(args.loss_scale) <= 0:
                raise ValueError
        except ValueError:
            raise ValueError(f"--loss-scale must be 'dynamic' or a positive number, got {args.loss_scale}")


class Distributed:
    """Rank information and the few collectives the loop needs (Horovod; one process works too)."""

    def __init__(self, hvd):
        self.hvd = hvd
        if hvd is None:  # device/local kv-store: one process
            self.rank, self.size, self.local_rank, self.local_size = 0, 1, 0, 1
        else:
            self.rank, self.size = hvd.rank(), hvd.size()
            self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()

    @property
    def is_primary(self):
        return self.rank == 0

    def sum(self, values, name):
        """Sum a list of floats over all ranks."""
        if self.hvd is None or self.size == 1:
            return [float(v) for v in values]
        array = mx.nd.array(values, dtype="float64")
        return self.hvd.allreduce(array, op=self.hvd.Sum, name=name).asnumpy().tolist()

    def gather(self, values, name):
        """Every rank's list of floats, indexed by rank (exact: each rank adds zeros to the others' slots)."""
        if self.hvd is None or self.size == 1:
            return [[float(v) for v in values]]
        slots = np.zeros((self.size, len(values)))
        slots[self.rank] = values
        return np.array(self.sum(slots.ravel().tolist(), name)).reshape(self.size, len(values)).tolist()

    def average_(self, arrays, name):
        """Average parameters (or NDArrays) in place over all ranks (BatchNorm running statistics)."""
        if self.hvd is None or self.size == 1:
            return
        for i, array in enumerate(arrays):
            array = array.data() if isinstance(array, gluon.Parameter) else array
            self.hvd.allreduce_(array, op=self.hvd.Average, name=f"{name}.{i}")

    def finish(self):
        """Before a worker exits: its queued collectives done, and every rank at this point (so no rank's
        exit shuts Horovod down under another's last allreduce or rank 0's last checkpoint)."""
        mx.nd.waitall()
        self.sum([0.0], "finish")

    def broadcast_parameters(self, net):
        if self.hvd is not None and self.size > 1:
            self.hvd.broadcast_parameters(net.collect_params(), root_rank=0)


def average_over_devices(params):
    """Give parameters kept on several devices (BatchNorm statistics, which each device updates from its own
    slice of the batch) their mean on every device, so validation and checkpoints do not depend on the device."""
    for param in params:
        copies = param.list_data()
        if len(copies) > 1:
            param.set_data(mx.nd.add_n(*[c.as_in_context(copies[0].context) for c in copies]) / len(copies))


def running_stats(net):
    return [p for name, p in sorted(net.collect_params().items())
            if name.endswith("running_mean") or name.endswith("running_var")]


def no_decay(name):
    """BatchNorm gamma/beta and biases: decaying them only hurts (Goyal et al. 2017; NVIDIA's README)."""
    return name.endswith(("gamma", "beta", "bias"))


def set_wd_groups(net, decay_all=False):
    for name, param in net.collect_params().items():
        param.wd_mult = 1.0 if decay_all or not no_decay(name) else 0.0


class LossScaler:
    """Loss scaling: multiply the loss before backward, divide the gradients in the update.

    Dynamic (the default for float16, as MXNet AMP): on a non-finite gradient the step is skipped and the
    scale halved; after ``growth_interval`` clean steps it doubles. Static scales only skip bad steps.
    """

    def __init__(self, scale=1.0, dynamic=False, growth_interval=2000, factor=2.0, min_scale=2.0 ** -14):
        self.scale = float(scale)
        self.dynamic = dynamic
        self.growth_interval = growth_interval
        self.factor = factor
        self.min_scale = min_scale
        self.clean_steps = 0
        self.bad_steps = 0  # consecutive

    def update(self, finite):
        if finite:
            self.bad_steps = 0
            self.clean_steps += 1
            if self.dynamic and self.clean_steps >= self.growth_interval:
                self.scale *= self.factor
                self.clean_steps = 0
        else:
            self.bad_steps += 1
            self.clean_steps = 0
            if self.dynamic:
                self.scale = max(self.scale / self.factor, self.min_scale)

    def state(self):
        return {"scale": self.scale, "clean_steps": self.clean_steps, "bad_steps": self.bad_steps}

    def load(self, state):
        self.scale, self.clean_steps, self.bad_steps = state["scale"], state["clean_steps"], state["bad_steps"]


def make_loss_scaler(loss_scale, dtype):
    """--loss-scale: 'dynamic' (the default for float16), a fixed number, or None (1 for other dtypes)."""
    if loss_scale == "dynamic" or (loss_scale is None and dtype == "float16"):
        return LossScaler(2.0 ** 16, dynamic=True)
    return LossScaler(float(loss_scale or 1.0))


def grads_finite(params):
    return all_finite([g for p in params if p.grad_req != "null" for g in p.list_grad()])


def make_trainer(net, dist, kvstore, optimizer, wd, momentum, fp16_allreduce=False, num_groups=0):
    """Multi-precision SGD/NAG (the LR is set every step); Horovod's DistributedTrainer or a Gluon Trainer on a
    kvstore."""
    optimizer_params = {"learning_rate": 0.0, "wd": wd, "momentum": momentum, "multi_precision": True}
    params = net.collect_params()
    if kvstore == "horovod":
        hvd = dist.hvd
        compression = hvd.Compression.fp16 if fp16_allreduce else hvd.Compression.none
        return hvd.DistributedTrainer(params, optimizer, optimizer_params, compression=compression,
                                      num_groups=num_groups)
    store = mx.kvstore.create(kvstore) if kvstore else None
    return gluon.Trainer(params, optimizer, optimizer_params, kvstore=store, update_on_kvstore=False)


class StatsGuard:
    """A copy of the BatchNorm running statistics from before the step: a forward pass over a NaN/inf batch
    would otherwise poison them even though the weight update is skipped (small: 2 vectors per BN layer)."""

    def __init__(self, net):
        self.stats = [a for p in running_stats(net) for a in p.list_data()]
        self.backup = [a.copy() for a in self.stats]

    def keep(self):
        for src, dst in zip(self.stats, self.backup):
            src.copyto(dst)

    def restore_if_bad(self):
        if self.stats and not all_finite(self.stats):
            for src, dst in zip(self.backup, self.stats):
                src.copyto(dst)


# mx.nd.multi_all_finite takes its element type from its first input (another dtype fails: "data type do not
# match") and has room for 200 inputs with no bounds check (MXNet 1.9.1, src/operator/contrib/all_finite.cc/.cu:
# MSHADOW_REAL_TYPE_SWITCH(inputs[0].type_flag_); all_finite-inl.h: MultiAllFiniteKernelParam::N = 200); one
# kernel runs on one device. A float16 network has float16 and float32 (BatchNorm) gradients, ResNet-101 and
# deeper over 300 of them, --kv-store device a set on every GPU. MXNet's AMP (contrib/amp/loss_scaler.py) also
# checks in chunks of 200.
MULTI_ALL_FINITE_MAX_ARRAYS = 200


def finite_check_groups(arrays, size=MULTI_ALL_FINITE_MAX_ARRAYS):
    """``arrays`` as multi_all_finite accepts them: groups of one device and one dtype, at most ``size`` each."""
    groups = {}
    for array in arrays:
        groups.setdefault((array.context, np.dtype(array.dtype)), []).append(array)
    return [group[i:i + size] for group in groups.values() for i in range(0, len(group), size)]


def all_finite(arrays):
    """Whether every value of ``arrays`` is finite; they may mix dtypes and devices."""
    flags = [mx.nd.multi_all_finite(*group, num_arrays=len(group), init_output=True)
             for group in finite_check_groups(arrays)]
    return all(bool(flag.asscalar()) for flag in flags)  # all queued first: the device is waited for once


def train_step(net, trainer, scaler, loss_fn, datas, targets, batch_size, guard=None, vote=None,
               scan_grads=True):
    """One step over the per-device slices; returns (mean loss, outputs, applied).

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
    trainer.allreduce_grads()
    # Reading the loss waits for the forward pass only: backward and allreduce are queued and keep the device
    # busy meanwhile. The gradient scan waits for them, as the update needs. Nothing waits for the update: the
    # next step's reads do, so at most one step is ever queued.
    loss = mean_loss(losses)
    finite = (vote or bool)(math.isfinite(loss))
    if finite and scan_grads:
        finite = grads_finite(trainer._params)
    if finite:
        trainer.update(batch_size * scaler.scale)
    elif guard is not None:
        guard.restore_if_bad()
    scaler.update(finite)
    return loss, outputs, finite


def mean_loss(losses):
    """The mean of the per-device loss vectors, read from the devices at once."""
    sums = [loss.sum().as_in_context(mx.cpu()) for loss in losses]
    total = sums[0] if len(sums) == 1 else mx.nd.add_n(*sums)
    return total.asscalar() / sum(loss.shape[0] for loss in losses)


def topk_hits(logits, label, valid):
    """(top-1 hits, top-5 hits) over the first ``valid`` rows."""
    return tuple(count.asscalar() for count in topk_counts(logits, label, valid))


def topk_counts(logits, label, valid):
    """(top-1 hits, top-5 hits) over the first ``valid`` rows, as NDArrays not yet read from the device."""
    if valid == 0:  # all padding: a device whose validation shard has ended
        zero = mx.nd.zeros((1,), ctx=logits.context)
        return zero, zero
    logits, label = logits[:valid], label[:valid]
    top5 = mx.nd.topk(logits, k=min(5, logits.shape[1]), ret_typ="indices")
    hits = top5 == label.reshape((-1, 1)).astype(top5.dtype)
    return hits[:, 0].sum(), hits.sum()


def valid_counts(batch, sizes):
    """Samples that are not padding in each part of ``batch`` (parts of ``sizes``): a batch of per-device parts
    has one ``pads`` entry per part; a single batch split over devices has its padding at the end."""
    pads = getattr(batch, "pads", None)
    if pads is not None:
        return [size - pad for size, pad in zip(sizes, pads)]
    counts, remaining = [], sum(sizes) - batch.pad
    for size in sizes:
        counts.append(max(0, min(size, remaining)))
        remaining -= size
    return counts


def split(batch, ctxs, dtype):
    """Slices of the batch, one per device, in the model's input dtype."""
    if len(batch.data) == len(ctxs) > 1:  # already one part per device (one pipeline per device)
        return ([d.astype(out_dtype(dtype), copy=False).as_in_context(c) for d, c in zip(batch.data, ctxs)],
                [label.as_in_context(c) for label, c in zip(batch.label, ctxs)])
    data, label = batch.data[0], batch.label[0]
    if data.dtype != np.dtype(out_dtype(dtype)):
        data = data.astype(out_dtype(dtype))
    if len(ctxs) == 1:
        return [data.as_in_context(ctxs[0])], [label.as_in_context(ctxs[0])]
    return (gluon.utils.split_and_load(data, ctxs, even_split=False),
            gluon.utils.split_and_load(label, ctxs, even_split=False))


def validation_batches(val_iter, max_iters=None):
    """(batch, first pass?) pairs: one pass over the validation set, or with ``max_iters`` exactly that many
    batches, the set cycled when it is shorter (benchmarks time as many batches on every backend). No batch is
    drawn past ``max_iters``: the readers stay where the timed ones ended."""
    served, first_pass = 0, True
    while max_iters is None or served < max_iters:
        batches = 0
        for batch in val_iter:
            yield batch, first_pass
            served, batches = served + 1, batches + 1
            if max_iters is not None and served >= max_iters:
                return
        if max_iters is None or batches == 0:
            return
        first_pass = False


def evaluate(net, val_iter, ctxs, dist, dtype="float32", no_metrics=False, max_iters=None):
    """Top-1, top-5 and loss over the whole validation set, each sample counted once over all ranks (with
    ``max_iters``, that many batches are timed, the set cycled; the accuracy counts its first pass)."""
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    correct1 = correct5 = loss_sum = count = 0.0
    durations = []
    tic = time.time()
    for batch, first_pass in validation_batches(val_iter, max_iters):
        datas, labels = split(batch, ctxs, dtype)
        for data, label, valid in zip(datas, labels, valid_counts(batch, [d.shape[0] for d in datas])):
            logits = net(data).astype("float32")
            if no_metrics:
                logits.wait_to_read()
            else:  # computed on every pass, so each timed batch does the same work
                c1, c5 = topk_hits(logits, label, valid)
                batch_loss = loss_fn(logits[:valid], label[:valid]).sum().asscalar() if valid else 0.0
                if first_pass:
                    correct1, correct5, loss_sum = correct1 + c1, correct5 + c5, loss_sum + batch_loss
            count += valid if first_pass else 0
        now = time.time()
        durations.append(now - tic)
        tic = now
    correct1, correct5, loss_sum, count = dist.sum([correct1, correct5, loss_sum, count], "val.counts")
    total = max(count, 1)
    return {"top1": correct1 / total, "top5": correct5 / total, "loss": loss_sum / total,
            "durations": durations, "samples": int(count), "correct1": correct1, "correct5": correct5}


_early_stop_signals = []  # stop signals that came before the loop's StopFlag existed (start-up)


def catch_stop_signals(pending=()):
    """From now on a SIGTERM/SIGUSR1 is not fatal: it asks the loop (once it runs) to save and stop. ``pending``:
    such signals kept before this call."""
    _early_stop_signals.extend(pending)
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, lambda signum, frame: _early_stop_signals.append(signum))


class StopFlag:
    """SIGTERM/SIGUSR1 ask for a checkpoint at the next step boundary.

    ``vote`` is the one small allreduce per step: it tells whether every rank's loss is finite, and carries
    the stop request along, so all ranks stop at the same step.
    """

    def __init__(self, dist):
        self.dist = dist
        self.requested = bool(_early_stop_signals)
        self.agreed = False
        self.votes = 0
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, self._handler)

    def _handler(self, signum, frame):
        self.requested = True

    def vote(self, loss_ok):
        self.votes += 1
        # One name for every vote: Horovod's response cache then serves it (a new name per step evicts cached
        # responses); the votes never overlap, each is read before the next starts.
        bad, stops = self.dist.sum([0.0 if loss_ok else 1.0, 1.0 if self.requested else 0.0], "vote")
        self.agreed = stops > 0
        return bad == 0

    def agreed_now(self):
        """Outside a step (epoch end): do all ranks agree to stop?"""
        self.vote(True)
        return self.agreed


class EMA:
    """Exponential moving average of every parameter (BatchNorm statistics included), kept in float32."""

    def __init__(self, net, decay):
        self.decay = decay
        self.params = net.collect_params()
        self.shadow = {name: p.data().astype("float32").copy() for name, p in self.params.items()}

    def update(self):
        for name, p in self.params.items():
            value = p.data().astype("float32").as_in_context(self.shadow[name].context)
            self.shadow[name][:] = self.decay * self.shadow[name] + (1 - self.decay) * value

    def swap(self):
        """Exchange the live weights and the averages (call twice to restore)."""
        for name, p in self.params.items():
            live = p.data().astype("float32").copy()
            p.set_data(self.shadow[name].astype(p.dtype))
            self.shadow[name] = live

    def running_stats(self):
        return [value for name, value in sorted(self.shadow.items())
                if name.endswith(("running_mean", "running_var"))]

    def saveable(self):
        return {name: v for name, v in self.shadow.items()}

    def load(self, path):
        loaded = mx.nd.load(path)
        for name in self.shadow:
            self.shadow[name] = loaded[name].as_in_context(self.shadow[name].context)


def make_targets(label, num_classes, smoothing, mix, epoch_rng, data):
    """Smoothed one-hot targets; with mixup, data and targets mixed with the reversed batch."""
    target = label.one_hot(num_classes, on_value=1 - smoothing + smoothing / num_classes,
                           off_value=smoothing / num_classes)
    if mix:
        coeffs = epoch_rng.beta(mix, mix, size=data.shape[0]).astype("float32")
        c = mx.nd.array(coeffs, ctx=data.context)
        shape = (-1,) + (1,) * (data.ndim - 1)
        data = (c.reshape(shape) * data.astype("float32") + (1 - c.reshape(shape)) *
                data[::-1].astype("float32")).astype(data.dtype)
        target = c.reshape((-1, 1)) * target + (1 - c.reshape((-1, 1))) * target[::-1]
    return data, target


def load_params(net, path, ctxs):
    """Load a .params file into ``net`` on the devices ``ctxs``; a file of another architecture is a TrainingError."""
    try:
        models.load_parameters(net, path, ctxs)
    except ValueError as error:
        raise TrainingError(f"{error}: it was saved from another architecture; check --arch/--num-layers/"
                            "--num-classes")
    except mx.base.MXNetError as error:  # faults: a truncated or foreign file
        raise TrainingError(f"{path} is damaged or not a parameter file ({checkpoint.mxnet_message(error)})")


def resume_state(resume, prefix, warn=None):
    """The checkpoint state --resume asks to continue from (``prefix``: the workspace's checkpoint prefix), or
    None to start afresh. ``warn`` hears of damaged checkpoints skipped."""
    if resume == "none":
        return None
    if resume == "auto":
        return checkpoint.resume_point(prefix, warn)
    state, why = checkpoint.named(resume)  # faults: verified, or why not
    if state is None:
        raise TrainingError(f"--resume {resume}: not a complete checkpoint ({why}; need <prefix>-NNNN.params with "
                            f"its .states and {checkpoint.STATE_SUFFIX} beside it)")
    return state


PARTIAL_KEYS = ("loss", "steps", "correct1", "correct5", "samples")


def gather_partial(stats, dist, name):
    """Every rank's partial sums of an interrupted epoch, indexed by rank (a collective): the epoch's metrics are
    sums over the ranks, so the checkpoint keeps them all."""
    return [dict(zip(PARTIAL_KEYS, values)) for values in dist.gather(stats.sums(), name)]


def sum_partial(partials):
    return {k: sum(p[k] for p in partials) for k in PARTIAL_KEYS}


def resumed_partial(state, dist):
    """This rank's partial sums of the interrupted epoch, or None to start from zero.

    With as many ranks as the checkpoint has sums for, each rank takes its own, and the resumed epoch reports
    exactly what an uninterrupted run would. With another worker count (or a checkpoint holding only the sums in
    "partial"), rank 0 carries the sums and the other ranks start from zero: every sample still counts once."""
    ranks = state.get("partial_ranks")
    if ranks and len(ranks) == dist.size:
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
    command: list
    report_path: str
    record: dict


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

    def elapsed(self):
        return self.report.total_duration + time.time() - self.run_start


def prepare(cfg, run, net, ctxs, dist):
    """A fresh TrainState: optimizer, loss scaler, EMA, LR schedule, report; rank 0's weights on every rank."""
    set_wd_groups(net, decay_all=cfg.wd_bn_bias)
    dist.broadcast_parameters(net)  # rank 0's initial weights everywhere; identical updates keep them equal
    return TrainState(
        trainer=make_trainer(net, dist, cfg.kv_store, cfg.optimizer, cfg.wd, cfg.mom, cfg.fp16_allreduce,
                             cfg.horovod_num_groups),
        scaler=make_loss_scaler(cfg.loss_scale, cfg.dtype),
        ema=EMA(net, cfg.ema_decay) if cfg.ema_decay else None,
        schedule=schedules.get_schedule(cfg.lr_schedule, cfg.lr, cfg.num_epochs, cfg.warmup_epochs,
                                        cfg.lr_steps, cfg.lr_factor, cfg.lr_power),
        report=Report(model=cfg.arch, ngpus=dist.size * len(ctxs), cmd=run.command))


def resume(state, checkpoint_state, run, net, ctxs, dist):
    """Continue ``state`` from a checkpoint's state (checkpoint.find_latest/read_state): weights, optimizer, loss
    scale, EMA, metrics so far, where to start, and this rank's sums of an interrupted epoch."""
    saved_model = checkpoint_state.get("model")
    if saved_model not in (None, run.model_name):
        raise TrainingError(f"the checkpoint {checkpoint_state['state_path']} comes from another architecture "
                            f"({saved_model}; this run: {run.model_name}); use another --workspace/--model-prefix "
                            "or --resume none")
    paths = checkpoint_state["paths"]
    load_params(net, paths["params"], ctxs)  # on every device: MXNet asserts the set
    state.trainer.load_states(paths["states"])
    state.scaler.load(checkpoint_state["loss_scaler"])
    if state.ema is not None and "ema" in paths:
        state.ema.load(paths["ema"])
    state.epoch, state.step = checkpoint_state["epoch"], checkpoint_state["step"]
    state.best_top1 = checkpoint_state["best_top1"]
    state.report.metrics.update(checkpoint_state["metrics"])
    state.report.total_duration = checkpoint_state.get("total_duration", 0.0)
    state.partial = resumed_partial(checkpoint_state, dist)
    if dist.is_primary:
        log.info("Resuming from %s: %s", checkpoint_state["state_path"], f"after epoch {state.epoch}"
                 if not state.step else f"epoch {state.epoch + 1}, step {state.step}")


def save_checkpoint(prefix, net, state, run, epoch, step, keep_last, seed, partials=None, best=False):
    """Rank 0: parameters, optimizer and the loop's state after ``step`` steps of ``epoch`` (0: a whole epoch),
    with each rank's sums of an interrupted epoch (``partials``); keeps the newest ``keep_last``."""
    saved = {"epoch": epoch, "step": step, "model": run.model_name, "best_top1": state.best_top1,
             "loss_scaler": state.scaler.state(), "metrics": state.report.metrics, "seed": seed,
             "total_duration": state.elapsed(), "partial": partials and sum_partial(partials),
             "partial_ranks": partials, **run.record}
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
    progress: Progress
    json_log: JsonLog
    end_epoch: int
    loss_fn: object = dataclasses.field(default_factory=lambda: gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False))


def train_one_epoch(cfg, loop, state, train_iter, epoch, skip=0):
    """Train ``epoch`` (0-based) from step ``skip``; returns (EpochStats of this rank, steps in the epoch,
    the step after which a stop signal ended it, or None)."""
    net, ctxs, dist = loop.net, loop.ctxs, loop.dist
    steps = len(train_iter) if cfg.benchmark_iters is None else min(len(train_iter), cfg.benchmark_iters)
    stats = EpochStats.resumed(state.partial)
    state.partial = None
    mix = cfg.mixup if epoch < cfg.num_epochs - cfg.mixup_off_epochs else 0.0
    step_batch = cfg.batch_size // dist.size * len(ctxs) if cfg.kv_store == "horovod" else cfg.batch_size
    tic = epoch_tic = stats.started
    counted = []  # the last step's top-k hits, still on the device
    for step, batch in enumerate(train_iter):
        if step >= steps:
            break
        if step < skip:  # resumed inside an epoch: the reseeded reader replays the same batches
            tic = time.time()
            continue
        lr = state.schedule(epoch + step / steps)
        state.trainer.set_learning_rate(lr)
        datas, labels = split(batch, ctxs, cfg.dtype)
        # Mixup coefficients depend only on (seed, epoch, rank, step), so a resumed run draws the same.
        rng = np.random.RandomState(None if cfg.seed is None else [cfg.seed, epoch, dist.rank, step])
        pairs = [make_targets(label, cfg.num_classes, cfg.label_smoothing, mix, rng, data)
                 for data, label in zip(datas, labels)]
        loss, outputs, applied = train_step(net, state.trainer, state.scaler, loop.loss_fn, [p[0] for p in pairs],
                                            [p[1] for p in pairs], step_batch, loop.guard, loop.stop.vote,
                                            scan_grads=cfg.dtype == "float16" or state.scaler.dynamic)
        if not applied:
            log.warning("Epoch[%d] Batch[%d]: non-finite loss/gradient, update skipped (loss scale now %g)",
                        epoch + 1, step + 1, state.scaler.scale)
            if state.scaler.bad_steps >= cfg.max_bad_steps:
                raise TrainingError(f"{state.scaler.bad_steps} consecutive steps had NaN/inf loss or gradients "
                                    f"(epoch {epoch + 1}, step {step + 1}); lower --lr or use float32")
        elif state.ema is not None:
            state.ema.update()
        if applied:
            stats.loss += loss
            stats.steps += 1
        if not cfg.no_metrics:
            # Read one step late: the device has long finished them, so reading never stalls its queue.
            stats.add_hits(counted)
            counted = [(*topk_counts(out, label, valid), valid) for out, label, valid in
                       zip(outputs, labels, valid_counts(batch, [out.shape[0] for out in outputs]))]
        now = time.time()
        stats.durations.append(now - tic)
        tic = now
        speed = cfg.batch_size * (step + 1 - skip) / max(now - epoch_tic, 1e-9)
        left = (steps - step - 1) + (loop.end_epoch - epoch - 1) * steps
        loop.progress.update(epoch + 1, step + 1, steps, speed, stats.loss / max(stats.steps, 1), lr,
                             left * cfg.batch_size / max(speed, 1e-9))
        loop.json_log.write("iter", epoch=epoch + 1, step=step, loss=loss, lr=lr,
                            ips=cfg.batch_size / stats.durations[-1], loss_scale=state.scaler.scale)
        if loop.stop.agreed and step + 1 < steps:
            loop.progress.end_epoch()
            stats.add_hits(counted)
            return stats, steps, step + 1
    stats.add_hits(counted)
    loop.progress.end_epoch()
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


def record_train_epoch(cfg, state, stats, epoch, dist):
    """The epoch's training metrics, summed over the ranks, into the report and rank 0's log; returns them."""
    sums = dist.sum(stats.sums(), "train")
    loss = sums[0] / max(sums[1], 1)
    values = {} if cfg.no_metrics else {"top1": sums[2] / max(sums[4], 1), "top5": sums[3] / max(sums[4], 1)}
    state.report.add_epoch("train", durations=stats.durations, batch_size=cfg.batch_size, **values, loss=loss)
    state.report.add("train.lr", state.schedule(epoch + 1 - 1e-9))
    if dist.is_primary:
        log.info("Epoch[%d] train loss %.4f%s, %.1f img/s, time %s", epoch + 1, loss,
                 "" if cfg.no_metrics else f" top1 {values['top1']:.4f}",
                 cfg.batch_size * len(stats.durations) / max(sum(stats.durations), 1e-9),
                 format_seconds(time.time() - stats.started))
    return {"train.loss": loss, **{f"train.{k}": v for k, v in values.items()}}


def record_validation(cfg, state, metrics, epoch, dist):
    state.report.add_epoch("val", top1=metrics["top1"], top5=metrics["top5"], loss=metrics["loss"],
                           durations=metrics["durations"], batch_size=cfg.batch_size)
    if dist.is_primary:
        log.info("Epoch[%d] validation top1 %.4f top5 %.4f loss %.4f (%d samples)", epoch + 1,
                 metrics["top1"], metrics["top5"], metrics["loss"], metrics["samples"])
    return {"val.top1": metrics["top1"], "val.top5": metrics["top5"], "val.loss": metrics["loss"],
            "val.samples": metrics["samples"]}


def fit(cfg, run, net, make_train_iter, val_iter, ctxs, dist):
    """Train ``net`` (initialised, hybridized) as ``cfg`` says, ``run`` describing the run; returns (report,
    stopped_by_signal)."""
    prefix = workspace_path(cfg.workspace, cfg.model_prefix)
    state = prepare(cfg, run, net, ctxs, dist)
    resumed = resume_state(cfg.resume, prefix, log.warning if dist.is_primary else None)
    if resumed is not None:
        resume(state, resumed, run, net, ctxs, dist)
    if cfg.resume != "auto" and dist.is_primary:
        moved = settings.set_aside_superseded(cfg.workspace, cfg.model_prefix, resumed, [run.report_path,
                                                                                           cfg.json_log])
        if moved:
            log.info("--resume %s: moved the files of the run not continued to %s", cfg.resume, moved)
    json_log = JsonLog(workspace_path(cfg.workspace, cfg.json_log) if dist.is_primary and cfg.json_log else None)
    json_log.write("params", **run.record, resumed_from=resumed and resumed["state_path"])
    end_epoch = cfg.num_epochs if cfg.run_epochs < 0 else min(cfg.num_epochs, state.epoch + cfg.run_epochs)
    loop = Loop(net=net, ctxs=ctxs, dist=dist, stop=StopFlag(dist), guard=StatsGuard(net),
                progress=Progress(dist.is_primary, cfg.disp_batches), json_log=json_log, end_epoch=end_epoch)
    if state.epoch >= end_epoch and dist.is_primary:
        log.info("All %d epochs are done already; --num-epochs N continues, --resume none starts afresh",
                 cfg.num_epochs)

    def save(epoch, step, partials=None, best=False):
        save_checkpoint(prefix, net, state, run, epoch, step, cfg.keep_last, cfg.seed, partials, best)

    stopped = False
    for epoch in range(state.epoch, end_epoch):
        stats, steps, stopped_at = train_one_epoch(cfg, loop, state, make_train_iter(epoch), epoch,
                                                   skip=state.step if epoch == state.epoch else 0)
        if stopped_at is not None:  # a stop signal: save this epoch's progress and end
            average_statistics(net, state.ema, dist)  # as at the epoch's end: each rank's averages differ
            partials = gather_partial(stats, dist, "partial")
            if dist.is_primary:
                save(epoch, stopped_at, partials)
            stopped = True
            break
        epoch_record = record_train_epoch(cfg, state, stats, epoch, dist)
        average_statistics(net, state.ema, dist)
        improved = False
        if val_iter is not None and cfg.mode == "train_val":
            metrics = validate(net, state.ema, val_iter, ctxs, dist, cfg.dtype, cfg.no_metrics,
                               cfg.benchmark_iters)
            epoch_record.update(record_validation(cfg, state, metrics, epoch, dist))
            improved = metrics["top1"] > state.best_top1
            state.best_top1 = max(state.best_top1, metrics["top1"])
        json_log.write("epoch", epoch=epoch + 1, **epoch_record)
        last = epoch + 1 == end_epoch
        due = cfg.save_frequency > 0 and (epoch + 1) % cfg.save_frequency == 0
        if dist.is_primary and (due or last or improved):
            save(epoch + 1, 0, best=improved)
        if loop.stop.agreed_now() and not last:
            if dist.is_primary and not (due or improved):
                save(epoch + 1, 0)
            stopped = True
            break
    state.report.total_duration = state.elapsed()
    if dist.is_primary:
        state.report.save(workspace_path(cfg.workspace, run.report_path))
        json_log.write("summary", total_duration=state.report.total_duration, stopped=stopped)
    json_log.close()
    return state.report, stopped


def load_for_scoring(cfg, net, ctxs, dist):
    """--load, else the latest checkpoint in --workspace; returns the path loaded, or None for fresh weights.

    --mode val scores freshly initialised weights when there is no checkpoint only where no accuracy is
    reported from them: on synthetic data, or with --no-metrics (a speed benchmark: the time a batch takes does
    not depend on the weights; the original kit benchmarked inference so). Elsewhere that is an error.
    """
    if hasattr(net, "loaded_from"):  # an INT8 graph made from the checkpoint already (train.int8_net)
        return net.loaded_from
    path = cfg.load
    if path is None:
        state = checkpoint.find_latest(workspace_path(cfg.workspace, cfg.model_prefix),
                                       log.warning if dist.is_primary else None)
        path = state and state["paths"]["params"]
    if path is None:
        if cfg.mode == "val" and (cfg.data_backend == "synthetic" or cfg.no_metrics):
            if dist.is_primary:
                log.info("No checkpoint found: scoring freshly initialised weights (a speed benchmark)")
            return None
        raise TrainingError(f"no checkpoint to score: give --load PATH.params or train first "
                            f"(nothing matches {workspace_path(cfg.workspace, cfg.model_prefix)}-NNNN.params); "
                            "to time fresh weights, add --no-metrics")
    if not os.path.isfile(path):
        raise TrainingError(f"--load {path} does not exist")
    checkpoint.check_loadable(path)  # faults: refuse a file its state file says is damaged
    load_params(net, path, ctxs)  # on every device the network was initialised on
    if dist.is_primary:
        log.info("Loaded %s", path)
    return path


def score(cfg, run, net, val_iter, ctxs, dist):
    """--mode val: --num-epochs passes over the validation data (with --benchmark-iters, that many batches per
    pass, the set cycled); returns the report, which names the weights scored."""
    if val_iter is None:
        raise TrainingError("--mode val needs validation data (--data-val)")
    loaded = load_for_scoring(cfg, net, ctxs, dist)
    dist.broadcast_parameters(net)
    report = Report(model=cfg.arch, ngpus=dist.size * len(ctxs), cmd=run.command)
    report.weights = os.path.abspath(loaded) if loaded else "fresh"
    report.info.update(getattr(net, "report_info", {}))  # e.g. how an INT8 graph was calibrated
    start = time.time()
    for epoch in range(cfg.num_epochs):
        metrics = evaluate(net, val_iter, ctxs, dist, cfg.dtype, cfg.no_metrics, cfg.benchmark_iters)
        values = {} if cfg.no_metrics else {k: metrics[k] for k in ("top1", "top5", "loss")}
        report.add_epoch("val", durations=metrics["durations"], batch_size=cfg.batch_size, **values)
        if dist.is_primary:
            log.info("Pass %d: %s%.1f img/s (%d samples)", epoch + 1,
                     "" if cfg.no_metrics else f"top1 {metrics['top1']:.4f} top5 {metrics['top5']:.4f} ",
                     report.metrics.get("val.total_ips", [0.0])[-1] if metrics["durations"] else 0.0,
                     metrics["samples"])
    report.total_duration = time.time() - start
    if dist.is_primary:
        report.save(workspace_path(cfg.workspace, run.report_path))
    return report
