"""Train or score a ResNet on ImageNet-style RecordIO with MXNet Gluon, Horovod and DALI.

Usually started by `runner`, once per worker under horovodrun; it also runs alone as one worker.
"""
import argparse
import copy
import dataclasses
import logging
import os
import random
import signal
import sys

# Started as a worker: a stop request (SIGTERM, SIGUSR1) while the modules below load is kept, not fatal. Training
# honours it at its first step (hold_workspace); the other modes put the default back and die of it.
EARLY_STOPS = []
if __name__ == "__main__":
    for _sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(_sig, lambda signum, frame: EARLY_STOPS.append(signum))
if "int8" in sys.argv[1:]:
    # quantize.INT8_ENV: MXNet reads its oneDNN fusion switches once, as it loads, so they are set before the import.
    os.environ.setdefault("MXNET_DISABLE_MKLDNN_FUSE_CONV_SUM", "1")

try:
    import mxnet  # noqa: F401  (every module below needs it)
except ImportError:
    sys.exit("train.py: error: MXNet is not installed for this Python; run `make setup`, then use "
             ".venv/bin/python (or `source .venv/bin/activate`)")

import checkpoint
import cli
from cli import OneLineParser, UsageError
import data
import faults
import fit
from helptext import HelpFormatter
import models
import predict
import quantize
import run_lock
import schedules
import settings
import watchdog
import world


def get_args_parser(recipe=schedules.DEFAULT_RECIPE):
    """train.py's flags, with ``recipe``'s hyper-parameters as their defaults."""
    parser = OneLineParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    models.add_model_args(parser)
    fit.add_fit_args(parser)
    data.add_data_args(parser)
    data.add_dali_args(parser)
    data.add_data_aug_args(parser)
    quantize.add_quantize_args(parser)
    predict.add_pred_args(parser)
    watchdog.add_watchdog_args(parser)  # faults: --stall-timeout
    parser.set_defaults(**schedules.recipe_defaults(recipe))
    return parser


def chosen_recipe(argv):
    """--recipe's value in ``argv`` (the default recipe without one); a bad name is left to the full parser."""
    probe = argparse.ArgumentParser(add_help=False)
    probe.add_argument("--recipe", default=schedules.DEFAULT_RECIPE)
    recipe = probe.parse_known_args(argv)[0].recipe
    return recipe if recipe in schedules.RECIPES else schedules.DEFAULT_RECIPE


def parse_args(argv=None, prog=None):
    """The command line over --recipe's defaults over the parser's own (timm's order for its config files)."""
    argv = sys.argv[1:] if argv is None else [str(arg) for arg in argv]
    parser = get_args_parser(chosen_recipe(argv))
    if prog:
        parser.prog = prog
    return parser.parse_args(argv)


def setup_logging(rank):
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)


def fill_hyper_parameters(args):
    """The defaults that depend on other flags: the recipe's epochs for training, and its LR per 256 images
    scaled to the global batch. Then every hyper-parameter is checked."""
    if args.num_epochs is None:
        args.num_epochs = schedules.recipe_epochs(args.recipe)
    if args.lr is None:
        args.lr = schedules.recipe_lr(args.recipe, args.batch_size)
    try:
        fit.check_args(args)
        if args.mode == "pred":
            predict.check_pred_args(args.data_pred)
    except ValueError as error:
        raise UsageError(str(error))


def check_flags(argv):
    """Parse ``argv`` as train.py would and exit 2 with one line on an unknown or bad flag (runner calls this
    before starting any worker)."""
    args = parse_args(argv, prog="train.py")
    if args.load and os.path.isfile(args.load):  # faults: a damaged --load file, refused before the workers start
        try:
            checkpoint.check_loadable(args.load)
        except checkpoint.CheckpointError as error:
            cli.fail("train.py", str(error))


def json_values(namespace):
    """The values of ``namespace`` a JSON state file keeps (None and objects left out)."""
    return {k: v for k, v in vars(namespace).items() if isinstance(v, (int, float, str, list))}


def run_info(args, typed, given, command):
    """fit.RunInfo: what this run derived, apart from what the user typed. ``typed``: the arguments as parsed,
    before the kit filled in the defaults that depend on the machine, the data, the recipe or a checkpoint."""
    model_name = models.model_name_from_args(args)
    report_path = args.report or ("score.json" if args.mode == "val" else "report.json")
    resolved = json_values(args)
    derived = {k: v for k, v in resolved.items() if typed.get(k) != v}
    derived.update(model_name=model_name, report=report_path)
    record = {"args": resolved, "given": sorted(given), "derived": derived}
    return fit.RunInfo(model_name=model_name, command=list(command), report_path=report_path, record=record)


@dataclasses.dataclass
class Outcome:
    """What main() leaves behind: the network (trained or scored), and the report, the prediction or the data
    pipeline's rate, by mode."""
    net: object = None
    report: object = None
    stopped: bool = False
    prediction: list = None
    io: dict = None


def attach_console(rank):
    """Rank 0 under runner on a terminal: write straight to it (RN50_CONSOLE names it), so the progress bar is
    live and lines carry no launcher prefix; horovodrun would pipe and prefix every line."""
    console = os.environ.get("RN50_CONSOLE")
    if rank != 0 or not console:
        return
    try:
        fd = os.open(console, os.O_WRONLY | os.O_NOCTTY)
    except OSError:
        return  # another machine, or gone: the launcher's pipes still carry the output
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout.reconfigure(line_buffering=True)


def header(args, size, report_path):
    """One line on what runs and where its results go (every argument is in the JSON log)."""
    model = f"{models.model_name_from_args(args)} ({args.num_classes} classes, " \
            f"{'x'.join(str(v) for v in args.image_shape)})"
    machine = f"{size} worker(s), batch {args.batch_size}, {args.dtype}, {args.data_backend}"
    if args.mode == "val":
        return (f"Scoring {args.load or 'freshly initialised weights'}: {model}, resize {args.data_val_resize}, "
                f"{machine}; data {args.data_val or 'synthetic'}; "
                f"results in {fit.workspace_path(args.workspace, report_path)}")
    data_files = "synthetic" if args.data_backend == "synthetic" else \
        ", ".join(f for f in (args.data_train, args.data_val) if f)
    return (f"Training {model} on {machine}; recipe {args.recipe}, LR {args.lr:g}, {args.num_epochs} epochs; "
            f"data {data_files}; results in {os.path.join(args.workspace, '')}")


def warn_about(args, primary):
    """Refuse labels beyond --num-classes (every rank); rank 0 warns once about likely mistakes that still run."""
    error, warning = settings.class_count_problem(args) if args.mode != "pred" else (None, None)
    if error:
        raise UsageError(error)
    if not primary:
        return
    if warning:
        logging.warning(warning)
    if args.mode in ("train", "train_val") and args.warmup_epochs and args.warmup_epochs >= args.num_epochs:
        logging.warning("--warmup-epochs %g is not shorter than --num-epochs %d: the LR never reaches its peak "
                        "(%g); lower --warmup-epochs", args.warmup_epochs, args.num_epochs, args.lr)


def validate_args(args, num_workers):
    """``num_workers``: the devices the global batch is split over, in all processes."""
    if args.cpu_contexts < 1 or (args.cpu_contexts > 1 and args.kv_store == "horovod"):
        raise UsageError(f"--cpu-contexts {args.cpu_contexts}: give a positive number, and use it with --kv-store "
                         "device or local (with horovod each process has one device)")
    if args.batch_size <= 0:
        raise UsageError(f"--batch-size must be positive, got {args.batch_size}")
    if args.batch_size % num_workers:
        raise UsageError(f"--batch-size {args.batch_size} (global) does not divide across {num_workers} workers")
    if len(args.image_shape) != 3 or args.image_shape[0] not in (3, 4):
        raise UsageError(f"--image-shape must be C,H,W with C 3 or 4, got {args.image_shape}")
    if args.mode == "pred":
        return
    if args.data_backend != "synthetic":
        missing = data.check_data_files(args)
        if missing:
            raise UsageError(missing)
        if not args.data_train and not args.data_val:
            raise UsageError(f"no data given (--data-train/--data-val); {cli.PREPARE_HINT}")


def contexts(args, local_rank, local_size):
    import mxnet as mx
    num_gpus = mx.context.num_gpus()
    if args.kv_store == "horovod":
        return [mx.gpu(gpu_ordinal(local_rank, local_size, num_gpus)) if num_gpus > 0 else mx.cpu()]
    if num_gpus == 0:
        return [mx.cpu(i) for i in range(args.cpu_contexts)]
    ids = [int(i) for i in args.gpus.split(",")] if args.gpus else list(range(num_gpus))
    return [mx.gpu(i) for i in ids]


def gpu_ordinal(local_rank, local_size, visible_gpus):
    """The GPU of this Horovod rank among the ``visible_gpus`` it sees: its local rank when the node's GPUs are
    all visible (horovodrun, mpirun), the only one when it sees one (per-rank CUDA_VISIBLE_DEVICES, srun
    --gpus-per-task=1)."""
    if visible_gpus >= local_size:
        return local_rank
    if visible_gpus == 1:
        return 0
    raise UsageError(f"this rank (local rank {local_rank} of {local_size}) sees {visible_gpus} GPUs: either make "
                     f"every GPU of the node visible to every rank, or give each rank one (CUDA_VISIBLE_DEVICES, "
                     "srun --gpus-per-task=1)")


def check_fusions(args, ctxs):
    """Fused operators only where upstream MXNet has a kernel for them."""
    if args.fuse_bn_relu and any(ctx.device_type == "gpu" for ctx in ctxs):
        raise UsageError("--fuse-bn-relu 1 runs on CPUs only: MXNet's BatchNormWithReLU has a oneDNN kernel and "
                         "no GPU one; leave it out on GPUs")


def train_iterator_factory(args, dist, ctxs, first):
    """Training iterator per epoch. With --seed each epoch gets a fresh reader seeded by (seed, epoch), so a
    run resumed at any epoch sees exactly the batches an uninterrupted run would."""
    if args.seed is None:
        return lambda epoch: first

    def make(epoch):
        if epoch == 0:
            return first  # built with args.seed, the seed epoch 0 gets
        epoch_args = copy.copy(args)
        epoch_args.seed = args.seed + 100003 * epoch
        epoch_args.data_val = None  # only the training pipeline is rebuilt
        return data.get_data_iterators_per_device(epoch_args, dist.rank, dist.size, dist.local_rank,
                                                  dist.local_size, ctxs)[0]
    return make


def hold_workspace(args, dist):
    """Training writes into --workspace: rank 0 (the writer) locks it for this run, so a second run there is
    refused at once. Every rank learns the answer, so none is left waiting in a collective."""
    if args.mode not in ("train", "train_val"):
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, signal.SIG_DFL)
        if EARLY_STOPS:
            os.kill(os.getpid(), EARLY_STOPS[0])
        return None
    lock, busy = run_lock.WorkspaceLock(args.workspace), ""
    if dist.is_primary:
        try:
            if not lock.acquire():
                logging.warning("The file system of %s has no locks: nothing stops a second run from writing "
                                "into this workspace", args.workspace)
        except run_lock.WorkspaceBusy as error:
            busy = str(error)
    if dist.sum([1.0 if busy else 0.0], "workspace.lock")[0]:
        if not dist.is_primary:
            sys.exit(2)  # rank 0 says why
        raise UsageError(busy)
    fit.catch_stop_signals(EARLY_STOPS)  # from here on a SIGTERM/SIGUSR1 means: save at the next step boundary
    return lock


def predict_image(args, net, ctxs, dist):
    """--mode pred: the top-5 classes of --data-pred by the checkpoint (as INT8 with --dtype int8)."""
    if args.dtype == "int8":
        net = int8_net(args, net, ctxs, dist)
    fit.load_for_scoring(fit.fit_config(args), net, ctxs, dist)
    image = predict.load_image(args.data_pred, args.image_shape, args.data_val_resize, args.rgb_mean, args.rgb_std,
                               args.input_layout)
    return predict.predict(net, image, ctxs[0], args.dtype, predict.class_names(args.class_names, args.data_train))


def int8_net(args, net, ctxs, dist, train_iter=None):
    """--dtype int8: the float32 checkpoint (loaded here) as oneDNN's calibrated INT8 graph (quantize.py)."""
    path = fit.load_for_scoring(fit.fit_config(args), net, ctxs, dist)
    batch = args.batch_size // dist.size
    channels, height, width = args.image_shape
    shape = (batch, channels, height, width) if args.input_layout == "NCHW" else (batch, height, width, channels)

    def calibration_batches():
        if train_iter is not None:
            return train_iter
        if args.data_backend != "synthetic" and not args.data_train:
            raise UsageError("--dtype int8 calibrates on training records: give --data-train (or run once with it: "
                             "the INT8 graph is kept beside the checkpoint)")
        return data.get_data_iterators(args, dist.rank, dist.size, dist.local_rank, dist.local_size, ctxs[0])[0]
    source = quantize.calibration_source(args.data_backend, args.data_train)
    calibration = quantize.describe_calibration(args.calib_mode, args.calib_batches, batch, source)
    qnet, calibration = quantize.int8_net(net, path, shape, calibration, calibration_batches, dist.is_primary,
                                          barrier=lambda: dist.sum([0.0], "int8.saved"))
    calibration["cpu_vnni"] = quantize.vnni()  # without VNNI oneDNN's INT8 kernels are about half as fast
    qnet.loaded_from, qnet.report_info = path, {"int8": calibration}
    if dist.is_primary:
        logging.info(quantize.summary(calibration))
    return qnet


def fused_float32_net(args, net, ctxs, dist):
    """float32 scoring on one CPU worker: the loaded checkpoint through oneDNN's conv+BN+ReLU(+add) fusion
    (models.optimize_for_inference); ``net`` itself elsewhere (several workers: Horovod's broadcast cannot read the
    weights oneDNN has reordered)."""
    if dist.size > 1 or len(ctxs) > 1 or ctxs[0].device_type != "cpu":
        return net
    path = fit.load_for_scoring(fit.fit_config(args), net, ctxs, dist)
    channels, height, width = args.image_shape
    shape = (args.batch_size, channels, height, width) if args.input_layout == "NCHW" else \
        (args.batch_size, height, width, channels)
    fused = models.optimize_for_inference(net, shape, ctxs[0])
    fused.loaded_from = path
    return fused


def main(args, command=None, given=()):
    """Run ``args`` (from parse_args); ``command``: the command line, for the records; ``given``: the
    destinations of the flags typed (settings.given_flags). Returns an Outcome."""
    import mxnet as mx

    command = list(command or [sys.argv[0]])
    given = set(given)
    typed = json_values(args)

    hvd = None
    if args.kv_store == "horovod":
        import horovod.mxnet as hvd
        hvd.init()  # one process per worker; works alone too (size 1)
        world.check_joined(hvd.size(), hvd.rank(), hvd.local_rank(), hvd.mpi_built())  # the launcher's world?
    dist = fit.Distributed(hvd)
    if __name__ == "__main__":  # faults: a worker's record for runner, and a watchdog on a stalled run
        faults.install(dist.rank)
        watchdog.start(args.stall_timeout, dist.rank)
    attach_console(dist.rank)
    setup_logging(dist.rank)
    try:
        settings.complete(args, given, mx.context.num_gpus())
    except ValueError as error:
        raise UsageError(str(error))
    if args.dtype == "bfloat16" and settings.bfloat16_unsupported():
        raise UsageError(settings.bfloat16_unsupported())
    fill_hyper_parameters(args)
    ctxs = contexts(args, dist.local_rank, dist.local_size)
    validate_args(args, dist.size * len(ctxs))
    check_fusions(args, ctxs)
    if args.dtype == "int8":
        why = quantize.int8_unavailable(args.mode, ctxs, args.conv_layout, args.calib_batches)
        if why:
            raise UsageError(why)
    run = run_info(args, typed, given, command)
    if args.mode in ("train", "train_val"):
        os.makedirs(args.workspace, exist_ok=True)
        # --model-prefix may name a folder inside the workspace: make it now, not at the first checkpoint
        os.makedirs(os.path.dirname(fit.workspace_path(args.workspace, args.model_prefix)) or ".", exist_ok=True)
    if args.mode != "pred":
        report_file = os.path.abspath(fit.workspace_path(args.workspace, run.report_path))
        os.makedirs(os.path.dirname(report_file), exist_ok=True)
    lock = hold_workspace(args, dist)
    if args.seed is not None:
        random.seed(args.seed)
        mx.random.seed(args.seed)
        import numpy as np
        np.random.seed(args.seed)
    warn_about(args, dist.is_primary)
    if dist.is_primary:
        if args.mode != "pred":
            logging.info("%s", header(args, dist.size, run.report_path))

    if args.dtype == "bfloat16":
        # Operators run in bfloat16 on oneDNN through MXNet's AMP (parameters stay float32). AMP patches
        # MXNet's operators, so it must come before the network is built.
        from mxnet.contrib import amp
        amp.init(target_dtype="bfloat16")
    try:
        net = models.get_model_from_args(args)
    except ValueError as error:  # flags that do not fit together
        raise UsageError(str(error))
    net.initialize(mx.init.Xavier(), ctx=ctxs)  # layers with their own initializer keep it
    net.hybridize(static_alloc=True, static_shape=True)
    channels, height, width = args.image_shape
    shape = (1, channels, height, width) if args.input_layout == "NCHW" else (1, height, width, channels)
    # Finish deferred shapes (so checkpoints load into every parameter) by shape inference, not a forward
    # pass: an inference-mode forward lets oneDNN reorder the weights into its own layout, which Horovod's
    # broadcast and allreduce cannot read on CPU.
    net.infer_shape(mx.nd.zeros(shape, ctx=ctxs[0], dtype=data.out_dtype(args.dtype)))
    for param in net.collect_params().values():
        param._finish_deferred_init()
    stopped = False
    try:
        if args.mode == "pred":
            return Outcome(net=net, prediction=predict_image(args, net, ctxs, dist))
        train_iter, val_iter = data.get_data_iterators_per_device(args, dist.rank, dist.size, dist.local_rank,
                                                                  dist.local_size, ctxs)
        if args.test_io:  # time the data pipeline alone
            return Outcome(net=net, io=data.test_io(args, train_iter, val_iter, dist))
        if args.mode == "val":
            if args.dtype == "int8":
                net = int8_net(args, net, ctxs, dist, train_iter)
            elif args.dtype == "float32":  # the fastest correct graph for the dtype
                net = fused_float32_net(args, net, ctxs, dist)
            report = fit.score(fit.fit_config(args), run, net, val_iter, ctxs, dist)
        else:
            if train_iter is None:
                raise UsageError(f"--mode {args.mode} needs training data (--data-train)")
            make_train_iter = train_iterator_factory(args, dist, ctxs, train_iter)
            report, stopped = fit.fit(fit.fit_config(args), run, net, make_train_iter, val_iter, ctxs, dist)
            if stopped and dist.is_primary:
                print("Stopped by signal after saving a checkpoint; rerun the same command to resume")
    except (fit.TrainingError, data.DataError, predict.PredictionError, checkpoint.CheckpointError) as error:
        raise UsageError(str(error))
    dist.finish()
    if lock is not None and dist.is_primary:  # every rank has finished cleanly: tell runner how
        lock.finish("stopped" if stopped else "done")
    if dist.is_primary:
        top1 = report.metrics.get("val.top1")
        if top1:
            print(f"Validation top-1: {top1[-1]:.4f}")
        print(f"Report: {os.path.abspath(fit.workspace_path(args.workspace, run.report_path))}")
    return Outcome(net=net, report=report, stopped=stopped)


def run(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    given = settings.given_flags(get_args_parser(), argv)  # flags typed, whatever their value
    try:
        main(args, [sys.argv[0]] + argv, given)
    except UsageError as error:
        faults.fail("train.py", str(error))  # faults: cli.fail's line, recorded for runner


if __name__ == "__main__":
    run()
