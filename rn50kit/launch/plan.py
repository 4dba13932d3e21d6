"""What runner runs for a machine description: plan_launch() checks the arguments and returns the variables and the
command, so tests plan an 8-GPU launch on a CPU machine in-process.

On a machine without a usable GPU, -n counts worker processes, and the defaults become --dtype float32
--data-backend dali-cpu (the original's are float16 and dali-gpu).
"""
import os
import sys
from pathlib import Path

import rn50kit
from rn50kit.common import backends
from rn50kit.config import recipe
from rn50kit.launch import arguments, checks, environment, hosts, launchers, network
from rn50kit.launch.launchers import elastic

KIT_DIR = Path(rn50kit.KIT_DIR)  # where train.py is, unless runner says otherwise


def plan_launch(argv, machine, environ, kit_dir=KIT_DIR):
    """What runner runs on ``machine`` (a machine.Machine) for the command-line arguments ``argv``: (the parsed
    arguments, the variables it sets, the command). Looks at nothing of this machine but ``environ`` and the files
    named, so tests plan GPU machines on a CPU. Raises UsageError."""
    args, extra = arguments.parse_runner_args(argv)
    launcher = launchers.get(args.launcher)
    checks.resolve_and_check(args, extra, machine, launcher)
    env = environment.build_env(args, machine, environ, extra, launcher)
    return args, env, build_command(args, extra, launcher.prefix(args, env), kit_dir)


def build_command(args, extra, prefix=(), kit_dir=KIT_DIR):
    """The full command line: the launcher's ``prefix``, then train.py (``kit_dir``'s) with the global batch and
    the scaled LR."""
    batch_size = args.batch_size * args.ngpus
    train = [str(kit_dir / "train.py")] if (kit_dir / "train.py").is_file() else ["-m", "train"]  # repo or installed
    command = [*prefix, sys.executable, *train]
    peeked = arguments.peek_extra(extra, args.file_values)
    command += data_flags(args, peeked.mode or "train_val", peeked)
    command += ["--dtype", args.dtype, "--kv-store", args.kv_store, "--data-backend", args.data_backend,
                "--batch-size", str(batch_size)]
    if args.num_epochs is not None:
        command += ["--num-epochs", str(args.num_epochs)]
    if args.lr is not None:  # else train.py scales the recipe's LR per 256 images by the same rule
        command += ["--lr", f"{recipe.scaled_lr(args.lr, batch_size):.10g}"]
    if args.config:  # the workers read the same file: what runner took from it is on their command line too
        command += ["--config", args.config]
    # A float16 run's NHWC layouts and 4-channel input are train.py's defaults on a GPU
    # (devices.float16_gpu_defaults): added here, they would count as the user's flags (scoring would refuse
    # a checkpoint of another image size).
    return command + extra


def data_flags(args, mode, given=None):
    """train.py's --data-<split> and --data-<split>-idx for the files of --data-root the backend's row names: the
    splits the mode needs, those it uses when present and, for INT8 (which calibrates on training data), the
    training split when present; not for a split ``given`` (peek_extra's) names a file of (its index is then
    the one beside that file, train.py's default)."""
    layout, flags = backends.root_layout(args.data_backend), []
    needed, optional = layout.splits_for(mode)
    for split in layout.splits():
        if given is not None and getattr(given, f"data_{split}", None):
            continue
        files = layout.files(split)
        there = backends.present(layout.path_in(args.data_root, files.data), files.data)
        calibrates = split == "train" and args.dtype == "int8"
        if split in needed or ((split in optional or calibrates) and there):
            flags += [f"--data-{split}", layout.path_in(args.data_root, files.data)]
            if files.index:
                flags += [f"--data-{split}-idx", layout.path_in(args.data_root, files.index)]
    return flags


def launch_description(args, machine, launcher):
    """What start_checks.check_before_start needs to know of the run: its workers, those on this machine (sharing its
    memory), this machine's GPUs and whether to estimate the memory here (every worker runs here, on the CPU)."""
    workers_here = hosts.workers_per_node(args, os.environ, launcher) if args.kv_store == "horovod" else 1
    names = hosts.host_names(args)
    here = not launcher.places_workers and all(network.is_local(host) for host in names or ["localhost"])
    # the memory of this machine's CPU: other hosts' (and each GPU's) are estimated by their workers
    return {"workers": args.ngpus, "workers_here": workers_here, "gpus": machine.gpus,
            "memory": here and not machine.gpus, "elastic": elastic.is_elastic(args)}
