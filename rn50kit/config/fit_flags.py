"""The training loop's flags (the Training flags of train.py): FitConfig (their values), their argparse groups,
one small function per titled group, and check (their consistency)."""
import dataclasses
import importlib.util

from rn50kit.config import cli, lr_schedules, optimizer_registry, recipe
from rn50kit.config.recipe import DEFAULT_RECIPE


@dataclasses.dataclass(frozen=True)
class FitConfig:
    """The Training flags' values (their defaults are these; those a recipe sets are the default recipe's, nvidia's,
    written here so that nothing is read at import: test_settings checks them against its file; the LR and the
    epochs are filled in from the recipe and the batch by train_flags.fill_hyper_parameters)."""
    mode: str = "train_val"
    recipe: str = DEFAULT_RECIPE
    config: str = None  # --config FILE.toml: the file's values over the recipe's (config_files)
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
    lr_schedule: str = "cosine"
    lr_steps: tuple = ()
    lr_factor: float = 0.1
    lr_power: float = 2.0
    lr_end: float = 0.0
    warmup_epochs: float = 5.0
    optimizer: str = "sgd"
    mom: float = 0.875
    opt_betas: tuple = None  # the optimizer's own (optimizer_registry.Knobs)
    opt_eps: float = None
    lars_eta: float = 0.001
    lars_eps: float = 0.0
    wd: float = 1 / 32768
    wd_bn_bias: bool = False
    label_smoothing: float = 0.1
    mixup: float = 0.0
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
    untimed_iters: int = 20  # report.WARMUP_ITERATIONS (a literal: the flags do not import the reporting layer)
    no_metrics: bool = False
    workspace: str = None
    model_prefix: str = "model"
    save_frequency: int = 1
    keep_last: int = 3
    commit_every: int = 50  # an elastic run's in-memory commits (training/elastic.py), in optimizer steps
    elastic_batch: str = "keep"
    resume: str = "auto"
    load: str = None
    report: str = None
    json_log: str = "log.jsonl"
    eval_every: int = 1
    val_tta: str = "none"
    eval_offset: int = 0
    target_top1: float = None
    mllog: str = None
    tensorboard: str = None


def float_pair(text):
    """--opt-betas' type: two comma-separated numbers."""
    return [float(x) for x in text.split(",")]


def add_run_args(parser):
    group = parser.add_argument_group("Run", "--recipe gives the defaults marked recipe:; a flag given wins")
    group.add_argument("--mode", choices=["train_val", "train", "val", "pred"],
                       help="train_val: train and validate each epoch; train: no validation; val: score a "
                            "checkpoint --num-epochs times; pred: top-5 classes of --data-pred")
    group.add_argument("--recipe", type=recipe.recipe_argument, metavar="NAME|FILE.toml",
                       help="hyper-parameter preset: the defaults of the flags marked 'recipe:' (a config file's "
                            "value or a flag given on the command line wins): " +
                            ", ".join(recipe.shipped_names()) +
                            " (rn50kit/config/recipes/), or a recipe file of your own")
    group.add_argument("--config", metavar="FILE.toml",
                       help="settings from a TOML file: keys are the flags' long names, at the top level or in a "
                            "table named for their group; over the recipe, under the command line")
    group.add_argument("--seed", type=int,
                       help="random seed (python, numpy, MXNet and DALI; default: one drawn and recorded in the "
                            "workspace's config.toml, so a replay is the same run)")
    group.add_argument("--kv-store", choices=cli.KV_STORES,
                       help="horovod: one process per device; device/local: one process, all --gpus")
    group.add_argument("--gpus", help="device mode: GPU ids, e.g. 0,1,2,3 (default: all)")
    group.add_argument("--cpu-contexts", type=int,
                       help="device mode without GPUs: split each batch over this many CPU contexts, one data "
                            "pipeline each (the multi-GPU code path on a CPU; no faster than 1)")
    group.add_argument("--batch-size", type=int,
                       help="global batch size of one forward/backward pass (all workers; without a GPU the "
                            "default is 32); the optimizer's batch is this x --grad-accum-steps")
    group.add_argument("--grad-accum-steps", type=int,
                       help="gradient accumulation (timm's name): sum the gradients of K batches locally, allreduce "
                            "and update once, for an effective global batch of K x --batch-size; the LR, its "
                            "schedule and the recipe's LR follow the effective batch")
    group.add_argument("--num-epochs", type=int, help=f"epochs ({recipe.recipe_help('num_epochs')})")
    group.add_argument("--run-epochs", type=int, help="stop after this many epochs in this run")
    group.add_argument("--horovod-num-groups", type=int, help="grouped allreduce: number of groups")
    group.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to float16 for allreduce")
    group.add_argument("--memory-check", choices=["refuse", "warn", "off"],
                       help="before training, estimate the memory the batch needs per device (activations by "
                            "layer, batch, dtype) against the machine's: refuse (naming a batch that fits), warn, "
                            "or off")
    group.add_argument("--benchmark-iters", type=int, help="cap iterations per epoch (benchmarks)")
    group.add_argument("--untimed-iters", type=int,
                       help="the first N iterations of each epoch (graph building, caches) are left out of its "
                            "images/s and latencies; the report says after how many of them the step time was "
                            "steady (benchmark.py raises N when it was not)")
    group.add_argument("--no-metrics", action="store_true", help="skip accuracy computation (benchmarks)")
    group.add_argument("--eval-every", type=int,
                       help="train_val: validate every N epochs (and after the last one)")
    group.add_argument("--val-tta", choices=("none", "flip"),
                       help="test-time augmentation of validation, --mode val and --mode pred: flip scores each "
                            "image by the mean of its and its mirror image's softmax (twice the work)")
    group.add_argument("--eval-offset", type=int,
                       help="train_val: the first validation after epoch M+1 (mlperf: every 4 from epoch 3, "
                            "offset 2)")
    group.add_argument("--target-top1", type=float,
                       help="stop at the first validation whose top-1 reaches this (a fraction, e.g. 0.759); "
                            "the report says when")
    return group


def add_optimizer_args(parser):
    group = parser.add_argument_group("Optimizer")
    group.add_argument("--optimizer", choices=list(optimizer_registry.OPTIMIZERS),
                       help=f"{optimizer_registry.optimizer_help()} ({recipe.recipe_help('optimizer')})")
    group.add_argument("--opt-betas", type=float_pair, metavar="B1,B2",
                       help="the optimizer's betas, for those that have them (lamb: default 0.9,0.999)")
    group.add_argument("--opt-eps", type=float, metavar="EPS",
                       help="the optimizer's epsilon, for those that have one (lamb: default 1e-6; lars: "
                            "--lars-eps's)")
    group.add_argument("--lars-eta", type=float, help="lars: trust coefficient eta")
    group.add_argument("--lars-eps", type=float, help="lars: epsilon in the trust ratio's denominator")
    group.add_argument("--mom", type=float, help=f"momentum ({recipe.recipe_help('mom')})")
    group.add_argument("--wd", type=float, help=f"weight decay ({recipe.recipe_help('wd')})")
    group.add_argument("--wd-bn-bias", action="store_true",
                       help="also decay BatchNorm gamma/beta and biases (default: they get no weight decay)")
    return group


def add_lr_schedule_args(parser):
    group = parser.add_argument_group("LR schedule")
    group.add_argument("--lr", type=float,
                       help="absolute LR for the effective global batch (default: the recipe's LR per 256 x "
                            f"batch/256, or from its points; {recipe.recipe_lr_help()})")
    group.add_argument("--lr-schedule", choices=lr_schedules.SCHEDULES,
                       help=f"LR schedule ({recipe.recipe_help('lr_schedule')})")
    group.add_argument("--lr-steps", type=lambda s: [float(x) for x in s.split(",") if x],
                       help="step schedule: epochs at which the LR is multiplied by --lr-factor "
                            f"({recipe.recipe_help('lr_steps')})")
    group.add_argument("--lr-factor", type=float,
                       help=f"step schedule: decay factor ({recipe.recipe_help('lr_factor')})")
    group.add_argument("--lr-power", type=float, help="poly schedule: exponent")
    group.add_argument("--lr-end", type=float,
                       help="cosine/poly/linear: the LR at the end of --num-epochs (mlperf recipe: 1e-4)")
    group.add_argument("--warmup-epochs", type=float,
                       help=f"linear warmup from 0, in epochs ({recipe.recipe_help('warmup_epochs')})")
    return group


def add_regularization_args(parser):
    group = parser.add_argument_group("Regularization / targets")
    group.add_argument("--label-smoothing", type=float,
                       help=f"label smoothing factor ({recipe.recipe_help('label_smoothing')})")
    group.add_argument("--mixup", type=float,
                       help=f"mixup Beta(a, a) parameter; 0 = off ({recipe.recipe_help('mixup')})")
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
    return group


def add_precision_args(parser):
    group = parser.add_argument_group("Precision")
    group.add_argument("--dtype", choices=cli.DTYPES,
                       help="model precision (default: float16 with a GPU, float32 without; float16: fp32 master "
                            "weights and loss scaling; bfloat16: CPU; int8: scoring on the CPU, the checkpoint "
                            "quantized by oneDNN, see --calib-mode)")
    group.add_argument("--loss-scale",
                       help="'dynamic' or a fixed number (default: dynamic for float16, 1 otherwise)")
    group.add_argument("--max-bad-steps", type=int,
                       help="stop when this many consecutive steps have a NaN/inf loss or gradient")
    return group


def add_checkpoint_args(parser):
    group = parser.add_argument_group("Checkpoints")
    group.add_argument("--workspace",
                       help="directory for checkpoints, logs and the report (default: runs/<model>, e.g. "
                            "runs/resnet50_v1.5, in the current directory)")
    group.add_argument("--model-prefix", help="checkpoint file prefix, inside --workspace")
    group.add_argument("--save-frequency", type=int,
                       help="checkpoint every N epochs (0: only the last; the best is always kept)")
    group.add_argument("--keep-last", type=int,
                       help="keep the newest K epoch checkpoints (0: all) besides <prefix>-best.params; a step "
                            "checkpoint (after SIGTERM) is removed once a newer checkpoint exists")
    group.add_argument("--commit-every", type=int, metavar="STEPS",
                       help="elastic runs (runner --min-np/--max-np): keep the state in memory every N optimizer "
                            "steps and at each epoch's end; a lost worker costs the steps since (docs/multi-node.md)")
    group.add_argument("--elastic-batch", choices=["keep", "scale-lr"],
                       help="elastic runs: keep the global batch when workers come or go (each worker's batch and "
                            "the accumulation steps change), or keep each worker's and scale the LR with the "
                            "global batch")
    group.add_argument("--resume",
                       help="auto: continue from the latest complete checkpoint; none: start afresh (the earlier "
                            "run's files move to <workspace>/previous-<time>/); or a <prefix>-NNNN.params / "
                            ".state.json path (later checkpoints move aside the same way)")
    group.add_argument("--load",
                       help="val/pred: parameters to score (default: the latest checkpoint of --workspace); the "
                            "model, classes, image shape, resize and normalisation come from its saved state")
    return group


def add_output_args(parser):
    group = parser.add_argument_group("Outputs")
    group.add_argument("--disp-batches", type=int, help="log every N iterations")
    group.add_argument("--report",
                       help="JSON report (relative: inside --workspace; default report.json, and for --mode val "
                            "<checkpoint>.<dtype>.score.json beside the checkpoint scored, e.g. "
                            "model-0016.float32.score.json; int8: model-0016.int8-naive-10.score.json)")
    group.add_argument("--json-log",
                       help="JSON-lines log (relative: inside --workspace); empty to disable")
    group.add_argument("--mllog",
                       help="write an MLPerf-style :::MLLOG log here (relative: inside --workspace) through the "
                            "mlperf-logging package, for MLCommons' compliance checker")
    group.add_argument("--tensorboard", metavar="DIR",
                       help="write TensorBoard event files into DIR (relative: inside --workspace): training "
                            "loss, LR, images/s and loss scale per logged iteration, validation per epoch, the "
                            "settings as HParams; through the tensorboardX package")
    return group


def add_fit_args(parser):
    """The training flags, a titled group each (--help lists them so); returns the groups."""
    groups = [add(parser) for add in (add_run_args, add_optimizer_args, add_lr_schedule_args, add_regularization_args,
                                      add_precision_args, add_checkpoint_args, add_output_args)]
    parser.set_defaults(**cli.config_defaults(FitConfig))
    return groups


def check(cfg):
    """Raise ValueError for inconsistent hyper-parameters of a FitConfig."""
    if cfg.num_epochs <= 0:
        raise ValueError(f"--num-epochs must be positive, got {cfg.num_epochs}")
    if cfg.batch_size <= 0:  # before the LR a recipe derives from it
        raise ValueError(f"--batch-size must be positive, got {cfg.batch_size}")
    if cfg.lr is not None and not cfg.lr >= 0:  # NaN too
        raise ValueError(f"--lr must not be negative, got {cfg.lr:g}")
    if cfg.lr_schedule == "step":
        late = [s for s in cfg.lr_steps if s >= cfg.num_epochs]
        if late:
            raise ValueError(f"--lr-steps {late} lie at or beyond the last epoch ({cfg.num_epochs}); "
                             "give steps below --num-epochs")
    if cfg.grad_accum_steps < 1:
        raise ValueError(f"--grad-accum-steps must be at least 1, got {cfg.grad_accum_steps}")
    if cfg.commit_every < 1:
        raise ValueError(f"--commit-every must be at least 1, got {cfg.commit_every}")
    if cfg.eval_every < 1 or cfg.eval_offset < 0:
        raise ValueError(f"--eval-every must be at least 1 and --eval-offset at least 0, got {cfg.eval_every} "
                         f"and {cfg.eval_offset}")
    if cfg.target_top1 is not None and not 0 < cfg.target_top1 <= 1:
        raise ValueError(f"--target-top1 is a fraction in (0, 1] (e.g. 0.759 for 75.9 %), got {cfg.target_top1}")
    if cfg.mllog and importlib.util.find_spec("mlperf_logging") is None:
        raise ValueError("--mllog writes through the mlperf-logging package, not installed for this Python: "
                         "`make setup` installs it (or pip install mlperf-logging==4.1.68)")
    if cfg.tensorboard and importlib.util.find_spec("tensorboardX") is None:
        raise ValueError("--tensorboard writes through the tensorboardX package, not installed for this Python: "
                         "`make setup` installs it (or pip install tensorboardX==2.6.5)")
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
    problem = optimizer_registry.knob_problem(cfg.optimizer, optimizer_registry.knobs_of(cfg))
    if problem:
        raise ValueError(problem)
