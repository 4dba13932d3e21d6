"""What refuses a run before it starts, in one line each (a UsageError): runner's rules against this machine, the
flags against the devices the batch splits over, the data, the workspace and the checkpoint (prelaunch.py),
and the memory of the batch. runner runs check_launch in its own process before launching, without MXNet (what
only MXNet tells comes from hardware/mxnet_answers.py); every worker's start runs check_before_start again, then
check_memory with the network built."""
import logging
import os

from rn50kit.common import backends, rules
from rn50kit.config import cli, config_files, train_flags
from rn50kit.config.cli import UsageError
from rn50kit.config.data_flags import check_augmentation, check_data_files, check_train_size, input_shape
from rn50kit.hardware import devices, memory, mxnet_answers
from rn50kit.reliability import faults
from rn50kit.training import prelaunch
from rn50kit.training.configure import configure
from rn50kit.weights import checkpoint


def check_launch(argv, launch):
    """runner's check of train.py's flags ``argv`` before any worker starts, and in a dry run, in runner's process:
    a damaged --load file, then what check_before_start knows for ``launch`` (plan.launch_description's: the
    workers, those here, GPUs, whether to estimate the memory here), each refused as train.py would refuse it
    (``train.py: error: <one line>``, status 2). Returns the run's checkpoint prefix (None: it does not train)."""
    args = train_flags.parse_args(argv, prog="train.py")
    if args.load and os.path.isfile(args.load):  # faults: a damaged --load file, refused before the workers start
        try:
            checkpoint.check_loadable(args.load)
        except checkpoint.CheckpointError as error:
            cli.fail("train.py", str(error))
    try:
        cfg = configure(args, train_flags.given_flags(argv), launch["gpus"])
        contexts = cfg.fit.cpu_contexts if cfg.fit.kv_store != "horovod" and not launch["gpus"] else 1
        sizes = (lambda: mxnet_answers.network_sizes(cfg, argv)) if launch["memory"] else None
        check_before_start(cfg, launch["workers"] * contexts, launch["workers_here"], True, sizes)
    except UsageError as error:
        cli.fail("train.py", config_files.blame(str(error), train_flags.read_settings(argv),
                                                train_flags.typed_flags(argv)))
    return prelaunch.checkpoint_prefix(cfg)


def check_run(cfg, gpu):
    """runner's rules (dtype, data backend, mode, fusion, layout against this machine; ``gpu``: whether it has
    GPUs), worded once."""
    fit_cfg = cfg.fit
    problem = rules.run_problem(fit_cfg.dtype, cfg.data.data_backend, fit_cfg.mode, cfg.model.fuse_bn_relu, gpu,
                                conv_layout=cfg.model.conv_layout, gpus=fit_cfg.gpus,
                                nvidia_fused=gpu and devices.nvidia_bn_relu())
    if problem:
        raise UsageError(problem)


def check_devices(cfg, ctxs, dist):
    """The flags against the workers' devices; --dtype int8 against what this machine can quantize."""
    # elastic: each world's plan splits the batch
    check_before_start(cfg, 1 if dist.elastic else dist.size * len(ctxs), dist.local_size, False)
    if cfg.fit.dtype == "int8":
        from rn50kit.scoring import quantize
        why = quantize.int8_unavailable(cfg.fit.mode, ctxs, cfg.model.conv_layout, cfg.quantize.calib_batches)
        if why:
            raise UsageError(why)


def check_before_start(cfg, devices, processes_here, launching, sizes_of=None):
    """What can be known before any worker starts, a UsageError of one line: the flags against the ``devices``
    the global batch splits over (validate_args), the data's labels, the workspace, the checkpoint --resume
    continues (prelaunch.py) and, given ``sizes_of`` (a CPU run's: () -> (parameters, activations per
    image), or None when unknown; each worker estimates its GPU's), the memory of the batch for
    ``processes_here`` workers on this machine. runner runs it (check_launch, ``launching``) before launching and
    in a dry run; every worker's start runs it too, but for the memory (check_memory's collective has it) and the
    checkpoint (fit.resume, after the workspace lock)."""
    validate_args(cfg, devices)
    problem = prelaunch.problem(cfg, resume=launching)
    if problem:
        raise UsageError(problem)
    sizes = sizes_of and prelaunch.trains(cfg) and cfg.fit.memory_check == "refuse" and sizes_of()
    if sizes:
        contexts = 1 if cfg.fit.kv_store == "horovod" else cfg.fit.cpu_contexts
        budget, where = cpu_memory_budget(processes_here, contexts)
        problem, _ = memory.check_sizes(sizes, input_shape(cfg.data.image_shape, cfg.data.input_layout, 1),
                                        cfg.fit.dtype, cfg.fit.batch_size, devices, budget, where)
        if problem:
            raise UsageError(problem)


def cpu_memory_budget(processes_here, contexts):
    """(bytes per device, where) of a CPU run: this machine's available memory over its ``processes_here``
    workers, each computing on ``contexts`` CPU contexts."""
    budget = memory.cpu_budget(processes_here)
    where = "this machine" + (f" per worker ({processes_here} here)" if processes_here > 1 else "")
    return budget and budget // contexts, where


def validate_args(cfg, num_workers):
    """The flags that must fit together and with the data; ``num_workers``: the devices the global batch is split
    over, in all processes."""
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
    if problem and fit_cfg.mode in prelaunch.TRAINING_MODES:
        raise UsageError(problem)
    try:
        check_train_size(data_cfg)
        check_augmentation(data_cfg)
    except ValueError as error:
        raise UsageError(str(error))
    if backends.reads_records(data_cfg.data_backend):
        missing = check_data_files(data_cfg)
        if missing:
            raise UsageError(missing)
        if not data_cfg.data_train and not data_cfg.data_val:
            raise UsageError(f"no data given (--data-train/--data-val); {cli.PREPARE_HINT}")


def check_memory(cfg, net, ctxs, dist):
    """Training only: the estimated memory of this batch per device against the device's (a GPU's memory, or the
    memory available on this machine shared by its workers); refused or warned in one line with a batch that
    fits. Every rank learns the answer (their snapshots of free memory differ)."""
    fit_cfg = cfg.fit
    if fit_cfg.mode not in prelaunch.TRAINING_MODES or fit_cfg.memory_check == "off":
        return
    gpu = ctxs[0].device_type == "gpu"
    if gpu:
        budget, where = memory.gpu_budget(ctxs[0]), f"GPU {ctxs[0].device_id}"
    else:
        budget, where = cpu_memory_budget(dist.local_size, len(ctxs))
    shape = input_shape(cfg.data.image_shape, cfg.data.input_layout, 1)
    problem, _ = memory.check(net, shape, fit_cfg.dtype, fit_cfg.batch_size, dist.size * len(ctxs),
                              dist.local_size, budget, where)
    refused = bool(problem) and fit_cfg.memory_check == "refuse"
    if dist.elastic and refused:  # alone: no collective before an elastic run's first sync
        raise UsageError(problem)
    if not dist.elastic and dist.sum([1.0 if refused else 0.0], "memory.check")[0]:
        refuse_together(dist, problem or "another worker's machine has too little memory for this batch (its "
                        "estimate: see rn50kit/hardware/memory.py); lower --batch-size, or --memory-check warn to "
                        "try anyway")
    if problem and dist.is_primary:
        logging.warning("%s", problem.replace(" (--memory-check warn to try anyway)", ""))


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
