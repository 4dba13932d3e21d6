"""The training loop and its phases: prepare or resume the state, train an epoch, validate, save, stop on a signal.

Its helpers live in modules named for them: distributed.py (collectives), precision.py (loss scaling and the
finite checks), scoring.py (evaluation, --mode val/pred), checkpoint.py (files), schedules.py (recipes, LR)."""
import dataclasses
import importlib.util
import logging
import math
import signal
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from rn50kit.training import checkpoint
from rn50kit.training.checkpoint import workspace_path
from rn50kit.common import cli
from rn50kit.training.distributed import Distributed, average_over_devices
from rn50kit.reporting.mlperf_log import MLPerfLog
from models import running_stats
from rn50kit.training import optimizers
from rn50kit.training.precision import LossScaler, StatsGuard, grads_finite, make_loss_scaler
from rn50kit.weights.pretrained import FinetuneConfig, backbone_lr_mult, set_backbone_lr_mult
from rn50kit.common import schedules
from rn50kit.scoring.scoring import evaluate, split, topk_counts, valid_counts
from rn50kit.config import settings
from rn50kit.reporting.progress import JsonLog, Progress, format_seconds
from rn50kit.reporting.report import Report

log = logging.getLogger("rn50")


class TrainingError(Exception):
    """The run cannot go on (diverged, bad checkpoint): reported as one line."""


_RECIPE = schedules.recipe_defaults(schedules.DEFAULT_RECIPE)  # the defaults a recipe sets


@dataclasses.dataclass(frozen=True)
class FitConfig:
    """The Training flags' values (their defaults are these; a recipe's are the default recipe's, and the LR
    and the epochs are filled in from the recipe and the batch by train.fill_hyper_parameters)."""
    mode: str = "train_val"
    recipe: str = schedules.DEFAULT_RECIPE
    seed: int = None
    kv_store: str = "horovod"
    gpus: str = None
    cpu_contexts: int = 1
    dtype: str = None  # settings.machine_defaults: float16 with a GPU, float32 without
    batch_size: int = 192  # with a GPU; without one settings.CPU_BATCH_SIZE when not given
    grad_accum_steps: int = 1
    num_epochs: int = None
    run_epochs: int = -1
    lr: float = None
    lr_schedule: str = _RECIPE["lr_schedule"]
    lr_steps: tuple = tuple(_RECIPE["lr_steps"])
    lr_factor: float = _RECIPE["lr_factor"]
    lr_power: float = 2.0
    lr_end: float = 0.0
    warmup_epochs: float = _RECIPE["warmup_epochs"]
    optimizer: str = _RECIPE["optimizer"]
    mom: float = _RECIPE["mom"]
    lars_eta: float = 0.001
    lars_eps: float = 0.0
    wd: float = _RECIPE["wd"]
    wd_bn_bias: bool = False
    label_smoothing: float = _RECIPE["label_smoothing"]
    mixup: float = _RECIPE["mixup"]
    mixup_off_epochs: int = 0
    cutmix: float = 0.0
    mixup_switch_prob: float = 0.5
    loss: str = "ce"
    bce_target_thresh: float = 0.0
    ema_decay: float = 0.0
    memory_check: str = "refuse"
    loss_scale: str = None
    max_bad_steps: int = 50
    horovod_num_groups: int = 0
    fp16_allreduce: bool = False
    disp_batches: int = 20
    benchmark_iters: int = None
    no_metrics: bool = False
    workspace: str = None
    model_prefix: str = "model"
    save_frequency: int = 1
    keep_last: int = 3
    resume: str = "auto"
    load: str = None
    report: str = None
    json_log: str = "log.jsonl"
    eval_every: int = 1
    eval_offset: int = 0
    target_top1: float = None
    mllog: str = None


def add_fit_args(parser):
    group = parser.add_argument_group("Training", "--recipe gives the defaults marked recipe:; a flag given wins")
    group.add_argument("--mode", choices=["train_val", "train", "val", "pred"],
                       help="train_val: train and validate each epoch; train: no validation; val: score a "
                            "checkpoint --num-epochs times; pred: top-5 classes of --data-pred")
    group.add_argument("--recipe", choices=list(schedules.RECIPES),
                       help="hyper-parameter preset: the defaults of the flags marked 'recipe:' (a flag given "
                            "on the command line wins)")
    group.add_argument("--seed", type=int, help="random seed (python, numpy, MXNet and DALI)")
    group.add_argument("--kv-store", choices=cli.KV_STORES,
                       help="horovod: one process per device; device/local: one process, all --gpus")
    group.add_argument("--gpus", help="device mode: GPU ids, e.g. 0,1,2,3 (default: all)")
    group.add_argument("--cpu-contexts", type=int,
                       help="device mode without GPUs: split each batch over this many CPU contexts, one data "
                            "pipeline each (the multi-GPU code path on a CPU; no faster than 1)")
    group.add_argument("--dtype", choices=cli.DTYPES,
                       help="model precision (default: float16 with a GPU, float32 without; float16: fp32 master "
                            "weights and loss scaling; bfloat16: CPU; int8: scoring on the CPU, the checkpoint "
                            "quantized by oneDNN, see --calib-mode)")
    group.add_argument("--batch-size", type=int,
                       help="global batch size of one forward/backward pass (all workers; without a GPU the "
                            "default is 32); the optimizer's batch is this x --grad-accum-steps")
    group.add_argument("--grad-accum-steps", type=int,
                       help="gradient accumulation (timm's name): sum the gradients of K batches locally, allreduce "
                            "and update once, for an effective global batch of K x --batch-size; the LR, its "
                            "schedule and the recipe's LR follow the effective batch")
    group.add_argument("--num-epochs", type=int, help=f"epochs ({schedules.recipe_help('num_epochs')})")
    group.add_argument("--run-epochs", type=int, help="stop after this many epochs in this run")
    group.add_argument("--lr", type=float,
                       help="absolute LR for the effective global batch (default: the recipe's LR per 256 x "
                            f"batch/256, or from its points; {schedules.recipe_lr_help()})")
    group.add_argument("--lr-schedule", choices=schedules.SCHEDULES,
                       help=f"LR schedule ({schedules.recipe_help('lr_schedule')})")
    group.add_argument("--lr-steps", type=lambda s: [float(x) for x in s.split(",") if x],
                       help="step schedule: epochs at which the LR is multiplied by --lr-factor "
                            f"({schedules.recipe_help('lr_steps')})")
    group.add_argument("--lr-factor", type=float,
                       help=f"step schedule: decay factor ({schedules.recipe_help('lr_factor')})")
    group.add_argument("--lr-power", type=float, help="poly schedule: exponent")
    group.add_argument("--lr-end", type=float,
                       help="cosine/poly/linear: the LR at the end of --num-epochs (mlperf recipe: 1e-4)")
    group.add_argument("--warmup-epochs", type=float,
                       help=f"linear warmup from 0, in epochs ({schedules.recipe_help('warmup_epochs')})")
    group.add_argument("--optimizer", choices=list(OPTIMIZERS),
                       help="sgd (momentum), nag (Nesterov), lars (MXNet's LARS: SGD with momentum, each "
                            "weight's LR times eta x |w| / (|g| + wd x |w| + eps); none on BatchNorm "
                            "gamma/beta and biases) or lamb (MXNet's LAMB: layer-wise trust ratio, betas "
                            f"0.9/0.999, eps 1e-6; --mom unused) ({schedules.recipe_help('optimizer')})")
    group.add_argument("--lars-eta", type=float, help="lars: trust coefficient eta")
    group.add_argument("--lars-eps", type=float, help="lars: epsilon in the trust ratio's denominator")
    group.add_argument("--mom", type=float, help=f"momentum ({schedules.recipe_help('mom')})")
    group.add_argument("--wd", type=float, help=f"weight decay ({schedules.recipe_help('wd')})")
    group.add_argument("--wd-bn-bias", action="store_true",
                       help="also decay BatchNorm gamma/beta and biases (default: they get no weight decay)")
    group.add_argument("--label-smoothing", type=float,
                       help=f"label smoothing factor ({schedules.recipe_help('label_smoothing')})")
    group.add_argument("--mixup", type=float,
                       help=f"mixup Beta(a, a) parameter; 0 = off ({schedules.recipe_help('mixup')})")
    group.add_argument("--mixup-off-epochs", type=int, help="no mixup (nor CutMix) in the last N epochs")
    group.add_argument("--cutmix", type=float,
                       help="CutMix Beta(a, a) parameter: a box of the reversed batch pasted in, the targets mixed by "
                            "its area; 0 = off (with --mixup too, one of them per batch, see --mixup-switch-prob)")
    group.add_argument("--mixup-switch-prob", type=float,
                       help="with --mixup and --cutmix: the chance a batch gets CutMix rather than mixup (timm's "
                            "switch_prob)")
    group.add_argument("--loss", choices=["ce", "bce"],
                       help="ce: softmax cross-entropy; bce: binary cross-entropy per class on the (soft) targets, "
                            "as the RSB procedures")
    group.add_argument("--bce-target-thresh", type=float,
                       help="bce: targets above this become 1, the others 0 (timm's bce_target_thresh); 0 = soft")
    group.add_argument("--ema-decay", type=float,
                       help="keep an exponential moving average of the weights (e.g. 0.9999); 0 = off. "
                            "Validation uses the EMA weights; they are saved beside each checkpoint")
    group.add_argument("--memory-check", choices=["refuse", "warn", "off"],
                       help="before training, estimate the memory the batch needs per device (activations by "
                            "layer, batch, dtype) against the machine's: refuse (naming a batch that fits), warn, "
                            "or off")
    group.add_argument("--loss-scale",
                       help="'dynamic' or a fixed number (default: dynamic for float16, 1 otherwise)")
    group.add_argument("--max-bad-steps", type=int,
                       help="stop when this many consecutive steps have a NaN/inf loss or gradient")
    group.add_argument("--horovod-num-groups", type=int, help="grouped allreduce: number of groups")
    group.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to float16 for allreduce")
    group.add_argument("--disp-batches", type=int, help="log every N iterations")
    group.add_argument("--benchmark-iters", type=int, help="cap iterations per epoch (benchmarks)")
    group.add_argument("--no-metrics", action="store_true", help="skip accuracy computation (benchmarks)")
    group.add_argument("--workspace",
                       help="directory for checkpoints, logs and the report (default: runs/<model>, e.g. "
                            "runs/resnet50_v1.5, in the current directory)")
    group.add_argument("--model-prefix", help="checkpoint file prefix, inside --workspace")
    group.add_argument("--save-frequency", type=int,
                       help="checkpoint every N epochs (0: only the last; the best is always kept)")
    group.add_argument("--keep-last", type=int,
                       help="keep the newest K epoch checkpoints (0: all) besides <prefix>-best.params; a step "
                            "checkpoint (after SIGTERM) is removed once a newer checkpoint exists")
    group.add_argument("--resume",
                       help="auto: continue from the latest complete checkpoint; none: start afresh (the earlier "
                            "run's files move to <workspace>/previous-<time>/); or a <prefix>-NNNN.params / "
                            ".state.json path (later checkpoints move aside the same way)")
    group.add_argument("--load",
                       help="val/pred: parameters to score (default: the latest checkpoint of --workspace); the "
                            "model, classes, image shape, resize and normalisation come from its saved state")
    group.add_argument("--report",
                       help="JSON report (relative: inside --workspace; default report.json, and for --mode val "
                            "<checkpoint>.<dtype>.score.json beside the checkpoint scored, e.g. model-0016.float32.score.json; "
                            "int8: model-0016.int8-naive-10.score.json)")
    group.add_argument("--json-log",
                       help="JSON-lines log (relative: inside --workspace); empty to disable")
    group.add_argument("--eval-every", type=int,
                       help="train_val: validate every N epochs (and after the last one)")
    group.add_argument("--eval-offset", type=int,
                       help="train_val: the first validation after epoch M+1 (mlperf: every 4 from epoch 3, "
                            "offset 2)")
    group.add_argument("--target-top1", type=float,
                       help="stop at the first validation whose top-1 reaches this (a fraction, e.g. 0.759); "
                            "the report says when")
    group.add_argument("--mllog",
                       help="write an MLPerf-style :::MLLOG log here (relative: inside --workspace) through the "
                            "mlperf-logging package, for MLCommons' compliance checker")
    parser.set_defaults(**cli.config_defaults(FitConfig))
    return group


def check(cfg):
    """Raise ValueError for inconsistent hyper-parameters of a FitConfig."""
    if cfg.num_epochs <= 0:
        raise ValueError(f"--num-epochs must be positive, got {cfg.num_epochs}")
    if cfg.lr is not None and not cfg.lr >= 0:  # NaN too
        raise ValueError(f"--lr must not be negative, got {cfg.lr:g}")
    if cfg.lr_schedule == "step":
        late = [s for s in cfg.lr_steps if s >= cfg.num_epochs]
        if late:
            raise ValueError(f"--lr-steps {late} lie at or beyond the last epoch ({cfg.num_epochs}); "
                             "give steps below --num-epochs")
    if cfg.grad_accum_steps < 1:
        raise ValueError(f"--grad-accum-steps must be at least 1, got {cfg.grad_accum_steps}")
    if cfg.eval_every < 1 or cfg.eval_offset < 0:
        raise ValueError(f"--eval-every must be at least 1 and --eval-offset at least 0, got {cfg.eval_every} "
                         f"and {cfg.eval_offset}")
    if cfg.target_top1 is not None and not 0 < cfg.target_top1 <= 1:
        raise ValueError(f"--target-top1 is a fraction in (0, 1] (e.g. 0.759 for 75.9 %), got {cfg.target_top1}")
    if cfg.mllog and importlib.util.find_spec("mlperf_logging") is None:
        raise ValueError("--mllog writes through the mlperf-logging package, not installed for this Python: "
                         "`make setup` installs it (or pip install mlperf-logging==4.1.68)")
    if cfg.cutmix < 0 or not 0 <= cfg.mixup_switch_prob <= 1 or not 0 <= cfg.bce_target_thresh < 1:
        raise ValueError(f"--cutmix must be >= 0, --mixup-switch-prob in [0, 1] and --bce-target-thresh in [0, 1); "
                         f"got {cfg.cutmix:g}, {cfg.mixup_switch_prob:g} and {cfg.bce_target_thresh:g}")
    if not 0 <= cfg.ema_decay < 1:
        raise ValueError(f"--ema-decay must be in [0, 1), got {cfg.ema_decay}")
    if cfg.loss_scale not in (None, "dynamic"):
        try:
            if float(cfg.loss_scale) <= 0:
                raise ValueError
        except ValueError:
            raise ValueError(f"--loss-scale must be 'dynamic' or a positive number, got {cfg.loss_scale}")






OPTIMIZERS = ("sgd", "nag", "lars", "lamb")  # MXNet's registered names


def no_decay(name):
    """BatchNorm gamma/beta and biases: decaying them only hurts (Goyal et al. 2017; NVIDIA's README)."""
    return name.endswith(("gamma", "beta", "bias"))


def set_wd_groups(net, decay_all=False):
    for name, param in net.collect_params().items():
        param.wd_mult = 1.0 if decay_all or not no_decay(name) else 0.0




def optimizer_params(net, optimizer, wd, momentum, lars_eta=0.001, lars_eps=0.0):
    """The optimizer's parameters (the LR is set every step).

    lars: MXNet 1.9.1's LARS decides which parameters get no trust ratio by their names (ending in gamma, beta or
    bias), read from ``param_idx2name``, which a Gluon Trainer does not fill in (every parameter would get one):
    it is given here, indexed as the Trainer indexes (parameters sorted by name). Its momentum correction (momentum
    x LR / previous LR) is off: the LR changes every step, and from a warmup's first LR of 0 it would make the
    second step's momentum 2x. lamb: its own moments (MXNet's defaults, timm's: betas 0.9/0.999, eps 1e-6, bias
    correction), no momentum."""
    params = {"learning_rate": 0.0, "wd": wd, "multi_precision": True}
    if optimizer != "lamb":
        params["momentum"] = momentum
    if optimizer == "lars":
        params.update(eta=lars_eta, eps=lars_eps, momentum_correction=False,
                      param_idx2name=dict(enumerate(sorted(net.collect_params().keys()))))
    return params


def make_trainer(net, dist, kvstore, optimizer, wd, momentum, fp16_allreduce=False, num_groups=0, lars_eta=0.001,
                 lars_eps=0.0):
    """Multi-precision SGD/NAG/LARS/LAMB; Horovod's DistributedTrainer or a Gluon Trainer on a kvstore."""
    optimizer_params_ = optimizer_params(net, optimizer, wd, momentum, lars_eta, lars_eps)
    # MXNet's optimizers; SGD, LARS and LAMB with faster updates on CPU (optimizers.py)
    optimizer, optimizer_params_ = optimizers.create(optimizer, **optimizer_params_), None
    params = net.collect_params()
    if kvstore == "horovod":
        hvd = dist.hvd
        compression = hvd.Compression.fp16 if fp16_allreduce else hvd.Compression.none
        return hvd.DistributedTrainer(params, optimizer, optimizer_params_, compression=compression,
                                      num_groups=num_groups)
    store = mx.kvstore.create(kvstore) if kvstore else None
    return gluon.Trainer(params, optimizer, optimizer_params_, kvstore=store, update_on_kvstore=False)




def accumulate_gradients(params):
    """Gradient accumulation: backward passes add to the gradients (zeroed after each update)."""
    for param in params.values():
        if param.grad_req != "null":
            param.grad_req = "add"


def zero_accumulated(params):
    for param in params:
        if param.grad_req == "add":
            param.zero_grad()


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
    return loss, outputs, finite


def mean_loss(losses):
    """The mean of the per-device loss vectors, read from the devices at once."""
    sums = [loss.sum().as_in_context(mx.cpu()) for loss in losses]
    total = sums[0] if len(sums) == 1 else mx.nd.add_n(*sums)
    return total.asscalar() / sum(loss.shape[0] for loss in losses)




_early_stop_signals = []  # stop signals that came before the loop's StopFlag existed (start-up)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)  # SIGINT: Ctrl-C on a terminal
stop_signals_received = []  # every stop signal of this process, in order (train.py's exit status: 130 for SIGINT)


def _note_stop(signum, queue):
    """A stop request; a second Ctrl-C does not wait for the step boundary (KeyboardInterrupt, as by default)."""
    if signum == signal.SIGINT and signal.SIGINT in stop_signals_received:
        raise KeyboardInterrupt
    stop_signals_received.append(signum)
    queue.append(signum)


def catch_stop_signals(pending=()):
    """From now on a SIGTERM/SIGUSR1/SIGINT is not fatal: it asks the loop (once it runs) to save and stop.
    ``pending``: such signals kept before this call."""
    _early_stop_signals.extend(pending)
    stop_signals_received.extend(pending)
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, frame: _note_stop(signum, _early_stop_signals))


class StopFlag:
    """SIGTERM/SIGUSR1/SIGINT ask for a checkpoint at the next step boundary (a second SIGINT: at once, unsaved).

    ``vote`` is the one small allreduce per step: it tells whether every rank's loss is finite, and carries
    the stop request along, so all ranks stop at the same step.
    """

    def __init__(self, dist):
        self.dist = dist
        self.requested = bool(_early_stop_signals)
        self.agreed = False
        self.votes = 0
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handler)

    def _handler(self, signum, frame):
        _note_stop(signum, [])
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

    def exported(self, export):
        """Run ``export()`` with the averages in the network (the live weights are put back after)."""
        self.swap()
        try:
            export()
        finally:
            self.swap()

    def running_stats(self):
        return [value for name, value in sorted(self.shadow.items())
                if name.endswith(("running_mean", "running_var"))]

    def saveable(self):
        return {name: v for name, v in self.shadow.items()}

    def load(self, path):
        loaded = mx.nd.load(path)
        for name in self.shadow:
            self.shadow[name] = loaded[name].as_in_context(self.shadow[name].context)


def make_targets(label, num_classes, smoothing, mix, epoch_rng, data, cutmix=0.0, switch_prob=0.5):
    """Smoothed one-hot targets; with mixup, data and targets mixed with the reversed batch; with CutMix (alone,
    or instead of mixup with probability ``switch_prob``), a box of the reversed batch pasted in."""
    target = label.one_hot(num_classes, on_value=1 - smoothing + smoothing / num_classes,
                           off_value=smoothing / num_classes)
    if cutmix and (not mix or epoch_rng.rand() < switch_prob):
        return cutmix_batch(data, target, cutmix, epoch_rng)
    if mix:
        coeffs = epoch_rng.beta(mix, mix, size=data.shape[0]).astype("float32")
        c = mx.nd.array(coeffs, ctx=data.context)
        shape = (-1,) + (1,) * (data.ndim - 1)
        data = (c.reshape(shape) * data.astype("float32") + (1 - c.reshape(shape)) *
                data[::-1].astype("float32")).astype(data.dtype)
        target = c.reshape((-1, 1)) * target + (1 - c.reshape((-1, 1))) * target[::-1]
    return data, target




def cutmix_batch(data, target, alpha, rng):
    """timm's CutMix ("batch" mode): one box of area about (1 - lam) of the image, lam ~ Beta(alpha, alpha), centred
    uniformly and clipped to the image, pasted from the reversed batch into every image; the targets are mixed by
    the area actually pasted. NCHW or NHWC (the channel axis is the one of size 3 or 4)."""
    nhwc = data.shape[3] in (3, 4) and data.shape[1] not in (3, 4)
    height, width = data.shape[1:3] if nhwc else data.shape[2:4]
    lam = rng.beta(alpha, alpha)
    cut = math.sqrt(1 - lam)
    cut_h, cut_w = int(height * cut), int(width * cut)
    cy, cx = rng.randint(0, height), rng.randint(0, width)
    y0, y1 = np.clip([cy - cut_h // 2, cy + cut_h // 2], 0, height)
    x0, x1 = np.clip([cx - cut_w // 2, cx + cut_w // 2], 0, width)
    box = np.zeros((height, width), dtype="float32")
    box[y0:y1, x0:x1] = 1
    pasted = float(box.mean())  # the share of the image from the reversed batch
    mask = mx.nd.array(box.reshape((1, height, width, 1) if nhwc else (1, 1, height, width)), ctx=data.context,
                       dtype=data.dtype)
    data = mx.nd.broadcast_mul(data, 1 - mask) + mx.nd.broadcast_mul(data[::-1], mask)
    return data, (1 - pasted) * target + pasted * target[::-1]


class BinaryCrossEntropy(gluon.loss.Loss):
    """Binary cross-entropy of every class's logit against its (soft) target, averaged over the classes: timm's
    BinaryCrossEntropy (mean over batch and classes), with its target threshold (``thresh``; 0: soft targets)."""

    def __init__(self, thresh=0.0, **kwargs):
        super().__init__(weight=None, batch_axis=0, **kwargs)
        self.thresh = thresh

    def hybrid_forward(self, F, pred, target):
        if self.thresh:
            target = target > self.thresh
        # max(x, 0) - x t + log(1 + exp(-|x|)): stable for any logit
        loss = F.relu(pred) - pred * target + F.Activation(-F.abs(pred), act_type="softrelu")
        return F.mean(loss, axis=1)


def make_loss(cfg):
    """The training loss of a FitConfig (on soft targets: smoothing, mixup, CutMix)."""
    if cfg.loss == "bce":
        return BinaryCrossEntropy(cfg.bce_target_thresh)
    return gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False)


def resume_state(resume, prefix, warn=None):
    """The checkpoint state --resume asks to continue from (``prefix``: the workspace's checkpoint prefix), or
    None to start afresh. ``warn`` hears of damaged checkpoints skipped."""
    if resume == "none":
        return None
    if resume == "auto":
        return checkpoint.resume_point(prefix, warn)
    state, why = checkpoint.named(resume)  # faults: verified, or why not
    if state is None:
        raise TrainingError(f"--resume {resume}: {why}" if why and "damaged" in why else
                            checkpoint.why_not_resumable(resume))
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
    arch: str
    command: list
    report_path: str
    record: dict
    report_info: dict = dataclasses.field(default_factory=dict)  # how the run started (e.g. --pretrained), for the report


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


def prepare(cfg, run, net, ctxs, dist):
    """A fresh TrainState: optimizer, loss scaler, EMA, LR schedule, report; rank 0's weights on every rank."""
    set_wd_groups(net, decay_all=cfg.wd_bn_bias)
    if cfg.grad_accum_steps > 1:
        accumulate_gradients(net.collect_params())
    dist.broadcast_parameters(net)  # rank 0's initial weights everywhere; identical updates keep them equal
    return TrainState(
        trainer=make_trainer(net, dist, cfg.kv_store, cfg.optimizer, cfg.wd, cfg.mom, cfg.fp16_allreduce,
                             cfg.horovod_num_groups, cfg.lars_eta, cfg.lars_eps),
        scaler=make_loss_scaler(cfg.loss_scale, cfg.dtype),
        ema=EMA(net, cfg.ema_decay) if cfg.ema_decay else None,
        schedule=schedules.get_schedule(cfg.lr_schedule, cfg.lr, cfg.num_epochs, cfg.warmup_epochs,
                                        cfg.lr_steps, cfg.lr_factor, cfg.lr_power, cfg.lr_end),
        report=Report(model=run.model_name, ngpus=dist.size * len(ctxs), cmd=run.command, info=run.report_info))


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
    paths = checkpoint_state["paths"]
    checkpoint.load_params(net, paths["params"], ctxs)  # on every device: MXNet asserts the set
    optimizers.load_states(state.trainer, paths["states"])
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


RESUME_SETTINGS = ("batch_size", "image_shape", "num_epochs", "lr", "lr_schedule", "dtype")


def changed_on_resume(saved, now):
    """'--batch-size 64 (was 32), ...' for the settings that shape training and differ from the checkpoint's run."""
    def show(value):
        return ",".join(str(v) for v in value) if isinstance(value, list) else f"{value:g}" \
            if isinstance(value, float) else str(value)
    return ", ".join(f"--{key.replace('_', '-')} {show(now[key])} (was {show(saved[key])})" for key in RESUME_SETTINGS
                     if key in saved and key in now and show(saved[key]) != show(now[key]))


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
    progress: Progress
    json_log: JsonLog
    end_epoch: int
    num_classes: int
    loss_fn: object = dataclasses.field(default_factory=lambda: gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False))


def train_one_epoch(cfg, loop, state, train_iter, epoch, skip=0):
    """Train ``epoch`` (0-based) from step ``skip``; returns (EpochStats of this rank, steps in the epoch,
    the step after which a stop signal ended it, or None)."""
    net, ctxs, dist = loop.net, loop.ctxs, loop.dist
    accum = cfg.grad_accum_steps
    steps = len(train_iter) if cfg.benchmark_iters is None else min(len(train_iter), cfg.benchmark_iters)
    steps -= steps % accum  # whole optimizer steps only: the last few batches of an epoch are left out
    if steps == 0:
        raise TrainingError(f"an epoch has fewer batches ({len(train_iter)}) than --grad-accum-steps {accum}")
    if skip % accum:
        raise TrainingError(f"the checkpoint stopped after batch {skip} of the epoch, inside an accumulation of "
                            f"--grad-accum-steps {accum}: resume with the run's own --grad-accum-steps")
    updates = steps // accum  # optimizer steps in the epoch
    stats = EpochStats.resumed(state.partial)
    state.partial = None
    mix = cfg.mixup if epoch < cfg.num_epochs - cfg.mixup_off_epochs else 0.0
    mix_off = epoch >= cfg.num_epochs - cfg.mixup_off_epochs
    step_batch = cfg.batch_size // dist.size * len(ctxs) if cfg.kv_store == "horovod" else cfg.batch_size
    tic = epoch_tic = stats.started
    counted = []  # the last step's top-k hits, still on the device
    group_loss, group_ok = 0.0, True  # the micro-batches of the optimizer step under way
    for step, batch in enumerate(train_iter):
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
        # Mixup coefficients depend only on (seed, epoch, rank, step), so a resumed run draws the same.
        rng = np.random.RandomState(None if cfg.seed is None else [cfg.seed, epoch, dist.rank, step])
        pairs = [make_targets(label, loop.num_classes, cfg.label_smoothing, mix, rng, data,
                              0.0 if mix_off else cfg.cutmix, cfg.mixup_switch_prob)
                 for data, label in zip(datas, labels)]
        loss, outputs, applied = train_step(net, state.trainer, state.scaler, loop.loss_fn, [p[0] for p in pairs],
                                            [p[1] for p in pairs], step_batch * accum,
                                            loop.guard if accum == 1 else None, loop.stop.vote,
                                            scan_grads=cfg.dtype == "float16" or state.scaler.dynamic,
                                            update=last, earlier_ok=group_ok)
        group_loss += loss
        group_ok = group_ok and math.isfinite(loss)
        if applied is False and accum > 1:
            loop.guard.restore_if_bad()  # BatchNorm statistics as before the accumulation's first batch
        if applied is False:
            log.warning("Epoch[%d] Batch[%d]: non-finite loss/gradient, update skipped (loss scale now %g)",
                        epoch + 1, step + 1, state.scaler.scale)
            if state.scaler.bad_steps >= cfg.max_bad_steps:
                raise TrainingError(f"{state.scaler.bad_steps} consecutive steps had NaN/inf loss or gradients "
                                    f"(epoch {epoch + 1}, step {step + 1}); lower --lr or use float32")
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
        now = time.time()
        stats.durations.append(now - tic)
        tic = now
        speed = cfg.batch_size * (step + 1 - skip) / max(now - epoch_tic, 1e-9)
        left = (steps - step - 1) + (loop.end_epoch - epoch - 1) * steps
        loop.progress.update(epoch + 1, step + 1, steps, speed, stats.loss / max(stats.steps, 1), lr,
                             left * cfg.batch_size / max(speed, 1e-9))
        loop.json_log.write("iter", epoch=epoch + 1, step=step, loss=loss, lr=lr,
                            ips=cfg.batch_size / stats.durations[-1], loss_scale=state.scaler.scale)
        if last and loop.stop.agreed and step + 1 < steps:  # stops only between optimizer steps
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
    state.report.add_epoch("val", epoch=epoch + 1, top1=metrics["top1"], top5=metrics["top5"], loss=metrics["loss"],
                           durations=metrics["durations"], batch_size=cfg.batch_size)
    state.report.add_per_class(metrics.get("confusion"), epoch + 1)  # the latest validation's, per class
    if dist.is_primary:
        log.info("Epoch[%d] validation top1 %.4f top5 %.4f loss %.4f (%d samples)", epoch + 1,
                 metrics["top1"], metrics["top5"], metrics["loss"], metrics["samples"])
    return {"val.top1": metrics["top1"], "val.top5": metrics["top5"], "val.loss": metrics["loss"],
            "val.samples": metrics["samples"]}


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


def fit(cfg, run, net, make_train_iter, val_iter, ctxs, dist, num_classes, finetune=FinetuneConfig()):
    """Train ``net`` (initialised, hybridized; ``num_classes`` outputs) as ``cfg`` (a FitConfig) says, ``run``
    describing the run, the backbone's LR as ``finetune`` says; returns (report, stopped_by_signal)."""
    prefix = workspace_path(cfg.workspace, cfg.model_prefix)
    state = prepare(cfg, run, net, ctxs, dist)
    resumed = resume_state(cfg.resume, prefix, log.warning if dist.is_primary else None)
    if resumed is not None:
        resume(state, resumed, run, net, ctxs, dist)
    if cfg.resume != "auto" and dist.is_primary:
        moved = settings.set_aside_superseded(cfg.workspace, cfg.model_prefix, resumed,
                                              [run.report_path, cfg.json_log] + ([cfg.mllog] if cfg.mllog else []))
        if moved:
            log.info("--resume %s: moved the files of the run not continued to %s", cfg.resume, moved)
    json_log = JsonLog(workspace_path(cfg.workspace, cfg.json_log) if dist.is_primary and cfg.json_log else None)
    json_log.write("params", **run.record, resumed_from=resumed and resumed["state_path"])
    end_epoch = cfg.num_epochs if cfg.run_epochs < 0 else min(cfg.num_epochs, state.epoch + cfg.run_epochs)
    loop = Loop(net=net, ctxs=ctxs, dist=dist, stop=StopFlag(dist), guard=StatsGuard(net),
                progress=Progress(dist.is_primary, cfg.disp_batches, num_epochs=cfg.num_epochs),
                json_log=json_log, end_epoch=end_epoch,
                num_classes=num_classes, loss_fn=make_loss(cfg))
    if state.target is not None:
        end_epoch = state.epoch  # reached in an earlier run: nothing left to do
        if dist.is_primary:
            log.info("The target top-1 %g was reached at epoch %d already; --resume none starts afresh",
                     state.target["top1"], state.target["epoch"])
    elif state.epoch >= end_epoch and dist.is_primary:
        log.info("All %d epochs are done already; --num-epochs N continues, --resume none starts afresh",
                 cfg.num_epochs)
    mllog = MLPerfLog(workspace_path(cfg.workspace, cfg.mllog) if cfg.mllog and dist.is_primary else None,
                      fresh=resumed is None)
    first_epoch = state.epoch
    if cfg.mllog and resumed is None and first_epoch < end_epoch:  # a resumed run continues the log
        mllog.run_begins(cfg, dist.size * len(ctxs), ctxs[0].device_type,
                         len(make_train_iter(first_epoch)) * cfg.batch_size)

    def save(epoch, step, partials=None, best=False):
        save_checkpoint(prefix, net, state, run, epoch, step, cfg.keep_last, cfg.seed, partials, best)

    stopped = reached = False
    evaluated = bool(state.report.metrics.get("val.top1"))
    for epoch in range(state.epoch, end_epoch):
        mllog.epoch_start(epoch + 1)
        if finetune.changes_lr:  # Gluon's trainers read lr_mult at every update
            set_backbone_lr_mult(net, backbone_lr_mult(epoch, finetune.backbone_lr_mult,
                                                       finetune.freeze_backbone_epochs))
        stats, steps, stopped_at = train_one_epoch(cfg, loop, state, make_train_iter(epoch), epoch,
                                                   skip=state.step if epoch == state.epoch else 0)
        state.train_seconds += sum(stats.durations)
        if stopped_at is not None:  # a stop signal: save this epoch's progress and end
            average_statistics(net, state.ema, dist)  # as at the epoch's end: each rank's averages differ
            partials = gather_partial(stats, dist, "partial")
            if dist.is_primary:
                save(epoch, stopped_at, partials)
            stopped = True
            break
        mllog.epoch_stop(epoch + 1)
        epoch_record = record_train_epoch(cfg, state, stats, epoch, dist)
        average_statistics(net, state.ema, dist)
        improved = False
        last = epoch + 1 == end_epoch
        if val_iter is not None and cfg.mode == "train_val" and evaluation_due(cfg, epoch, last):
            mllog.eval_start(epoch + 1)
            metrics = validate(net, state.ema, val_iter, ctxs, dist, cfg.dtype, cfg.no_metrics,
                               cfg.benchmark_iters)
            mllog.eval_result(epoch + 1, metrics["top1"], metrics["samples"], first=not evaluated)
            evaluated = True
            epoch_record.update(record_validation(cfg, state, metrics, epoch, dist))
            improved = metrics["top1"] > state.best_top1
            state.best_top1 = max(state.best_top1, metrics["top1"])
            reached = target_reached(cfg, state, metrics["top1"], epoch)
        json_log.write("epoch", epoch=epoch + 1, **epoch_record)
        due = cfg.save_frequency > 0 and (epoch + 1) % cfg.save_frequency == 0
        if dist.is_primary and (due or last or improved or reached):
            save(epoch + 1, 0, best=improved)
        if reached:
            break
        if loop.stop.agreed_now() and not last:
            if dist.is_primary and not (due or improved):
                save(epoch + 1, 0)
            stopped = True
            break
    if end_epoch > first_epoch and not stopped and (reached or end_epoch == cfg.num_epochs):  # training's end
        mllog.run_ends(reached, epoch + 1)
    mllog.close()
    state.report.total_duration = state.elapsed()
    if dist.is_primary:
        state.report.save(workspace_path(cfg.workspace, run.report_path))
        json_log.write("summary", total_duration=state.report.total_duration, stopped=stopped,
                       target=state.target)
    json_log.close()
    return state.report, stopped


