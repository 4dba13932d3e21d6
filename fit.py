"""The training loop: recipes, mixed precision with loss scaling, validation, checkpoints, resume, modes."""
import logging
import math
import os
import signal
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import checkpoint
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
    group = parser.add_argument_group("Training", "hyper-parameters left unset come from --recipe")
    group.add_argument("--mode", default="train_val", choices=["train_val", "train", "val", "pred"],
                       help="train_val: train and validate each epoch; train: no validation; val: score a "
                            "checkpoint --num-epochs times; pred: top-5 classes of --data-pred")
    group.add_argument("--recipe", default="nvidia",
                       help=f"hyper-parameter preset: {', '.join(schedules.RECIPES)}")
    group.add_argument("--seed", type=int, default=None, help="random seed (python, numpy, MXNet and DALI)")
    group.add_argument("--kv-store", default="horovod", choices=["horovod", "device", "local"],
                       help="horovod: one process per device; device/local: one process, all --gpus")
    group.add_argument("--gpus", default=None, help="device mode: GPU ids, e.g. 0,1,2,3 (default: all)")
    group.add_argument("--cpu-contexts", type=int, default=1,
                       help="device mode without GPUs: split each batch over this many CPU contexts, one data "
                            "pipeline each (the multi-GPU code path on a CPU; no faster than 1)")
    group.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16", "int8"],
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
    group.add_argument("--data-pred", default=None, help="pred: image file to classify")
    group.add_argument("--class-names", default=None,
                       help="pred: file with one class name per line (default: class folders from the .lst "
                            "beside --data-train, else class indices)")
    return group


def workspace_path(args, name):
    return name if os.path.isabs(name) else os.path.join(args.workspace, name)


def check_args(args):
    """Raise ValueError for inconsistent hyper-parameters (after the recipe is applied)."""
    if args.report is None:
        args.report = "score.json" if args.mode == "val" else "report.json"
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
    if args.mode == "pred" and not args.data_pred:
        raise ValueError("--mode pred needs an image: --data-pred IMAGE")
    if args.data_pred and args.mode == "pred" and not os.path.isfile(args.data_pred):
        raise ValueError(f"--data-pred {args.data_pred} does not exist")


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


def make_loss_scaler(args):
    if args.loss_scale == "dynamic" or (args.loss_scale is None and args.dtype == "float16"):
        return LossScaler(2.0 ** 16, dynamic=True)
    return LossScaler(float(args.loss_scale or 1.0))


def grads_finite(params):
    return all_finite([g for p in params if p.grad_req != "null" for g in p.list_grad()])


def make_trainer(args, net, dist, kvstore):
    """Multi-precision SGD/NAG; Horovod's DistributedTrainer or a Gluon Trainer on a kvstore."""
    optimizer_params = {"learning_rate": 0.0, "wd": args.wd, "momentum": args.mom, "multi_precision": True}
    params = net.collect_params()
    if kvstore == "horovod":
        hvd = dist.hvd
        compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
        return hvd.DistributedTrainer(params, args.optimizer, optimizer_params, compression=compression,
                                      num_groups=args.horovod_num_groups)
    store = mx.kvstore.create(kvstore) if kvstore else None
    return gluon.Trainer(params, args.optimizer, optimizer_params, kvstore=store, update_on_kvstore=False)


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


def add_hits(acc, counted):
    """Add [(top-1 NDArray, top-5 NDArray, valid)] of a step to ``acc``'s floats."""
    for c1, c5, valid in counted:
        acc["correct1"] += c1.asscalar()
        acc["correct5"] += c5.asscalar()
        acc["samples"] += valid


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


def evaluate(net, val_iter, ctxs, dist, args, max_iters=None):
    """Top-1, top-5 and loss over the whole validation set, each sample counted once over all ranks (with
    ``max_iters``, that many batches are timed, the set cycled; the accuracy counts its first pass)."""
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    correct1 = correct5 = loss_sum = count = 0.0
    durations = []
    tic = time.time()
    for batch, first_pass in validation_batches(val_iter, max_iters):
        datas, labels = split(batch, ctxs, args.dtype)
        for data, label, valid in zip(datas, labels, valid_counts(batch, [d.shape[0] for d in datas])):
            logits = net(data).astype("float32")
            if args.no_metrics:
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


def restore(args, net, trainer, scaler, ema, state, ctxs):
    load_params(net, state["paths"]["params"], ctxs)  # on every device: MXNet asserts the set
    trainer.load_states(state["paths"]["states"])
    scaler.load(state["loss_scaler"])
    if ema is not None and "ema" in state["paths"]:
        ema.load(state["paths"]["ema"])


def resume_state(args):
    """The checkpoint state to continue from, or None to start afresh."""
    if args.resume == "none":
        return None
    prefix = workspace_path(args, args.model_prefix)
    if args.resume == "auto":
        return checkpoint.find_latest(prefix)
    path = args.resume
    state = checkpoint.read_state(path) if path.endswith(checkpoint.STATE_SUFFIX) else \
        checkpoint.state_for_params(path)
    if state is None:
        raise TrainingError(f"--resume {path}: not a complete checkpoint (need <prefix>-NNNN.params with "
                            f"its .states and {checkpoint.STATE_SUFFIX} beside it)")
    return state


PARTIAL_KEYS = ("loss", "steps", "correct1", "correct5", "samples")


def gather_partial(acc, dist, name):
    """Every rank's partial sums of an interrupted epoch, indexed by rank (a collective): the epoch's metrics are
    sums over the ranks, so the checkpoint keeps them all."""
    return [dict(zip(PARTIAL_KEYS, values)) for values in dist.gather([acc[k] for k in PARTIAL_KEYS], name)]


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


def fit(args, net, make_train_iter, val_iter, ctxs, dist):
    """Train ``net`` (initialised, hybridized); return (report, stopped_by_signal)."""
    prefix = workspace_path(args, args.model_prefix)
    state = resume_state(args)
    if state is not None and state.get("model") not in (None, args.model_name):
        raise TrainingError(f"the checkpoint {state['state_path']} comes from another architecture "
                            f"({state['model']}; this run: {args.model_name}); use another "
                            "--workspace/--model-prefix or --resume none")
    set_wd_groups(net, decay_all=args.wd_bn_bias)
    dist.broadcast_parameters(net)  # rank 0's initial weights everywhere; identical updates keep them equal
    trainer = make_trainer(args, net, dist, args.kv_store)
    scaler = make_loss_scaler(args)
    ema = EMA(net, args.ema_decay) if args.ema_decay else None
    schedule = schedules.get_schedule(args.lr_schedule, args.lr, args.num_epochs, args.warmup_epochs,
                                      args.lr_steps, args.lr_factor, args.lr_power)
    report = Report(model=args.arch, ngpus=dist.size * len(ctxs), cmd=args.cmd)
    start_epoch, start_step, best_top1, partial = 0, 0, -1.0, None
    if state is not None:
        restore(args, net, trainer, scaler, ema, state, ctxs)
        start_epoch, start_step = state["epoch"], state["step"]
        best_top1 = state["best_top1"]
        report.metrics.update(state["metrics"])
        report.total_duration = state.get("total_duration", 0.0)
        partial = resumed_partial(state, dist)
        if dist.is_primary:
            log.info("Resuming from %s: %s", state["state_path"], f"after epoch {start_epoch}" if not start_step
                     else f"epoch {start_epoch + 1}, step {start_step}")
    if args.resume != "auto" and dist.is_primary:
        moved = settings.set_aside_superseded(args.workspace, args.model_prefix, state, [args.report, args.json_log])
        if moved:
            log.info("--resume %s: moved the files of the run not continued to %s", args.resume, moved)
    json_log = JsonLog(workspace_path(args, args.json_log) if dist.is_primary and args.json_log else None)
    json_log.write("params", args=vars(args), resumed_from=state and state["state_path"])
    progress = Progress(dist.is_primary, args.disp_batches)
    stop = StopFlag(dist)
    guard = StatsGuard(net)
    local_batch = args.batch_size // dist.size
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False)
    end_epoch = args.num_epochs if args.run_epochs < 0 else min(args.num_epochs, start_epoch + args.run_epochs)
    run_start = time.time()
    stopped = False
    if start_epoch >= end_epoch and dist.is_primary:
        log.info("All %d epochs are done already; --num-epochs N continues, --resume none starts afresh",
                 args.num_epochs)

    def save(epoch, step, partials, best=False):
        ckpt_state = {"epoch": epoch, "step": step, "model": args.model_name, "best_top1": best_top1,
                      "loss_scaler": scaler.state(), "metrics": report.metrics, "seed": args.seed,
                      "total_duration": report.total_duration + time.time() - run_start,
                      "partial": partials and sum_partial(partials), "partial_ranks": partials,
                      "args": {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, list))}}
        path = checkpoint.save(prefix, net, trainer, ckpt_state, ema.saveable() if ema else None, best)
        log.info("Saved checkpoint %s", path)
        checkpoint.prune(prefix, args.keep_last)

    for epoch in range(start_epoch, end_epoch):
        train_iter = make_train_iter(epoch)
        steps = len(train_iter) if args.benchmark_iters is None else min(len(train_iter), args.benchmark_iters)
        acc = partial or {"loss": 0.0, "steps": 0.0, "correct1": 0.0, "correct5": 0.0, "samples": 0.0}
        partial = None
        skip = start_step if epoch == start_epoch else 0
        mix = args.mixup if epoch < args.num_epochs - args.mixup_off_epochs else 0.0
        durations, tic, epoch_tic = [], time.time(), time.time()
        counted = []  # the last step's top-k hits, still on the device
        for step, batch in enumerate(train_iter):
            if step >= steps:
                break
            if step < skip:  # resumed inside an epoch: the reseeded reader replays the same batches
                tic = time.time()
                continue
            lr = schedule(epoch + step / steps)
            trainer.set_learning_rate(lr)
            datas, labels = split(batch, ctxs, args.dtype)
            # Mixup coefficients depend only on (seed, epoch, rank, step), so a resumed run draws the same.
            rng = np.random.RandomState(None if args.seed is None else
                                        [args.seed, epoch, dist.rank, step])
            pairs = [make_targets(label, args.num_classes, args.label_smoothing, mix, rng, data)
                     for data, label in zip(datas, labels)]
            loss, outputs, applied = train_step(net, trainer, scaler, loss_fn, [p[0] for p in pairs],
                                                [p[1] for p in pairs], local_batch * len(ctxs)
                                                if args.kv_store == "horovod" else args.batch_size, guard, stop.vote,
                                                scan_grads=args.dtype == "float16" or scaler.dynamic)
            if not applied:
                log.warning("Epoch[%d] Batch[%d]: non-finite loss/gradient, update skipped (loss scale now %g)",
                            epoch + 1, step + 1, scaler.scale)
                if scaler.bad_steps >= args.max_bad_steps:
                    raise TrainingError(f"{scaler.bad_steps} consecutive steps had NaN/inf loss or gradients "
                                        f"(epoch {epoch + 1}, step {step + 1}); lower --lr or use float32")
            elif ema is not None:
                ema.update()
            if applied:
                acc["loss"] += loss
                acc["steps"] += 1
            if not args.no_metrics:
                # Read one step late: the device has long finished them, so reading never stalls its queue.
                add_hits(acc, counted)
                counted = [(*topk_counts(out, label, valid), valid) for out, label, valid in
                           zip(outputs, labels, valid_counts(batch, [out.shape[0] for out in outputs]))]
            now = time.time()
            durations.append(now - tic)
            tic = now
            done = step + 1 - skip
            speed = args.batch_size * done / max(now - epoch_tic, 1e-9)
            left = (steps - step - 1) + (end_epoch - epoch - 1) * steps
            progress.update(epoch + 1, step + 1, steps, speed, acc["loss"] / max(acc["steps"], 1), lr,
                            left * args.batch_size / max(speed, 1e-9))
            json_log.write("iter", epoch=epoch + 1, step=step, loss=loss, lr=lr, ips=args.batch_size / durations[-1],
                           loss_scale=scaler.scale)
            if stop.agreed and step + 1 < steps:
                progress.end_epoch()
                add_hits(acc, counted)
                average_over_devices(running_stats(net))
                dist.average_(running_stats(net), "bn")
                if ema is not None:  # as at the epoch's end: each rank's averages differ
                    dist.average_(ema.running_stats(), "ema.bn")
                partials = gather_partial(acc, dist, "partial")
                if dist.is_primary:
                    save(epoch, step + 1, partials)
                stopped = True
                break
        if stopped:
            break
        add_hits(acc, counted)
        progress.end_epoch()
        sums = dist.sum([acc["loss"], acc["steps"], acc["correct1"], acc["correct5"], acc["samples"]], "train")
        train_loss = sums[0] / max(sums[1], 1)
        values = {} if args.no_metrics else {"top1": sums[2] / max(sums[4], 1), "top5": sums[3] / max(sums[4], 1)}
        report.add_epoch("train", durations=durations, batch_size=args.batch_size, **values, loss=train_loss)
        report.add("train.lr", schedule(epoch + 1 - 1e-9))
        # Each rank keeps its own BatchNorm statistics: average them so validation and checkpoints
        # do not depend on the rank.
        # Collective names stay the same from epoch to epoch, so Horovod's response cache keeps serving them.
        average_over_devices(running_stats(net))  # so do the devices of one process (--kv-store device)
        dist.average_(running_stats(net), "bn")
        if ema is not None:  # the averages of those statistics differ by rank too
            dist.average_(ema.running_stats(), "ema.bn")
        if dist.is_primary:
            log.info("Epoch[%d] train loss %.4f%s, %.1f img/s, time %s", epoch + 1, train_loss,
                     "" if args.no_metrics else f" top1 {values['top1']:.4f}",
                     args.batch_size * len(durations) / max(sum(durations), 1e-9),
                     format_seconds(time.time() - epoch_tic))
        epoch_record = {"train.loss": train_loss, **{f"train.{k}": v for k, v in values.items()}}
        improved = False
        if val_iter is not None and args.mode == "train_val":
            if ema is not None:
                ema.swap()
            metrics = evaluate(net, val_iter, ctxs, dist, args, args.benchmark_iters)
            if ema is not None:
                ema.swap()
            report.add_epoch("val", top1=metrics["top1"], top5=metrics["top5"], loss=metrics["loss"],
                             durations=metrics["durations"], batch_size=args.batch_size)
            improved = metrics["top1"] > best_top1
            best_top1 = max(best_top1, metrics["top1"])
            epoch_record.update({"val.top1": metrics["top1"], "val.top5": metrics["top5"],
                                 "val.loss": metrics["loss"], "val.samples": metrics["samples"]})
            if dist.is_primary:
                log.info("Epoch[%d] validation top1 %.4f top5 %.4f loss %.4f (%d samples)", epoch + 1,
                         metrics["top1"], metrics["top5"], metrics["loss"], metrics["samples"])
        json_log.write("epoch", epoch=epoch + 1, **epoch_record)
        last = epoch + 1 == end_epoch
        due = args.save_frequency > 0 and (epoch + 1) % args.save_frequency == 0
        if dist.is_primary and (due or last or improved):
            save(epoch + 1, 0, None, best=improved)
        if stop.agreed_now() and not last:
            if dist.is_primary and not (due or improved):
                save(epoch + 1, 0, None)
            stopped = True
            break
    report.total_duration += time.time() - run_start
    if dist.is_primary:
        report.save(workspace_path(args, args.report))
        json_log.write("summary", total_duration=report.total_duration, stopped=stopped)
    json_log.close()
    return report, stopped


def load_for_scoring(args, net, ctxs, dist):
    """--load, else the latest checkpoint in --workspace; returns the path loaded, or None for fresh weights.

    --mode val scores freshly initialised weights when there is no checkpoint only where no accuracy is
    reported from them: on synthetic data, or with --no-metrics (a speed benchmark: the time a batch takes does
    not depend on the weights; the original kit benchmarked inference so). Elsewhere that is an error.
    """
    if hasattr(net, "loaded_from"):  # an INT8 graph made from the checkpoint already (train.int8_net)
        return net.loaded_from
    path = args.load
    if path is None:
        state = checkpoint.find_latest(workspace_path(args, args.model_prefix))
        path = state and state["paths"]["params"]
    if path is None:
        if args.mode == "val" and (args.data_backend == "synthetic" or args.no_metrics):
            if dist.is_primary:
                log.info("No checkpoint found: scoring freshly initialised weights (a speed benchmark)")
            return None
        raise TrainingError(f"no checkpoint to score: give --load PATH.params or train first "
                            f"(nothing matches {workspace_path(args, args.model_prefix)}-NNNN.params); "
                            "to time fresh weights, add --no-metrics")
    if not os.path.isfile(path):
        raise TrainingError(f"--load {path} does not exist")
    load_params(net, path, ctxs)  # on every device the network was initialised on
    if dist.is_primary:
        log.info("Loaded %s", path)
    return path


def score(args, net, val_iter, ctxs, dist):
    """--mode val: --num-epochs passes over the validation data (with --benchmark-iters, that many batches per
    pass, the set cycled); returns the report, which names the weights scored."""
    if val_iter is None:
        raise TrainingError("--mode val needs validation data (--data-val)")
    loaded = load_for_scoring(args, net, ctxs, dist)
    dist.broadcast_parameters(net)
    report = Report(model=args.arch, ngpus=dist.size * len(ctxs), cmd=args.cmd)
    report.weights = os.path.abspath(loaded) if loaded else "fresh"
    report.info.update(getattr(net, "report_info", {}))  # e.g. how an INT8 graph was calibrated
    start = time.time()
    for epoch in range(args.num_epochs):
        metrics = evaluate(net, val_iter, ctxs, dist, args, args.benchmark_iters)
        values = {} if args.no_metrics else {k: metrics[k] for k in ("top1", "top5", "loss")}
        report.add_epoch("val", durations=metrics["durations"], batch_size=args.batch_size, **values)
        if dist.is_primary:
            log.info("Pass %d: %s%.1f img/s (%d samples)", epoch + 1,
                     "" if args.no_metrics else f"top1 {metrics['top1']:.4f} top5 {metrics['top5']:.4f} ",
                     report.metrics.get("val.total_ips", [0.0])[-1] if metrics["durations"] else 0.0,
                     metrics["samples"])
    report.total_duration = time.time() - start
    if dist.is_primary:
        report.save(workspace_path(args, args.report))
    return report


def class_names(args):
    """Class names from --class-names, else the class folders in the .lst beside --data-train, else None."""
    if args.class_names:
        with open(args.class_names) as f:
            return [line.strip() for line in f if line.strip()]
    candidates = []
    if args.data_train:
        candidates.append(os.path.splitext(args.data_train)[0] + ".lst")
        candidates.append(os.path.join(os.path.dirname(args.data_train), "train.lst"))
    for lst in candidates:
        if os.path.isfile(lst):
            names = {}
            with open(lst) as f:
                for line in f:  # im2rec: index \t label \t relative/path
                    parts = line.rstrip("\n").split("\t")
                    if len(parts) >= 3:
                        names[int(float(parts[1]))] = parts[-1].replace("\\", "/").split("/")[0]
            return [names.get(i, str(i)) for i in range(max(names) + 1)] if names else None
    return None


def load_image(args, path):
    """The validation transform: shorter side to --data-val-resize, centre crop, normalise, layout."""
    import cv2
    image = cv2.imread(path, cv2.IMREAD_COLOR)
    if image is None:
        raise TrainingError(f"--data-pred {path} is not a readable image")
    image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    channels, height, width = args.image_shape
    h, w = image.shape[:2]
    scale = args.data_val_resize / min(h, w)
    image = cv2.resize(image, (max(width, round(w * scale)), max(height, round(h * scale))),
                       interpolation=cv2.INTER_LINEAR)
    top, left = (image.shape[0] - height) // 2, (image.shape[1] - width) // 2
    image = image[top:top + height, left:left + width].astype("float32")
    image = (image - np.array(args.rgb_mean, "float32")) / np.array(args.rgb_std, "float32")
    if channels == 4:
        image = np.concatenate([image, np.zeros_like(image[..., :1])], axis=-1)
    if args.input_layout == "NCHW":
        image = image.transpose(2, 0, 1)
    return image[None]


def predict(args, net, ctxs):
    """--mode pred: print the top-5 classes of --data-pred; returns [(probability, class index, name)]."""
    load_for_scoring(args, net, ctxs, Distributed(None))
    image = mx.nd.array(load_image(args, args.data_pred), ctx=ctxs[0])
    probs = net(image.astype(out_dtype(args.dtype))).astype("float32").softmax()[0].asnumpy()
    names = class_names(args)
    if names is None:
        log.info("No class names (--class-names, or a .lst beside --data-train): printing class indices")
    top = np.argsort(-probs)[:5]
    result = []
    for rank, index in enumerate(top, 1):
        name = names[index] if names and index < len(names) else str(index)
        print(f"{rank}. {100 * probs[index]:6.2f}% -> {name}")
        result.append((float(probs[index]), int(index), name))
    return result
