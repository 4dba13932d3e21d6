"""Train or score a ResNet on ImageNet-style RecordIO with MXNet Gluon, Horovod and DALI.

Usually started by `runner`, once per worker under horovodrun; it also runs alone as one worker.
"""
import argparse
import dataclasses
import faulthandler
import json
import logging
import math
import os
import random
import signal
import sys

# Started as a worker: a stop request (SIGTERM, SIGUSR1) while the modules below load is kept, not fatal. Training
# honours it at its first step (hold_workspace); the other modes put the default back and die of it.
# A Ctrl-C (SIGINT) before training can save (start-up, scoring, prediction) ends the process at once with one
# line and status 130; once training holds its workspace it saves at the next step, as SIGTERM does.
EARLY_STOPS = []


def interrupted_at_once(signum=None, frame=None):
    sys.stdout.flush()
    print("train.py: interrupted (Ctrl-C); nothing was saved since the last checkpoint", file=sys.stderr, flush=True)
    os._exit(130)


if __name__ == "__main__":
    from rn50kit.common import supported
    supported.require_supported_python("train.py")  # before anything a Python it refuses could fail on
    # A crash in native code (MXNet, Horovod, DALI) prints every thread's Python stack and ends the process by its
    # signal, before MXNet loads: MXNet sets its own SIGSEGV handler only where none is, and that handler's exit()
    # can wait forever on an engine lock the crash left held (a worker hung instead of ended).
    faulthandler.enable()
    for _sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(_sig, lambda signum, frame: EARLY_STOPS.append(signum))
    signal.signal(signal.SIGINT, interrupted_at_once)
if "int8" in sys.argv[1:]:
    # quantize.INT8_ENV: MXNet reads its oneDNN fusion switches once, as it loads, so they are set before the import.
    os.environ.setdefault("MXNET_DISABLE_MKLDNN_FUSE_CONV_SUM", "1")
if "OMP_NUM_THREADS" not in os.environ and __name__ == "__main__":
    from rn50kit.launch import devices
    from rn50kit.launch import world
    if world.launched_world(os.environ) is None and not devices.nvidia_gpu_present():
        # Started alone on a CPU machine: without OMP_NUM_THREADS MXNet 1.9 takes half of the logical CPUs on x86,
        # assuming two hyper-threads a core (src/engine/openmp.cc): one core in two idle where there are none.
        # Under runner each worker gets its share; other launchers' workers keep MXNet's choice.
        os.environ["OMP_NUM_THREADS"] = str(devices.openmp_threads())


class _WithoutScikitLearn:
    """MXNet 1.9.1's legacy mxnet.model imports scikit-learn where it is installed (the kit's demo data needs it)
    for a base class the kit never uses; with scipy.stats and pandas behind it, a third of a second of every
    worker's start. Hidden while MXNet loads; MXNet handles its absence."""
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] == "sklearn":
            raise ImportError(f"{name}: not needed by MXNet here")
        return None


sys.meta_path.insert(0, _WithoutScikitLearn)
try:
    import mxnet  # noqa: F401  (every module below needs it)
except ImportError:
    sys.exit("train.py: error: MXNet is not installed for this Python; run `make setup`, then use "
             ".venv/bin/python (or `source .venv/bin/activate`)")
finally:
    sys.meta_path.remove(_WithoutScikitLearn)
if __name__ == "__main__" and supported.mxnet_problem(mxnet.__version__):  # supported: imported above, as a script
    sys.exit(f"train.py: error: {supported.mxnet_problem(mxnet.__version__)}")

from rn50kit.common import backends
from rn50kit.training import checkpoint
from rn50kit.common import cli
from rn50kit.common import config_files
from rn50kit.common.cli import OneLineParser, UsageError
from rn50kit.config import train_config
from rn50kit.data import identity, loaders
from rn50kit.launch import devices
from rn50kit.training.distributed import Distributed
from rn50kit.reliability import faults
import fit
from rn50kit.training import fit_flags, state, stop_signals
from rn50kit.common.helptext import HelpFormatter
from rn50kit.launch import memory
from rn50kit.training import prelaunch
import models
from rn50kit.scoring import predict
from rn50kit.weights import pretrained
from rn50kit.scoring import quantize
from rn50kit.common import rules
from rn50kit.reliability import run_lock
from rn50kit.reporting import resolved_config
from rn50kit.common import schedules
from rn50kit.scoring import scoring
from rn50kit.config import settings
from rn50kit.reliability import watchdog
from rn50kit.launch import world


def get_args_parser(recipe=schedules.DEFAULT_RECIPE, file_settings=None):
    """train.py's flags, with ``recipe``'s hyper-parameters as their defaults and a config file's ``file_settings``
    (config_files.Settings) over them; the command line wins over both."""
    parser = OneLineParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    models.add_model_args(parser)
    fit_flags.add_fit_args(parser)
    pretrained.add_pretrained_args(parser)
    loaders.add_data_args(parser)
    loaders.add_dali_args(parser)
    loaders.add_data_aug_args(parser)
    quantize.add_quantize_args(parser)
    predict.add_pred_args(parser)
    watchdog.add_watchdog_args(parser)  # faults: --stall-timeout
    parser.set_defaults(**recipe_values(parser, recipe))
    if file_settings is not None:
        parser.set_defaults(**{**file_values(parser, file_settings), "recipe": recipe})
    return parser


def recipe_values(parser, recipe):
    """The flag defaults ``recipe`` sets, each checked as its flag would be (a user's recipe file may be wrong)."""
    recipe_settings = config_files.read(schedules.recipe_file(recipe), "--recipe")
    values = config_files.check_against(recipe_settings, parser, ignore=(),
                                        allowed=("lr_per_256", "lr_points"))
    return {key: value for key, value in values.items() if key not in schedules.DERIVED_FIELDS}


def config_tables():
    """The tables a config file may use besides the argument groups: a run's configs (a resolved config.toml's)."""
    return {name: {field.name for field in dataclasses.fields(cls)} for name, cls in train_config.CONFIGS.items()}


def file_values(parser, file_settings):
    """A config file's values, checked and converted as the flags' (runner's own keys left to runner)."""
    return config_files.check_against(file_settings, parser, config_tables(), allowed=("recipe",))


def read_settings(argv):
    """The Settings of --config's file in ``argv``, or None (a ConfigError for a bad file)."""
    probe = argparse.ArgumentParser(add_help=False)
    probe.add_argument("--config")
    path = probe.parse_known_args(argv)[0].config
    return None if path is None else config_files.read(os.path.abspath(path))


def chosen_recipe(argv, file_settings=None):
    """--recipe's value in ``argv``, else the config file's (a path relative to the file's folder), else the
    default recipe; a bad name on the command line is left to the full parser."""
    probe = argparse.ArgumentParser(add_help=False)
    probe.add_argument("--recipe")
    recipe = probe.parse_known_args(argv)[0].recipe
    if recipe is not None:
        try:
            return schedules.recipe_argument(recipe)
        except argparse.ArgumentTypeError:
            return schedules.DEFAULT_RECIPE
    if file_settings is None or "recipe" not in file_settings.values:
        return schedules.DEFAULT_RECIPE
    named = file_settings.values["recipe"]
    if isinstance(named, str) and schedules.is_recipe_file(named):
        named = os.path.join(os.path.dirname(file_settings.path), named)
    try:
        return schedules.recipe_argument(str(named))
    except argparse.ArgumentTypeError as error:
        raise config_files.ConfigError(f"{file_settings.where('recipe')}: {error}")


def parse_args(argv=None, prog=None):
    """The command line over --config's file over --recipe's defaults over the parser's own (timm's order for
    its config files); a bad file or recipe is one error line."""
    argv = sys.argv[1:] if argv is None else [str(arg) for arg in argv]
    try:
        file_settings = read_settings(argv)
        parser = get_args_parser(chosen_recipe(argv, file_settings), file_settings)
    except config_files.ConfigError as error:
        cli.fail(prog or "train.py", str(error))
    if prog:
        parser.prog = prog
    args = parser.parse_args(argv)
    if args.config:
        args.config = os.path.abspath(args.config)
    return args


def given_flags(argv):
    """The destinations set by the user: the flags typed in ``argv`` and the keys of its --config file."""
    parser, file_settings = get_args_parser(), read_settings(argv)
    from_file = set() if file_settings is None else set(file_values(parser, file_settings))
    return settings.given_flags(parser, argv) | from_file


def setup_logging(rank):
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)


def fill_hyper_parameters(args, given=()):
    """The defaults that depend on other flags: the recipe's epochs for training, its LR for the effective global
    batch (--batch-size x --grad-accum-steps), and its LR steps scaled to the run's length (unless typed). Returns
    notes for the log on how the LR was found and what was scaled."""
    notes = []
    if args.num_epochs is None:
        args.num_epochs = schedules.recipe_epochs(args.recipe)
    if args.lr is None:
        args.lr, how = schedules.recipe_lr_source(args.recipe, args.batch_size * max(args.grad_accum_steps, 1))
        notes.append(how)
    recipe_steps = schedules.recipe(args.recipe)["lr_steps"]
    if (args.mode in ("train", "train_val") and args.lr_schedule == "step" and "lr_steps" not in given
            and recipe_steps and list(args.lr_steps) == list(recipe_steps)
            and args.num_epochs != schedules.recipe_epochs(args.recipe)):
        args.lr_steps = schedules.steps_for_length(args.recipe, args.num_epochs)
        notes.append(f"--lr-steps {','.join(f'{s:g}' for s in args.lr_steps)}: recipe {args.recipe}'s steps "
                     f"{','.join(f'{s:g}' for s in recipe_steps)} of {schedules.recipe_epochs(args.recipe)} epochs, "
                     f"scaled to this run's {args.num_epochs} (give --lr-steps to choose them)")
    return [note for note in notes if note]
    return None


def check_config(cfg):
    """Every hyper-parameter of a RunConfig, checked (a UsageError names the flag)."""
    try:
        fit_flags.check(cfg.fit)
        pretrained.check_pretrained_args(cfg.finetune)
        if cfg.fit.mode == "pred":
            predict.check_pred_args(cfg.predict.data_pred, cfg.predict.pred_out, cfg.predict.pred_top_k)
    except ValueError as error:
        raise UsageError(str(error))


def check_flags(argv, launch=None):
    """Parse ``argv`` as train.py would and exit 2 with one line on an unknown or bad flag or hyper-parameter
    (runner calls this before starting any worker, and in a dry run). With ``launch`` (runner's description of
    the run: launcher.launch_description) also what check_before_start can know before any worker starts, then
    print the run's checkpoint prefix as JSON for runner's advice on a failure."""
    args = parse_args(argv, prog="train.py")
    if args.load and os.path.isfile(args.load):  # faults: a damaged --load file, refused before the workers start
        try:
            checkpoint.check_loadable(args.load)
        except checkpoint.CheckpointError as error:
            cli.fail("train.py", str(error))
    if args.mode in ("val", "pred") and args.num_epochs is None:
        args.num_epochs = 1
    typed = settings.given_flags(get_args_parser(), argv)
    try:
        if launch is None:
            fill_hyper_parameters(args, given_flags(argv))
            check_config(train_config.from_args(args))
            return
        cfg = configure(args, given_flags(argv), launch["gpus"])
        contexts = cfg.fit.cpu_contexts if cfg.fit.kv_store != "horovod" and not launch["gpus"] else 1
        check_before_start(cfg, launch["workers"] * contexts, launch["workers_here"], launch["memory"], True)
    except UsageError as error:
        cli.fail("train.py", config_files.blame(str(error), read_settings(argv), typed))
    print(json.dumps({"checkpoint_prefix": prelaunch.checkpoint_prefix(cfg)}))


def check_before_start(cfg, devices, processes_here, memory_too, launching):
    """What can be known before any worker starts, a UsageError of one line: the flags against the ``devices``
    the global batch splits over (validate_args), the data's labels, the workspace, the checkpoint --resume
    continues (prelaunch.py) and, with ``memory_too`` (a CPU run; each worker estimates its GPU's), the memory of
    the batch for ``processes_here`` workers on this machine. runner runs it (check_flags, ``launching``) before
    launching and in a dry run; every worker's start runs it too, but for the memory (check_memory's collective
    has it) and the checkpoint (fit.resume, after the workspace lock)."""
    validate_args(cfg, devices)
    problem = prelaunch.problem(cfg, resume=launching)
    if problem:
        raise UsageError(problem)
    if memory_too and prelaunch.trains(cfg) and cfg.fit.memory_check == "refuse":
        import mxnet as mx
        contexts = 1 if cfg.fit.kv_store == "horovod" else cfg.fit.cpu_contexts
        net = build_network(cfg, [mx.cpu()], amp_graph=False)
        budget, where = cpu_memory_budget(processes_here, contexts)
        problem, _ = memory.check(net, scoring.input_shape(cfg.data.image_shape, cfg.data.input_layout, 1),
                                  cfg.fit.dtype, cfg.fit.batch_size, devices, processes_here, budget, where)
        if problem:
            raise UsageError(problem)


def cpu_memory_budget(processes_here, contexts):
    """(bytes per device, where) of a CPU run: this machine's available memory over its ``processes_here``
    workers, each computing on ``contexts`` CPU contexts."""
    budget = memory.cpu_budget(processes_here)
    where = "this machine" + (f" per worker ({processes_here} here)" if processes_here > 1 else "")
    return budget and budget // contexts, where


def json_values(namespace):
    """The values of ``namespace`` a JSON state file keeps (None and objects left out)."""
    return {k: v for k, v in vars(namespace).items() if isinstance(v, (int, float, str, list))}


def run_info(cfg, resolved, typed, given, command):
    """state.RunInfo: what this run derived, apart from what the user typed. ``resolved``: json_values of the
    completed arguments; ``typed``: of the arguments as parsed, before the kit filled in the defaults that depend
    on the machine, the data, the recipe or a checkpoint."""
    model_name = cfg.model.name
    report_path = cfg.fit.report or ("score.json" if cfg.fit.mode == "val" else "report.json")
    derived = {k: v for k, v in resolved.items() if typed.get(k) != v}
    derived.update(model_name=model_name, report=report_path)
    files = {"config_file": cfg.fit.config, "recipe_file": str(schedules.recipe_file(cfg.fit.recipe).resolve())}
    record = {"args": resolved, "given": sorted(given), "derived": derived, **files}
    report_info = dict(files)
    if cfg.fit.mode in ("train", "train_val"):  # the data's class names travel into every checkpoint
        names = predict.training_class_names(cfg.predict.class_names, cfg.data.data_train, cfg.data.data_val,
                                             cfg.model.num_classes)
        if names:
            record["class_names"] = names
            report_info["class_names"] = predict.readable(names)
        # which records it trains on, so a resume on other ones is refused (fit.resume)
        record["train_records"] = identity.records_identity(cfg.data.data_train, cfg.data.data_train_idx)
    return state.RunInfo(model_name=model_name, arch=cfg.model.arch, command=list(command), report_path=report_path,
                       record=record, report_info=report_info)


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


def header(cfg, size, report_path):
    """One line on what runs and where its results go (every argument is in the JSON log)."""
    fit_cfg, data_cfg = cfg.fit, cfg.data
    model = f"{cfg.model.name} ({cfg.model.num_classes} classes, " \
            f"{'x'.join(str(v) for v in data_cfg.image_shape)})"
    per_worker = f" ({fit_cfg.batch_size // size} per worker)" if size > 1 else ""
    batch = f"global batch {fit_cfg.batch_size}{per_worker}" if fit_cfg.grad_accum_steps == 1 else \
        f"global batch {fit_cfg.batch_size}{per_worker} x {fit_cfg.grad_accum_steps} accumulated = " \
        f"{fit_cfg.batch_size * fit_cfg.grad_accum_steps}"
    machine = f"{size} worker(s), {batch}, {fit_cfg.dtype}, {data_cfg.data_backend}"
    if fit_cfg.mode == "val":
        return (f"Scoring {fit_cfg.load or 'freshly initialised weights'}: {model}, resize {data_cfg.data_val_resize}, "
                f"{machine}; data {data_cfg.data_val or 'synthetic'}; "
                f"results in {checkpoint.workspace_path(fit_cfg.workspace, report_path)}")
    data_files = data_cfg.data_backend if not backends.reads_records(data_cfg.data_backend) else \
        ", ".join(f for f in (data_cfg.data_train, data_cfg.data_val) if f)
    if data_cfg.test_io:  # no model runs: the pipeline's batches only
        return f"Timing the input pipeline ({data_cfg.test_io_mode}) for {model} on {machine}; data {data_files}"
    return (f"Training {model} on {machine}; recipe {fit_cfg.recipe}, LR {fit_cfg.lr:g}, {fit_cfg.num_epochs} "
            f"epochs; data {data_files}; results in {os.path.join(fit_cfg.workspace, '')}")


def warn_about(cfg, primary):
    """Refuse labels beyond --num-classes (every rank); rank 0 warns once about likely mistakes that still run."""
    fit_cfg = cfg.fit
    error, warning = None, None
    if fit_cfg.mode != "pred":
        try:
            labels = loaders.record_labels(cfg.data)  # the index check reads every record header, label included
            error = loaders.label_problem(cfg.data, cfg.model.num_classes)  # names the file and record
        except loaders.DataError as bad:
            raise UsageError(str(bad))
        if error:
            raise UsageError(error)
        error, warning = settings.class_count_problem(cfg.data.data_train, cfg.data.data_val,
                                                      cfg.model.num_classes, labels)
    if error:
        raise UsageError(error)
    if not primary:
        return
    if warning:
        logging.warning(warning)
    if fit_cfg.mode in ("train", "train_val") and backends.reads_records(cfg.data.data_backend) and \
            cfg.data.data_train:
        records = len(loaders.open_record_files(cfg.data)["train"])
        if fit_cfg.batch_size > records:
            logging.warning("--batch-size %d (global) is larger than the %d training records: every step repeats "
                            "records to fill the batch; use --batch-size %d or less", fit_cfg.batch_size, records,
                            records)
    if fit_cfg.mode in ("train", "train_val") and fit_cfg.warmup_epochs and \
            fit_cfg.warmup_epochs >= fit_cfg.num_epochs:
        logging.warning("--warmup-epochs %g is not shorter than --num-epochs %d: the LR never reaches its peak "
                        "(%g); lower --warmup-epochs", fit_cfg.warmup_epochs, fit_cfg.num_epochs, fit_cfg.lr)


def validate_args(cfg, num_workers):
    """``num_workers``: the devices the global batch is split over, in all processes."""
    fit_cfg, data_cfg = cfg.fit, cfg.data
    if fit_cfg.cpu_contexts < 1 or (fit_cfg.cpu_contexts > 1 and fit_cfg.kv_store == "horovod"):
        raise UsageError(f"--cpu-contexts {fit_cfg.cpu_contexts}: give a positive number, and use it with "
                         "--kv-store device or local (with horovod each process has one device)")
    if fit_cfg.untimed_iters < 0:
        raise UsageError(f"--untimed-iters {fit_cfg.untimed_iters}: give 0 or more iterations")
    if fit_cfg.batch_size % num_workers:
        raise UsageError(f"--batch-size {fit_cfg.batch_size} (global) does not divide across {num_workers} workers")
    if len(data_cfg.image_shape) != 3 or data_cfg.image_shape[0] not in (3, 4):
        raise UsageError(f"--image-shape must be C,H,W with C 3 or 4, got {list(data_cfg.image_shape)}")
    if fit_cfg.mode == "pred":
        return
    problem = rules.augment_problem(data_cfg.data_backend, data_cfg.auto_augment, data_cfg.color_jitter)
    if problem and fit_cfg.mode in ("train", "train_val"):
        raise UsageError(problem)
    try:
        loaders.check_train_size(data_cfg)
        loaders.check_augmentation(data_cfg)
    except ValueError as error:
        raise UsageError(str(error))
    if backends.reads_records(data_cfg.data_backend):
        missing = loaders.check_data_files(data_cfg)
        if missing:
            raise UsageError(missing)
        if not data_cfg.data_train and not data_cfg.data_val:
            raise UsageError(f"no data given (--data-train/--data-val); {cli.PREPARE_HINT}")


def contexts(fit_cfg, local_rank, local_size, num_gpus=None, environ=None):
    """The contexts this process computes on: the GPUs --gpus selects (devices.select_gpus: one rule for every
    --kv-store, under runner's CUDA_VISIBLE_DEVICES too), else CPU contexts. ``num_gpus``/``environ``: MXNet's
    GPU count and os.environ unless described."""
    import mxnet as mx
    num_gpus = mx.context.num_gpus() if num_gpus is None else num_gpus
    if num_gpus == 0:
        if fit_cfg.gpus:
            raise UsageError(f"--gpus {fit_cfg.gpus}, but this process sees no GPU; leave --gpus out on a CPU")
        return [mx.cpu()] if fit_cfg.kv_store == "horovod" else [mx.cpu(i) for i in range(fit_cfg.cpu_contexts)]
    try:
        ordinals = devices.select_gpus(fit_cfg.gpus, fit_cfg.kv_store, local_rank, local_size, num_gpus,
                                       os.environ if environ is None else environ)
    except ValueError as error:
        raise UsageError(str(error))
    return [mx.gpu(i) for i in ordinals]


def gpu_ordinal(local_rank, local_size, visible_gpus):
    """The GPU of this Horovod rank (devices.horovod_ordinal), a UsageError when it has none."""
    try:
        return devices.horovod_ordinal(local_rank, local_size, visible_gpus)
    except ValueError as error:
        raise UsageError(str(error))


def epoch_reader(cfg, epoch, seed, **changes):
    """The RunConfig changes (``changes`` and these) of ``epoch``'s training reader: its record order seeded by
    (``seed``, epoch), None keeping the run's, and with --train-size START,END the epoch's image size."""
    if len(cfg.data.train_size) == 2:
        changes.update(data__train_size=(loaders.epoch_train_size(cfg.data, epoch),), data__train_size_epochs=())
    if seed is not None:
        changes.update(fit__seed=seed + 100003 * epoch)
    return changes


def train_iterator_factory(cfg, dist, ctxs, first):
    """Training iterator per epoch. With --seed each epoch gets a fresh reader seeded by (seed, epoch), so a
    run resumed at any epoch sees exactly the batches an uninterrupted run would. With progressive resizing
    (--train-size START,END) a pipeline is also rebuilt, at the epoch's size, whenever the size changes. A
    pipeline no longer needed is let go before the next is built (it holds GPU memory): the epoch-0 one once used,
    or at once in a resumed run."""
    sized = len(cfg.data.train_size) == 2
    if cfg.fit.seed is None and not sized:
        return lambda epoch: first  # one pipeline for the whole run
    held = [first]
    built = {"size": loaders.epoch_train_size(cfg.data, 0), "iterator": None}

    def make(epoch):
        size = loaders.epoch_train_size(cfg.data, epoch)
        if epoch == 0 and held:
            if cfg.fit.seed is None:
                built["iterator"] = held[0]  # reused while the size stays
            return held.pop()  # built with --seed, the seed epoch 0 gets, at epoch 0's size
        held.clear()
        if cfg.fit.seed is None and size == built["size"] and built["iterator"] is not None:
            return built["iterator"]
        changes = epoch_reader(cfg, epoch, cfg.fit.seed, data__data_val=None)  # only the training pipeline
        built["iterator"] = None  # let the previous pipeline go before the next one is built
        built.update(size=size, iterator=loaders.get_data_iterators_per_device(
            cfg.replace(**changes), dist.rank, dist.size, dist.local_rank, dist.local_size, ctxs)[0])
        return built["iterator"]
    return make


def elastic_training(cfg, net, ctxs, dist, lock):
    """An elastic run's driver (rn50kit/training/elastic.py), or None for a run of a fixed world. Its epochs are
    built here: the training records from the first one not read yet, the batch of the world's plan. ``lock``:
    the workspace's (hold_workspace), which a worker that becomes rank 0 takes."""
    if not dist.elastic:
        return None
    from rn50kit.training import elastic, optimizers
    if not cfg.data.data_train:
        raise UsageError(f"--mode {cfg.fit.mode} needs training data (--data-train)")
    if cfg.data.data_backend not in ("dali-cpu", "dali-gpu"):
        raise UsageError(f"elastic runs read the records with the dali backends (the records not read yet go to the "
                         f"new world); --data-backend {cfg.data.data_backend} cannot: use dali-cpu or dali-gpu")
    fit_cfg = cfg.fit
    if fit_cfg.horovod_num_groups > 1:  # see optimizers.trainer_for
        raise UsageError(f"elastic runs allreduce the gradients as one group (a lost worker fails every collective "
                         f"in flight at once, which MXNet 1.9.1 does not survive when there are several); leave out "
                         f"--horovod-num-groups {fit_cfg.horovod_num_groups}")

    def make_iterators(plan, epoch, start, steps, with_val):
        changes = epoch_reader(cfg, epoch, fit_cfg.seed or 0, fit__batch_size=plan.micro_batch,
                               **({} if with_val else {"data__data_val": None}))
        return loaders.get_data_iterators(cfg.replace(**changes), dist.rank, dist.size, dist.local_rank,
                                          dist.local_size, ctxs[0], start=start, steps=steps)

    def make_trainer():
        return optimizers.trainer_for(net, dist, fit_cfg)
    samples = cfg.data.num_examples or len(loaders.open_record_files(cfg.data)["train"])
    return elastic.ElasticTraining(dist.hvd, dist, net, fit_cfg.batch_size * fit_cfg.grad_accum_steps,
                                   max(1, fit_cfg.batch_size // dist.size), samples, make_iterators, make_trainer,
                                   fit_cfg.commit_every, fit_cfg.elastic_batch == "keep", fit_cfg.grad_accum_steps,
                                   lock)


def hold_workspace(workspace, trains, dist):
    """Training writes into ``workspace``: rank 0 (the writer) locks it for this run, so a second run there is
    refused at once. Every rank learns the answer, so none is left waiting in a collective. A run that does not
    train (scoring, prediction, --test-io) takes no lock, and its stop signals end it at once."""
    if not trains:
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, signal.SIG_DFL)
        if EARLY_STOPS:
            os.kill(os.getpid(), EARLY_STOPS[0])
        return None
    lock, busy = run_lock.WorkspaceLock(workspace), ""
    if dist.is_primary:
        try:
            if not lock.acquire():
                logging.warning("The file system of %s has no locks: nothing stops a second run from writing "
                                "into this workspace", workspace)
        except run_lock.WorkspaceBusy as error:
            busy = str(error)
    if dist.elastic and busy:  # no collective before an elastic run's first sync (a worker added joins there)
        raise UsageError(busy)
    if not dist.elastic and dist.sum([1.0 if busy else 0.0], "workspace.lock")[0]:
        refuse_together(dist, busy)
    stop_signals.catch_stop_signals(EARLY_STOPS)  # from here on a SIGTERM/SIGUSR1 means: save at the next step boundary
    return lock


def calibration_batches(cfg, dist, ctxs, train_iter):
    """--dtype int8's calibration data: a function giving training batches (the run's own iterator if any)."""
    def batches():
        if train_iter is not None:
            return train_iter
        if backends.reads_records(cfg.data.data_backend) and not cfg.data.data_train:
            raise UsageError("--dtype int8 calibrates on training records: give --data-train (or run once with it: "
                             "the INT8 graph is kept beside the checkpoint)")
        return loaders.get_data_iterators(cfg, dist.rank, dist.size, dist.local_rank, dist.local_size, ctxs[0])[0]
    return batches


def build_network(cfg, ctxs, amp_graph):
    """The network, initialised on ``ctxs`` and hybridized, every parameter's shape known."""
    import mxnet as mx
    if amp_graph:
        # Operators run in bfloat16 on oneDNN through MXNet's AMP (parameters stay float32). AMP patches
        # MXNet's operators, so it must come before the network is built.
        from mxnet.contrib import amp
        amp.init(target_dtype="bfloat16")
    try:
        # Scoring builds the inference graph: no stochastic depth in it at all (training's Dropout passes through)
        model_cfg = cfg.model if cfg.fit.mode in ("train", "train_val") else \
            dataclasses.replace(cfg.model, drop_path=0.0)
        net = models.build_network(model_cfg, cfg.data.image_shape[0], cfg.data.input_layout, cfg.fit.dtype)
    except ValueError as error:  # flags that do not fit together
        raise UsageError(str(error))
    net.initialize(mx.init.Xavier(), ctx=ctxs)  # layers with their own initializer keep it
    net.hybridize(static_alloc=True, static_shape=True)
    shape = scoring.input_shape(cfg.data.image_shape, cfg.data.input_layout, 1)
    # Finish deferred shapes (so checkpoints load into every parameter) by shape inference, not a forward
    # pass: an inference-mode forward lets oneDNN reorder the weights into its own layout, which Horovod's
    # broadcast and allreduce cannot read on CPU.
    net.infer_shape(mx.nd.zeros(shape, ctx=ctxs[0], dtype=loaders.out_dtype(cfg.fit.dtype)))
    for param in net.collect_params().values():
        param._finish_deferred_init()
    return net


def start_from_pretrained(cfg, info, net, ctxs, dist):
    """--pretrained: the published weights into ``net`` on every rank (a file that does not fit fails alike
    everywhere; rank 0's new classifier reaches the others through fit's broadcast). A resumed run then loads its
    checkpoint over them. Returns the RunInfo with what was loaded, for the report."""
    loaded = pretrained.load_pretrained(net, cfg.finetune.pretrained, ctxs, cfg.model.num_classes, cfg.model.name)
    if dist.is_primary:
        logging.info("%s", loaded.summary())
    return dataclasses.replace(info, report_info={**info.report_info, "pretrained": dataclasses.asdict(loaded)})


def write_confusion_png(report, report_file):
    """Rank 0, after the report: the latest validation's confusion matrix (or most confused pairs) as a PNG beside
    it; a machine without matplotlib gets a warning."""
    if not report.per_class:
        return None
    from rn50kit.reporting import report as reports
    try:
        path = reports.save_confusion_png(report.per_class, reports.confusion_png_path(report_file))
    except ImportError as error:
        logging.warning("No confusion-matrix PNG (%s); the per-class results are in the report", error)
        return None
    print(f"Per-class results: {report_file} (\"per_class\"), confusion matrix {path}")
    return path


def refuse_together(dist, message):
    """A refusal every rank reached at the same collective: rank 0 says why, then Horovod shuts down on every
    rank in step, so none prints Horovod's "background loop uncaught exception" for a peer that left first, and
    every rank ends with status 2. One process: the UsageError, as for any bad flag."""
    if dist.hvd is None or dist.size == 1:
        raise UsageError(message)
    if dist.is_primary:
        faults.announce("train.py", message, configuration=True)  # before the shutdown: no rank ends first
    dist.shutdown()
    faults.end(2)


def check_memory(cfg, net, ctxs, dist):
    """Training only: the estimated memory of this batch per device against the device's (a GPU's memory, or the
    memory available on this machine shared by its workers); refused or warned in one line with a batch that
    fits. Every rank learns the answer (their snapshots of free memory differ)."""
    fit_cfg = cfg.fit
    if fit_cfg.mode not in ("train", "train_val") or fit_cfg.memory_check == "off":
        return
    gpu = ctxs[0].device_type == "gpu"
    if gpu:
        budget, where = memory.gpu_budget(ctxs[0]), f"GPU {ctxs[0].device_id}"
    else:
        budget, where = cpu_memory_budget(dist.local_size, len(ctxs))
    shape = scoring.input_shape(cfg.data.image_shape, cfg.data.input_layout, 1)
    problem, _ = memory.check(net, shape, fit_cfg.dtype, fit_cfg.batch_size, dist.size * len(ctxs),
                              dist.local_size, budget, where)
    if dist.elastic and problem and fit_cfg.memory_check == "refuse":  # alone: see hold_workspace
        raise UsageError(problem)
    if not dist.elastic and dist.sum([1.0 if problem and fit_cfg.memory_check == "refuse" else 0.0],
                                     "memory.check")[0]:
        refuse_together(dist, problem or "another worker's machine has too little memory for this batch (its "
                        "estimate: see memory.py); lower --batch-size, or --memory-check warn to try anyway")
    if problem and dist.is_primary:
        logging.warning("%s", problem.replace(" (--memory-check warn to try anyway)", ""))


def configure(args, given, num_gpus):
    """The RunConfig of parsed flags: the defaults that depend on the machine, the data, a checkpoint and the
    recipe filled in, then every value checked. The Namespace stops here."""
    try:
        settings.complete(args, given, num_gpus)
    except ValueError as error:
        raise UsageError(str(error))
    problem = rules.bfloat16_problem(args.dtype)  # this worker's CPU
    if problem:
        raise UsageError(problem)
    notes = fill_hyper_parameters(args, given)
    cfg = train_config.from_args(args)
    check_config(cfg)  # a refusal is the only line
    for note in notes:
        if args.mode in ("train", "train_val") and not args.test_io:  # --test-io trains nothing
            logging.info("%s", note)  # rank 0 only logs at INFO
    return cfg


def start_worker(args):
    """This process's place in the run (Horovod's world, or this process alone); a worker started as a script gets
    faults' record and the watchdog; then the console and logging of its rank."""
    hvd = None
    if args.kv_store == "horovod":
        import horovod.mxnet as hvd
        hvd.init()  # one process per worker; works alone too (size 1)
        world.check_joined(hvd.size(), hvd.rank(), hvd.local_rank(), hvd.mpi_built())  # the launcher's world?
    dist = Distributed(hvd)
    dist.elastic = hvd is not None and os.environ.get("HOROVOD_ELASTIC") == "1"  # horovodrun --min-np/--max-np
    if __name__ == "__main__":  # faults: a worker's record for runner, and a watchdog on a stalled run
        faults.install(dist.rank)
        watchdog.start(args.stall_timeout, dist.rank)
    attach_console(dist.rank)
    setup_logging(dist.rank)
    return dist


def check_run(cfg):
    """runner's rules (dtype, data backend, mode, fusion, layout against this machine), worded once."""
    import mxnet as mx
    fit_cfg = cfg.fit
    gpu = mx.context.num_gpus() > 0
    problem = rules.run_problem(fit_cfg.dtype, cfg.data.data_backend, fit_cfg.mode, cfg.model.fuse_bn_relu, gpu,
                                conv_layout=cfg.model.conv_layout, gpus=fit_cfg.gpus,
                                nvidia_fused=gpu and devices.nvidia_bn_relu())
    if problem:
        raise UsageError(problem)


def check_devices(cfg, ctxs, dist):
    """The flags against the workers' devices; --dtype int8 against what this machine can quantize."""
    # elastic: each world's plan splits the batch
    check_before_start(cfg, 1 if dist.elastic else dist.size * len(ctxs), dist.local_size, False, False)
    if cfg.fit.dtype == "int8":
        why = quantize.int8_unavailable(cfg.fit.mode, ctxs, cfg.model.conv_layout, cfg.quantize.calib_batches)
        if why:
            raise UsageError(why)


def absolute_report_path(cfg, info):
    """The absolute path of the run's report (a relative --report is inside the workspace)."""
    return os.path.abspath(checkpoint.workspace_path(cfg.fit.workspace, info.report_path))


def resolved_tables(cfg, info, workers):
    """A run's configuration as TOML tables: every field of every config as the run used it, the workers for
    runner, and a record of the kit and the files read (not settings). --config is in the record: the file
    written replaces it."""
    import rn50kit
    tables = {name: {key: value for key, value in dataclasses.asdict(getattr(cfg, name)).items() if key != "config"}
              for name in train_config.CONFIGS}
    tables["runner"] = {"ngpus": workers}
    record = {"config_file": info.record.get("config_file"), "recipe_file": info.record.get("recipe_file")}
    tables[config_files.RECORD_TABLE] = {**config_files.kit_identity(rn50kit.KIT_DIR), **record}
    return resolved_config.with_absolute_paths(tables)


def runner_workers(dist, ctxs):
    """runner's -n for this run: its GPUs, else its processes."""
    return dist.size * (len(ctxs) if ctxs[0].device_type == "gpu" else 1)


def with_resolved_config(cfg, info, dist, ctxs):
    """``info`` with the run's resolved configuration, which training writes into its workspace as it starts
    (rn50kit/reporting/resolved_config.py) and `./runner --config` replays."""
    return dataclasses.replace(info, resolved_config=resolved_tables(cfg, info, runner_workers(dist, ctxs)))


def score_config_path(report_path):
    """runs/x/model-0002.float32.score.json -> runs/x/model-0002.float32.score.config.toml: a score's resolved
    configuration beside its report, so each checkpoint, dtype and calibration keeps its own."""
    stem = report_path[:-len(".json")] if report_path.endswith(".json") else report_path
    return stem + ".config.toml"


def write_score_config(cfg, info, dist, ctxs):
    """Rank 0 of a scoring run that got its score writes the configuration it used beside the report (a refused
    run leaves an earlier one as it was); `train.py --config` or `./runner --config` replays it."""
    if dist.is_primary:
        config_files.write_resolved(score_config_path(absolute_report_path(cfg, info)),
                                    resolved_tables(cfg, info, runner_workers(dist, ctxs)))


def prediction_config_path(cfg):
    """Where a prediction's resolved configuration goes: beside its file of predictions (predictions.csv ->
    predictions.config.toml), or, for one image's printed top classes, beside the checkpoint as a score's
    (model-0002.params -> model-0002.float32.pred.config.toml)."""
    out = scoring.predictions_file(cfg)
    if out is not None:
        return os.path.abspath(os.path.splitext(out)[0] + ".config.toml")
    tag = settings.score_tag(cfg.fit.dtype, cfg.quantize.calib_mode, cfg.quantize.calib_batches)
    return os.path.abspath(f"{os.path.splitext(cfg.fit.load)[0]}.{tag}.pred.config.toml")


def write_prediction_config(cfg, info, dist, ctxs):
    """Rank 0 of a prediction that got its predictions writes the configuration it used (prediction_config_path);
    `./runner --config` or `train.py --config` replays it."""
    if dist.is_primary:
        config_files.write_resolved(prediction_config_path(cfg),
                                    resolved_tables(cfg, info, runner_workers(dist, ctxs)))


def prepare_workspace(cfg, info, dist):
    """The folders the run writes into, made now, then the workspace held (hold_workspace): the lock, or None."""
    fit_cfg = cfg.fit
    trains = fit_cfg.mode in ("train", "train_val") and not cfg.data.test_io  # --test-io writes nothing
    if trains:
        os.makedirs(fit_cfg.workspace, exist_ok=True)
        # --model-prefix may name a folder inside the workspace: make it now, not at the first checkpoint
        os.makedirs(os.path.dirname(checkpoint.workspace_path(fit_cfg.workspace, fit_cfg.model_prefix)) or ".",
                    exist_ok=True)
    if fit_cfg.mode != "pred" and not cfg.data.test_io:
        os.makedirs(os.path.dirname(absolute_report_path(cfg, info)), exist_ok=True)
    return hold_workspace(fit_cfg.workspace, trains, dist)


def drawn_seed(cfg, dist):
    """The seed a training run without --seed runs with, as if typed: config.toml and the checkpoints record it,
    so replaying the run replays its draws (issue 58). A resumed run keeps the one its newest checkpoint recorded.
    Rank 0 draws and every rank takes it. None: a seed was given, the run does not train, or it is elastic (no
    collective before an elastic run's first sync; its readers are seeded 0 without --seed)."""
    fit_cfg = cfg.fit
    if fit_cfg.seed is not None or fit_cfg.mode not in ("train", "train_val") or cfg.data.test_io or dist.elastic:
        return None
    seed = 0
    if dist.is_primary:
        saved = checkpoint.list_complete(checkpoint.workspace_path(fit_cfg.workspace, fit_cfg.model_prefix)) \
            if fit_cfg.resume == "auto" else []
        seed = saved[-1].get("seed") if saved and isinstance(saved[-1].get("seed"), int) else \
            random.SystemRandom().randrange(1, 2 ** 31)
    return int(dist.sum([seed], "seed.drawn")[0])  # float64: exact below 2**53


def seed_everything(seed):
    """--seed: Python's, MXNet's and NumPy's generators."""
    if seed is None:
        return
    import mxnet as mx
    random.seed(seed)
    mx.random.seed(seed)
    import numpy as np
    np.random.seed(seed)


def announce_run(cfg, info, dist):
    """Scoring without a checkpoint refused before the header line says what would be scored; the warnings, then
    rank 0's header line."""
    if cfg.fit.mode in ("val", "pred"):
        problem = scoring.no_checkpoint_problem(cfg.fit, cfg.data.data_backend)
        if problem:
            raise UsageError(problem)
    warn_about(cfg, dist.is_primary)
    if dist.is_primary and cfg.fit.mode != "pred":
        logging.info("%s", header(cfg, dist.size, info.report_path))


def time_data_pipeline(cfg, ctxs, dist):
    """--test-io: the data pipeline alone, no network."""
    train_iter, val_iter = loaders.get_data_iterators_per_device(cfg, dist.rank, dist.size, dist.local_rank,
                                                              dist.local_size, ctxs)
    return Outcome(io=loaders.test_io(cfg, train_iter, val_iter, dist))


def predict_images(cfg, info, net, ctxs, dist):
    """--mode pred: the checkpoint's prediction for one image (printed) or many (a file), then the configuration
    the prediction used (write_prediction_config)."""
    model = scoring.for_scoring(cfg, net, ctxs, dist, calibration_batches(cfg, dist, ctxs, None))
    prediction = scoring.predict_image(cfg, model, ctxs, dist)
    write_prediction_config(cfg, info, dist, ctxs)
    return Outcome(net=model.net, prediction=prediction)


def score_or_train(cfg, info, net, ctxs, dist, lock):
    """--mode val scores the checkpoint; train and train_val train ``net`` (``lock``: the workspace's). Returns
    (the network, the report, whether a stop signal ended the training)."""
    fit_cfg = cfg.fit
    elastic = elastic_training(cfg, net, ctxs, dist, lock) if fit_cfg.mode != "val" else None
    if elastic is not None:  # each world builds its own pipelines; fit asks an epoch's steps (the MLPerf log)
        train_iter, val_iter = range(math.ceil(elastic.epoch_samples / fit_cfg.batch_size)), None
    else:
        train_iter, val_iter = loaders.get_data_iterators_per_device(cfg, dist.rank, dist.size, dist.local_rank,
                                                                  dist.local_size, ctxs)
    if fit_cfg.mode == "val":
        model = scoring.for_scoring(cfg, net, ctxs, dist, calibration_batches(cfg, dist, ctxs, train_iter))
        report = scoring.score(cfg, info, model, val_iter, ctxs, dist)
        write_score_config(cfg, info, dist, ctxs)
        return model.net, report, False
    if train_iter is None:
        raise UsageError(f"--mode {fit_cfg.mode} needs training data (--data-train)")
    make_train_iter = train_iterator_factory(cfg, dist, ctxs, train_iter) if elastic is None else \
        (lambda epoch, steps=train_iter: steps)
    train_iter = None  # the factory holds it only as long as it is needed
    if cfg.finetune.pretrained:
        info = start_from_pretrained(cfg, info, net, ctxs, dist)
    report, stopped = fit.fit(fit_cfg, info, net, make_train_iter, val_iter, ctxs, dist,
                              cfg.model.num_classes, cfg.finetune, elastic)
    if stopped and dist.is_primary:
        print(f"Stopped by {stop_cause()} after saving a checkpoint; rerun the same command to resume")
    return net, report, stopped


def finish_run(cfg, info, dist, lock, report, stopped):
    """Every rank finishes together; then rank 0 tells runner how the run ended (the lock) and prints the result
    lines and the report's path."""
    dist.finish()
    if lock is not None and dist.is_primary:  # every rank has finished cleanly: tell runner how
        lock.finish("stopped" if stopped else "done")
    if not dist.is_primary:
        return
    top1 = report.metrics.get("val.top1")
    if top1:
        print(f"Validation top-1: {top1[-1]:.4f}")
    target = report.info.get("target")
    if target:
        print(f"Target top-1 {target['top1']:g} reached at epoch {target['epoch']} after "
              f"{target['train_seconds']:.0f} s of training, {target['wall_seconds']:.0f} s in all")
    path = absolute_report_path(cfg, info)
    print(f"Report: {path}")
    write_confusion_png(report, path)


def main(args, command=None, given=()):
    """Run ``args`` (from parse_args); ``command``: the command line, for the records; ``given``: the
    destinations of the flags typed (settings.given_flags). Returns an Outcome."""
    import mxnet as mx

    command = list(command or [sys.argv[0]])
    given = set(given)
    typed = json_values(args)
    dist = start_worker(args)
    cfg = configure(args, given, mx.context.num_gpus())
    check_run(cfg)
    ctxs = contexts(cfg.fit, dist.local_rank, dist.local_size)
    check_devices(cfg, ctxs, dist)
    seed = drawn_seed(cfg, dist)
    if seed is not None:  # as if typed, so config.toml and the checkpoints record it
        cfg, args.seed = cfg.replace(fit__seed=seed), seed
    info = run_info(cfg, json_values(args), typed, given, command)
    lock = prepare_workspace(cfg, info, dist)
    if lock is not None:  # a training run: its configuration goes into its workspace once training starts
        info = with_resolved_config(cfg, info, dist, ctxs)
    seed_everything(cfg.fit.seed)
    announce_run(cfg, info, dist)
    try:
        if cfg.data.test_io and cfg.fit.mode != "pred":  # time the data pipeline alone: no network
            return time_data_pipeline(cfg, ctxs, dist)
        # bfloat16 runs through AMP's patched operators, but for scoring's fused graph (models.to_bfloat16)
        net = build_network(cfg, ctxs, cfg.fit.dtype == "bfloat16" and not scoring.fuses(cfg, ctxs, dist))
        check_memory(cfg, net, ctxs, dist)
        STARTED.append(True)  # past the start-up checks: a failure from here on is not the configuration's
        if cfg.fit.mode == "pred":
            return predict_images(cfg, info, net, ctxs, dist)
        net, report, stopped = score_or_train(cfg, info, net, ctxs, dist, lock)
    except (fit.TrainingError, scoring.ScoringError, checkpoint.CheckpointError, loaders.DataError,
            predict.PredictionError, pretrained.PretrainedError) as error:
        raise UsageError(str(error))
    finish_run(cfg, info, dist, lock, report, stopped)
    return Outcome(net=net, report=report, stopped=stopped)


STARTED = []  # main() has passed the start-up checks (set once): a refusal before is the configuration's


def stop_cause():
    return "Ctrl-C (SIGINT)" if signal.SIGINT in stop_signals.stop_signals_received else "signal"


INTERRUPTED = 130  # 128 + SIGINT, the shell's status for a command ended by Ctrl-C


def run(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    given = given_flags(argv)  # flags typed (whatever their value) and a config file's keys
    try:
        outcome = main(args, [sys.argv[0]] + argv, given)
    except UsageError as error:  # faults: cli.fail's line, recorded for runner; a flag a file set names the file
        faults.fail("train.py", config_files.blame(str(error), read_settings(argv),
                                                   settings.given_flags(get_args_parser(), argv)),
                    configuration=not STARTED)
    except mxnet.base.MXNetError as error:  # CUDA out of memory, a GPU that does not exist: one line, not pages
        if faults.is_teardown(str(error)):
            raise  # another rank went away: faults' hook records a teardown and names the rank that fell silent
        faults.fail("train.py", devices.describe_mxnet_error(error, mxnet.context.num_gpus()))
    except KeyboardInterrupt:  # a second Ctrl-C while the first one's checkpoint was awaited
        print("train.py: interrupted (Ctrl-C twice): stopped without saving; rerun the same command to resume "
              "from the last checkpoint", file=sys.stderr)
        sys.exit(INTERRUPTED)
    if outcome.stopped and signal.SIGINT in stop_signals.stop_signals_received:
        sys.exit(INTERRUPTED)  # saved, as for SIGTERM, but the shell learns it was interrupted


if __name__ == "__main__":
    run()
