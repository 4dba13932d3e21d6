"""Train or score a ResNet on ImageNet-style RecordIO with MXNet Gluon, Horovod and DALI.

Usually started by `runner`, once per worker under horovodrun; it also runs alone as one worker.
"""
import argparse  # noqa: F401  (read as train.argparse by tests/e2e/test_config_files_cli.py)
import faulthandler
import json
import logging
import os
import sys


def bootstrap():
    """train.py started as a script, before MXNet loads (nothing of this happens where train is imported): the
    Python checked, crashes in native code reported, stop signals kept (stop_signals.keep_early_stops), MXNet's
    environment set, then MXNet loaded and checked; a Python or an MXNet the kit cannot run on is one line."""
    from rn50kit.common import supported
    supported.require_supported_python("train.py")  # before anything a Python it refuses could fail on
    # A crash in native code (MXNet, Horovod, DALI) prints every thread's Python stack and ends the process by its
    # signal, before MXNet loads: MXNet sets its own SIGSEGV handler only where none is, and that handler's exit()
    # can wait forever on an engine lock the crash left held (a worker hung instead of ended).
    faulthandler.enable()
    from rn50kit.training import stop_signals
    stop_signals.keep_early_stops()
    set_mxnet_environment(sys.argv[1:], os.environ)
    try:
        mxnet = supported.import_mxnet()
    except ImportError:
        sys.exit("train.py: error: MXNet is not installed for this Python; run `make setup`, then use "
                 ".venv/bin/python (or `source .venv/bin/activate`)")
    if supported.mxnet_problem(mxnet.__version__):
        sys.exit(f"train.py: error: {supported.mxnet_problem(mxnet.__version__)}")


def set_mxnet_environment(argv, environ):
    """What MXNet reads once, as it loads, set in ``environ`` before it does (a value already there is kept)."""
    if "int8" in argv:
        environ.setdefault("MXNET_DISABLE_MKLDNN_FUSE_CONV_SUM", "1")  # quantize.INT8_ENV
    if "OMP_NUM_THREADS" not in environ:
        from rn50kit.hardware import devices
        from rn50kit.reliability import world
        if world.launched_world(environ) is None and not devices.nvidia_gpu_present():
            # Started alone on a CPU machine: without OMP_NUM_THREADS MXNet 1.9 takes half of the logical CPUs on
            # x86, assuming two hyper-threads a core (src/engine/openmp.cc): one core in two idle where there are
            # none. Under runner each worker gets its share; other launchers' workers keep MXNet's choice.
            environ["OMP_NUM_THREADS"] = str(devices.openmp_threads())


if __name__ == "__main__":
    bootstrap()

# After bootstrap: as a script, MXNet's environment is set before it loads. Imported (the Python that answers
# runner's mxnet_answers, tests), MXNet loads here, without scikit-learn and SciPy too (a second of each start).
from rn50kit.common.supported import import_mxnet  # noqa: E402
from rn50kit.training.configure import configure

mxnet = import_mxnet()

import fit
from rn50kit.config import config_files, train_flags
from rn50kit.config.cli import UsageError
from rn50kit.config.data_flags import input_shape
from rn50kit.data import protocol
from rn50kit.hardware import devices, memory
from rn50kit.reliability import faults
from rn50kit.scoring import predict, scoring
from rn50kit.training import (
    announce,
    elastic_setup,
    epoch_data,
    network,
    run_modes,
    run_record,
    seeds,
    start_checks,
    stop_signals,
    worker,
    workspace,
)
from rn50kit.weights import checkpoint, pretrained

# train.py's command line lives in the configuration home (MXNet-free: runner checks it in its own process)
get_args_parser, parse_args, given_flags = train_flags.get_args_parser, train_flags.parse_args, train_flags.given_flags
read_settings, fill_hyper_parameters = train_flags.read_settings, train_flags.fill_hyper_parameters
check_config = train_flags.check_config


def setup_logging(rank):
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)


def network_sizes(argv):
    """The parameters and the activation elements per image of the network ``argv`` trains (or why it cannot be
    built), for runner's memory estimate of a CPU run."""
    cfg = configure(parse_args(argv, prog="train.py"), given_flags(argv), 0)
    try:
        net = network.build_network(cfg, [mxnet.cpu()], amp_graph=False)
    except UsageError as error:  # flags the network cannot be built with: runner's refusal
        return {"refusal": str(error)}
    shape = input_shape(cfg.data.image_shape, cfg.data.input_layout, 1)
    return {"parameters": memory.parameter_count(net), "activations": memory.activation_elements(net, shape)}


def params_problem(argv):
    """Why MXNet cannot read the parameter file ``argv[0]`` (None: it reads it)."""
    try:
        checkpoint.read_params(argv[0])
    except checkpoint.CheckpointError as error:
        return {"problem": str(error)}
    return {"problem": None}


ANSWERS = {"network_sizes": network_sizes, "params_problem": params_problem,
           "nvidia_fused_batchnorm": lambda argv: {"fused": devices.nvidia_fused_batchnorm()}}


def print_answer(question, argv):
    """What runner's launch check asks of MXNet (hardware/mxnet_answers.py), answered as JSON on stdout."""
    print(json.dumps(ANSWERS[question](argv)))


class RunFailed(UsageError):
    """A refusal once the run has passed its start-up checks: not the configuration's (runner's advice differs)."""


KIT_ERRORS = (fit.TrainingError, scoring.ScoringError, checkpoint.CheckpointError, protocol.DataError,
              predict.PredictionError, pretrained.PretrainedError)  # each one line for the user, as a UsageError


def main(args, command=None, given=()):
    """Run ``args`` (from parse_args); ``command``: the command line, for the records; ``given``: the
    destinations of the flags typed (settings.given_flags). Returns a run_modes.Outcome."""
    import mxnet as mx

    command = list(command or [sys.argv[0]])
    given = set(given)
    typed = run_record.json_values(args)
    dist = worker.start_worker(args.kv_store, args.stall_timeout, as_script=__name__ == "__main__")
    setup_logging(dist.rank)
    cfg = configure(args, given, mx.context.num_gpus())
    start_checks.check_run(cfg, gpu=mx.context.num_gpus() > 0)
    ctxs = worker.contexts(cfg.fit, dist.local_rank, dist.local_size)
    start_checks.check_devices(cfg, ctxs, dist)
    seed = seeds.drawn_seed(cfg, dist)
    if seed is not None:  # as if typed, so config.toml and the checkpoints record it
        cfg, args.seed = cfg.replace(fit__seed=seed), seed
    info = run_record.run_info(cfg, run_record.json_values(args), typed, given, command)
    lock = workspace.prepare_workspace(cfg, info, dist)
    if lock is not None:  # a training run: its configuration goes into its workspace once training starts
        info = run_record.with_resolved_config(cfg, info, dist, ctxs)
    seeds.seed_everything(cfg.fit.seed)
    announce.announce_run(cfg, info, dist)
    try:
        if cfg.data.test_io and cfg.fit.mode != "pred":  # time the data pipeline alone: no network
            return run_modes.time_data_pipeline(cfg, ctxs, dist)
        # bfloat16 runs through AMP's patched operators, but for scoring's fused graph (models.to_bfloat16)
        net = network.build_network(cfg, ctxs, cfg.fit.dtype == "bfloat16" and not scoring.fuses(cfg, ctxs, dist))
        start_checks.check_memory(cfg, net, ctxs, dist)
    except KIT_ERRORS as error:
        raise UsageError(str(error))
    try:  # past the start-up checks: a failure from here on is not the configuration's
        if cfg.fit.mode == "pred":
            return run_modes.predict_images(cfg, info, net, ctxs, dist)
        if cfg.fit.mode == "val":
            (net, report), stopped = run_modes.score_checkpoint(cfg, info, net, ctxs, dist), False
        else:
            report, stopped = train(cfg, info, net, ctxs, dist, lock)
    except (UsageError, *KIT_ERRORS) as error:
        raise RunFailed(str(error))
    run_modes.finish_run(cfg, info, dist, lock, report, stopped)
    return run_modes.Outcome(net=net, report=report, stopped=stopped)


def train(cfg, info, net, ctxs, dist, lock):
    """--mode train or train_val: ``net`` trained by fit (``lock``: the workspace's). Returns (the report,
    whether a stop signal ended the training)."""
    elastic = elastic_setup.elastic_training(cfg, net, ctxs, dist, lock)
    make_train_iter, val_iter = epoch_data.training_data(cfg, dist, ctxs, elastic)
    if cfg.finetune.pretrained:
        info = network.start_from_pretrained(cfg, info, net, ctxs, dist)
    report, stopped = fit.fit(cfg.fit, info, net, make_train_iter, val_iter, ctxs, dist, cfg.model.num_classes,
                              cfg.finetune, elastic)
    if stopped and dist.is_primary:
        print(f"Stopped by {stop_signals.stop_cause()} after saving a checkpoint; rerun the same command to resume")
    return report, stopped


def run(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    given = given_flags(argv)  # flags typed (whatever their value) and a config file's keys
    try:
        outcome = main(args, [sys.argv[0]] + argv, given)
    except UsageError as error:  # faults: cli.fail's line, recorded for runner; a flag a file set names the file
        faults.fail("train.py", config_files.blame(str(error), read_settings(argv), train_flags.typed_flags(argv)),
                    configuration=not isinstance(error, RunFailed))
    except mxnet.base.MXNetError as error:  # CUDA out of memory, a GPU that does not exist: one line, not pages
        if faults.is_teardown(str(error)):
            raise  # another rank went away: faults' hook records a teardown and names the rank that fell silent
        faults.fail("train.py", devices.describe_mxnet_error(error, mxnet.context.num_gpus()))
    except OSError as error:  # a full disk at a log's or the report's write: one line, not a traceback
        if checkpoint.write_failure(error) is None:
            raise
        faults.fail("train.py", checkpoint.write_failure(error))
    except KeyboardInterrupt:  # a second Ctrl-C while the first one's checkpoint was awaited
        print("train.py: interrupted (Ctrl-C twice): stopped without saving; rerun the same command to resume "
              "from the last checkpoint", file=sys.stderr)
        sys.exit(stop_signals.INTERRUPTED)
    if outcome.stopped and stop_signals.interrupted():
        sys.exit(stop_signals.INTERRUPTED)  # saved, as for SIGTERM, but the shell learns it was interrupted


if __name__ == "__main__":
    run()
