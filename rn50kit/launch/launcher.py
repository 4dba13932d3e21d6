"""Launch training or scoring on N workers: scales batch and LR, then runs `horovodrun -np N python train.py ...`.

The logic of `runner` (a thin script over this module), importable: plan_launch() computes what runs for a
machine description, so tests plan an 8-GPU launch on a CPU machine in-process.

-b is the batch per worker and -l the LR per 256 images; train.py gets the global batch (b*N) and the
scaled LR (l*b*N/256). Every flag runner does not know goes through to train.py (`python train.py --help`).
On a machine without a usable GPU, -n counts worker processes, and the defaults become
--dtype float32 --data-backend dali-cpu (the original's are float16 and dali-gpu).
"""
import argparse
import functools
import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import rn50kit
from rn50kit.common import supported
from rn50kit.common import backends
from rn50kit.common import cli
from rn50kit.common import config_files
from rn50kit.common.cli import PREPARE_HINT, UsageError
from rn50kit.launch import devices
from rn50kit.launch import discovery
from rn50kit.launch import network
from rn50kit.reliability import faults
from rn50kit.common.helptext import HelpFormatter
from rn50kit.common import rules
from rn50kit.reliability import run_lock
from rn50kit.common import schedules
from rn50kit.launch import world

KIT_DIR = Path(rn50kit.KIT_DIR)  # where train.py is, unless runner says otherwise
DEFAULT_DATA_ROOT = Path(cli.DEFAULT_DATA_ROOT)
INTERRUPTED = 130  # 128 + SIGINT: a shell's status for a command ended by Ctrl-C
CPU_BATCH_PER_WORKER = 32  # -b without a GPU: a batch a CPU holds (ResNet-50 at 224 px in about 5 GiB)

# Variables of the original runner, each checked against the sources of upstream MXNet 1.9.1 and Horovod 0.28.1:
# kept only where the library reads it AND the value differs from its default. Left out: MXNET_EXEC_ENABLE_ADDTO,
# MXNET_USE_TENSORRT, MXNET_ASYNC_GPU_ENGINE, MXNET_HOROVOD_NUM_GROUPS and HOROVOD_GROUPED_ALLREDUCES (read only by
# NVIDIA's container builds); MXNET_UPDATE_ON_KVSTORE (gluon.Trainer ignores it when update_on_kvstore is given,
# and both our trainers give it: python/mxnet/gluon/trainer.py, Horovod's DistributedTrainer passes kvstore=None);
# MXNET_GPU_WORKER_NTHREADS=2 (the default, src/common/utils.h); HOROVOD_BATCH_D2D_MEMCOPIES=1 (the default: only 0
# changes anything, horovod/common/operations.cc); HOROVOD_ENABLE_ASYNC_COMPLETION (with MXNet 1.x Horovod's
# callback waits for the GPU event anyway, horovod/mxnet/mpi_ops.cc: no MXNET_ASYNC_GPU_ENGINE_SUPPORTED upstream).
# A value already in the environment wins, so users can still tune each one.
COMMON_ENV = {
    # CachedOp (hybridized training) bulks this many operators per engine op, forward and backward
    # (include/mxnet/imperative.h, read as CachedOpConfig's defaults; MXNet's default is 15 each): the whole
    # forward pass in one, smaller backward bulks so Horovod's allreduce of finished gradients starts earlier.
    "MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_FWD": "999",
    "MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD": "25",
    "HOROVOD_FUSION_THRESHOLD": "67108864",  # 64 MiB tensor-fusion buffer, the original's (Horovod's default: 128)
}
GPU_ENV = {
    # ms between Horovod's fusion cycles (default 1): its background thread has a CPU core to itself on a GPU node
    "HOROVOD_CYCLE_TIME": "0.1",
    # SGD (not NAG) updates this many weights per multi-tensor kernel (python/mxnet/optimizer/optimizer.py, default
    # 4; the kernel holds at most 60, src/operator/optimizer_op-inl.h): fewer launches on a GPU. On CPU the fused
    # kernel is slower than one update per weight (measured: a quarter of a ResNet-18 training step).
    "MXNET_OPTIMIZER_AGGREGATION_SIZE": "60",
    "MXNET_GPU_COPY_NTHREADS": "1",  # copy threads per GPU (default 2; src/engine/threaded_engine_perdevice.cc)
    # cuDNN's heuristics pick convolution algorithms instead of a slow autotune at start-up (default 1, autotune;
    # src/operator/nn/cudnn/cudnn_convolution-inl.h)
    "MXNET_CUDNN_AUTOTUNE_DEFAULT": "0",
    # Replay each bulked segment of a static hybridized graph as a CUDA graph (default off): CachedOp's static
    # segments run through CudaGraphsExec (src/imperative/imperative_utils.h, src/executor/cuda_graphs.h) in
    # builds with CUDA >= 10.2, as the mxnet-cu112/cu117 wheels are; train.py hybridizes with static_alloc.
    "MXNET_ENABLE_CUDA_GRAPHS": "1",
    "OMP_NUM_THREADS": "1",  # the GPU computes; CPU operators only feed it, and DALI has its own threads
}
# Open MPI's mpirun refuses to start as root without both (CI and containers run as root).
MPIRUN_ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
# What mpirun passes on to every worker, remote ones included: runner's variables, and these when set.
MPIRUN_EXPORTS = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH")
MPIRUN_EXPORT_PREFIXES = ("HOROVOD_", "NCCL_", "MXNET_", "OMP_", "DALI_", "CUDA_VISIBLE_DEVICES")
LAYOUT_FLAGS = ("--input-layout", "--conv-layout", "--batchnorm-layout", "--pooling-layout")
TRAIN_FLAGS_EPILOG = (
    "Every other flag goes to train.py (`python train.py --help` lists them all) and is checked before any worker "
    "starts. Common ones: --workspace DIR (default: runs/<model>), --resume auto|none|PATH, "
    "--mode train_val|train|val|pred, --recipe " + "|".join(schedules.RECIPES) + ", --seed N, "
    "--num-layers N or --model NAME, "
    "--num-classes N, --image-shape C,H,W, --data-val-resize N, --load PATH (val/pred), --keep-last K, "
    "--save-frequency N.")


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False,
                                     formatter_class=HelpFormatter, epilog=TRAIN_FLAGS_EPILOG)
    parser.add_argument("-n", "--ngpus", type=int, default=1,
                        help="number of workers in all: GPUs, or processes on a machine without GPUs")
    parser.add_argument("-b", "--batch-size", type=int, default=None,
                        help="batch size per worker (default: 192 with GPUs, 32 per worker without)")
    parser.add_argument("-e", "--num-epochs", type=int, default=None,
                        help="number of epochs (default: the recipe's, 90), or of scoring passes with --mode val "
                             "(default: 1)")
    parser.add_argument("-l", "--lr", type=float, default=None,
                        help="learning rate per 256 images (default: the recipe's, 0.256 for nvidia, 0.1 for he "
                             "and nvidia-2019)")
    parser.add_argument("--data-root", type=Path, default=DEFAULT_DATA_ROOT,
                        help="directory with train.rec/.idx and val.rec/.idx")
    parser.add_argument("--dtype", default=None, choices=cli.DTYPES,
                        help="precision (default: float16 with GPUs, float32 without; int8: scoring on the CPU)")
    parser.add_argument("--kv-store", default="horovod", choices=cli.KV_STORES,
                        help="gradient reduction: horovod (one process per worker) or one process for all GPUs")
    parser.add_argument("--data-backend", default=None, choices=cli.DATA_BACKENDS,
                        help="data loading backend (default: dali-gpu with GPUs, dali-cpu without)")
    parser.add_argument("--launcher", default="horovod", choices=["horovod", "mpi", "slurm"],
                        help="horovodrun, mpirun, or none (srun has already started one process per worker)")
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", default=None,
                       help="multi-node: host:slots list for horovodrun/mpirun, e.g. host1:8,host2:8")
    hosts.add_argument("--hostfile", type=Path, default=None, help="multi-node: file of `host slots=N` lines")
    parser.add_argument("--network-interface", default=None, metavar="IFACE[,IFACE]",
                        help="multi-node: the network interface(s) for Horovod's Gloo, NCCL and MPI traffic "
                             "(default: horovodrun finds the common ones; MPI and NCCL choose their own)")
    parser.add_argument("--config", metavar="FILE.toml", default=None,
                        help="settings from a TOML file, for runner and train.py alike (docs/training.md, Configuration"
                             " files): keys are long flag names; batch_size is the global batch, lr the absolute LR; "
                             "the command line wins")
    add_elastic_args(parser)
    parser.add_argument("--dry-run", action="store_true",
                        help="check everything the run would check before starting (runner's arguments, train.py's "
                             "flags, the machine), print the environment and the command, do not run it")
    parser.set_defaults(file_values={})  # a --config file's values runner plans from (read_config)
    return parser


def add_elastic_args(parser):
    """horovodrun's elastic flags, under their own names (docs/multi-node.md, Elastic runs)."""
    group = parser.add_argument_group(
        "Elastic runs", "workers that come and go without stopping the run (horovodrun's elastic driver, Gloo): "
        "give --min-np (and -H/--hostfile, whose hosts runner's own discovery script reports; a --hostfile is read "
        "again every few seconds, so adding a line adds a host) or --host-discovery-script")
    group.add_argument("--min-np", type=int, metavar="N", help="the fewest workers the run goes on with")
    group.add_argument("--max-np", type=int, metavar="N", help="the most workers the run grows to")
    group.add_argument("--host-discovery-script", metavar="SCRIPT",
                       help="prints the available hosts, one `host:slots` per line (horovodrun runs it every few "
                            "seconds)")
    group.add_argument("--slots-per-host", type=int, metavar="N",
                       help="slots of a host the discovery script prints without them")
    group.add_argument("--elastic-timeout", type=int, metavar="SECONDS",
                       help="how long the run waits for --min-np workers before it ends (horovodrun's default: 600)")
    group.add_argument("--reset-limit", type=int, metavar="N", help="end the run after this many world changes")
    group.add_argument("--blacklist-cooldown-range", type=int, nargs=2, metavar=("MIN", "MAX"),
                       help="seconds before a failed host may come back (default: never)")


ELASTIC_FLAGS = ("min_np", "max_np", "host_discovery_script", "slots_per_host", "elastic_timeout", "reset_limit",
                 "blacklist_cooldown_range")


def is_elastic(args):
    return args.min_np is not None or args.max_np is not None or args.host_discovery_script is not None


def check_elastic(args):
    """An elastic run's flags against the rest, before anything starts."""
    given = [f"--{name.replace('_', '-')}" for name in ELASTIC_FLAGS if getattr(args, name) is not None]
    if not is_elastic(args):
        if given:
            raise UsageError(f"{given[0]} is for elastic runs: give --min-np (or --max-np or "
                             "--host-discovery-script) too")
        return
    if args.launcher != "horovod" or args.kv_store != "horovod":
        raise UsageError(f"elastic runs need horovodrun's elastic driver, which runs on Gloo: use --launcher horovod "
                         f"--kv-store horovod (not --launcher {args.launcher} --kv-store {args.kv_store})")
    min_np, max_np = args.min_np or args.ngpus, args.max_np or args.ngpus
    if not 1 <= min_np <= args.ngpus <= max_np:
        raise UsageError(f"elastic runs need 1 <= --min-np <= -n <= --max-np; got {min_np}, {args.ngpus}, {max_np}")
    if args.host_discovery_script and (args.hosts or args.hostfile):
        raise UsageError("give either --host-discovery-script or -H/--hostfile (runner writes the discovery "
                         "script for those)")


def choose_network_interface(args):
    """A named --network-interface must exist here; an elastic run over -H/--hostfile without one gets the
    loopback when every host is this machine (network.py: horovodrun's driver would wait --elastic-timeout for
    a second host to find one), or a refusal when it cannot be found."""
    if args.network_interface:
        problem = network.missing_interface(args.network_interface)
        if problem:
            raise UsageError(problem)
    elif is_elastic(args) and args.host_discovery_script:  # the hosts it reports now; more may come later
        hosts = network.discovered_hosts(args.host_discovery_script)
        if hosts and all(network.is_local(host) for host in hosts):
            args.network_interface = network.loopback_interface()
    elif is_elastic(args):
        hosts = host_names(args) or ["localhost"]
        try:
            args.network_interface = network.elastic_interface(hosts)
        except ValueError as error:
            raise UsageError(str(error))


def host_names(args):
    """The hosts of -H or --hostfile (a missing file is host_slots' to refuse), or None for a single-node run."""
    if args.hostfile:
        text = args.hostfile.read_text() if args.hostfile.is_file() else ""
        return [line.partition(":")[0] for line in discovery.hostfile_lines(text)]
    return [entry.partition(":")[0] for entry in args.hosts.split(",")] if args.hosts else None


def elastic_flags(args):
    """horovodrun's flags for an elastic run: its own, and a discovery script reporting -H or --hostfile."""
    discovery = args.host_discovery_script
    if discovery is None:
        source = ["--hostfile", str(args.hostfile.resolve())] if args.hostfile else \
            ["--hosts", args.hosts or f"localhost:{args.ngpus}"]
        discovery = shlex.join([sys.executable, str(Path(__file__).with_name("discovery.py")), *source])
    flags = ["--min-np", str(args.min_np or args.ngpus), "--max-np", str(args.max_np or args.ngpus),
             "--host-discovery-script", discovery]
    for name in ("slots_per_host", "elastic_timeout", "reset_limit"):
        if getattr(args, name) is not None:
            flags += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    if args.blacklist_cooldown_range:
        flags += ["--blacklist-cooldown-range", *map(str, args.blacklist_cooldown_range)]
    return flags


def fail(message):
    cli.fail("runner", message)


# --- the machine ---------------------------------------------------------------------------------------------

class Machine:
    def __init__(self, gpus, cores, note="", nvidia_fused=False):
        self.gpus = gpus  # GPUs MXNet can use
        self.cores = cores
        self.note = note  # why GPUs that are present cannot be used, if so
        self.nvidia_fused = nvidia_fused  # NVIDIA's MXNet build: its BatchNorm fuses the ReLU on GPUs


def nvidia_gpu_count():
    """GPUs the NVIDIA driver reports, without starting CUDA (fast; 0 without a driver)."""
    proc = Path("/proc/driver/nvidia/gpus")
    if proc.is_dir():
        count = len(list(proc.iterdir()))
    elif shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError):
            return 0
        count = sum(line.startswith("GPU ") for line in out.splitlines())
    else:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        entries = [v for v in visible.split(",") if v.strip()]
        if "-1" in [v.strip() for v in entries]:
            entries = entries[:[v.strip() for v in entries].index("-1")]
        count = min(count, len(entries))
    return count


def detect_machine():
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    physical = nvidia_gpu_count()
    if physical == 0:
        return Machine(0, cores)
    # GPUs are present: only now is it worth importing MXNet, whose CPU build cannot use them.
    try:
        import mxnet as mx
        usable = mx.context.num_gpus()
    except Exception as error:  # a broken CUDA set-up must not stop a CPU run
        return Machine(0, cores, f"MXNet cannot use the {physical} GPU(s) here ({error})")
    if usable == 0:
        return Machine(0, cores, f"the installed MXNet is the CPU build, so the {physical} GPU(s) here are "
                                 "unused (see docs/gpu.md)")
    unsupported = devices.unsupported_gpu(usable)  # gpu_check's test: refused before any worker starts
    if unsupported:
        raise UsageError(unsupported)
    return Machine(min(usable, physical), cores, nvidia_fused=devices.nvidia_bn_relu())


# --- checks --------------------------------------------------------------------------------------------------

def peek_parser():
    """The train.py flags runner must know about (mode, explicit data files, workspace, --test-io)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in ("--mode", "--data-train", "--data-val", "--workspace", "--fuse-bn-relu", "--image-shape",
                 "--gpus", *LAYOUT_FLAGS):
        parser.add_argument(flag)
    parser.add_argument("--test-io", action="store_true")
    return parser


def peek_extra(extra, file_values=None):
    """The values of the train.py flags runner must know about, as the workers will have them: typed in
    ``extra`` (left there as they are), else from the --config file (``file_values``: read_config's)."""
    parser = peek_parser()
    known = {action.dest for action in parser._actions}
    parser.set_defaults(**{dest: value for dest, value in (file_values or {}).items() if dest in known})
    return parser.parse_known_args(extra)[0]


# What runner takes from a --config file for itself; train.py reads the whole file again (runner passes it on).
RUNNER_FROM_FILE = ("ngpus", "dtype", "kv_store", "data_backend", "data_root", "launcher", "hosts", "hostfile",
                    "network_interface")


def read_config(path):
    """runner's part of a --config file, converted as its flags would be: its own flags' values, the global
    batch_size, and the train.py flags it plans from (peek_extra's). The rest is train.py's to check."""
    file_settings = config_files.read(path)
    own = {action.dest: action for action in get_args_parser()._actions
           if action.dest in RUNNER_FROM_FILE or action.dest == "batch_size"}
    peeked = {action.dest: action for action in peek_parser()._actions if action.option_strings}
    values = {}
    for dest, value in file_settings.values.items():
        action = own.get(dest) or peeked.get(dest)
        if action is not None:
            values[dest] = config_files.convert(action, value, file_settings.where(dest), dest)
    return values


def parse_runner_args(argv):
    """runner's arguments and train.py's (``extra``): the command line over a --config file over the defaults."""
    parser = get_args_parser()
    args, extra = parser.parse_known_args(argv)
    if args.config is None:
        return args, extra
    path = os.path.abspath(args.config)
    try:
        values = read_config(path)
    except config_files.ConfigError as error:
        raise BadConfigFile(str(error))
    parser.set_defaults(**{dest: value for dest, value in values.items() if dest in RUNNER_FROM_FILE},
                        file_values=values)
    args, extra = parser.parse_known_args(argv)
    args.config = path
    return args, extra


class BadConfigFile(UsageError):
    """runner's --config file is malformed or holds a bad value for runner: the message names the file's line."""


def blame_config_file(message, argv):
    """``message`` with where the --config file of ``argv`` set the flag it names, unless that flag was typed."""
    parser = get_args_parser()
    path = parser.parse_known_args(argv)[0].config
    if path is None:
        return message
    try:
        file_settings = config_files.read(os.path.abspath(path))
    except config_files.ConfigError:
        return message  # the file's own fault is the message already
    typed = {config_files.dest_of(word[2:].partition("=")[0]) for word in argv if word.startswith("--")}
    typed |= {action.dest for action in parser._actions for word in argv if word in action.option_strings}
    return config_files.blame(message, file_settings, typed)


def batch_from_file(args):
    """-b from a --config file's batch_size, which is the global batch (train.py's --batch-size) in a file."""
    batch = args.file_values["batch_size"]
    if batch % args.ngpus:
        raise BadConfigFile(f"batch_size = {batch} in {args.config} is the global batch, and does not divide across "
                         f"{args.ngpus} workers; give a multiple of {args.ngpus}, or -b (per worker)")
    return batch // args.ngpus


def host_slots(args):
    """Slots per host of -H or --hostfile, or None for a single-node run."""
    if args.hosts:
        slots = []
        for entry in args.hosts.split(","):
            host, _, count = entry.partition(":")
            if not host or (count and not count.isdigit()):
                raise UsageError(f"-H {args.hosts}: expected host:slots entries, e.g. host1:8,host2:8")
            slots.append(int(count or 1))
        return slots
    if args.hostfile:
        if not args.hostfile.is_file():
            raise UsageError(f"--hostfile {args.hostfile} does not exist")
        slots = []
        for line in args.hostfile.read_text().splitlines():
            line = line.split("#")[0].strip()
            if line:
                count = [w.split("=")[1] for w in line.split()[1:] if w.startswith("slots=")]
                slots.append(int(count[0]) if count and count[0].isdigit() else 1)
        return slots
    return None


def workers_per_node(args, environ):
    """How many workers share one machine's cores."""
    slots = host_slots(args)
    if slots:
        return max(1, min(args.ngpus, max(slots)))
    if args.launcher == "slurm":
        if hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) < (os.cpu_count() or 1):
            return 1  # Slurm bound this task to its own cores (task/affinity, task/cgroup): they are its share
        return slurm_tasks_on_this_node(environ) or args.ngpus
    return args.ngpus


def slurm_tasks_on_this_node(environ):
    """Tasks of this srun step on this task's node: SLURM_STEP_TASKS_PER_NODE ("2(x3),1") at SLURM_NODEID."""
    counts = []
    for part in environ.get("SLURM_STEP_TASKS_PER_NODE", "").split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            return None
        counts += [int(match[1])] * int(match[2] or 1)
    node = environ.get("SLURM_NODEID", "0")
    return counts[int(node)] if node.isdigit() and int(node) < len(counts) else None


def resolve_and_check(args, extra, machine):
    """Fill the machine-dependent defaults and refuse what cannot run here, before anything is started."""
    if args.ngpus < 1:
        raise UsageError(f"-n (--ngpus) must be at least 1, got {args.ngpus}")
    if args.batch_size is not None and args.batch_size < 1:
        raise UsageError(f"-b must be at least 1, got {args.batch_size}")
    if args.lr is not None and args.lr < 0:
        raise UsageError(f"-l must not be negative, got {args.lr}")
    check_launcher(args)
    check_elastic(args)
    choose_network_interface(args)
    if args.batch_size is None and "batch_size" in args.file_values:
        args.batch_size = batch_from_file(args)
    gpu = machine.gpus > 0
    why = f" ({machine.note})" if machine.note else ""
    if args.dtype is None:
        args.dtype = "float16" if gpu else "float32"
    if args.data_backend is None:
        args.data_backend = backends.default(gpu)
    if args.batch_size is None:
        args.batch_size = 192 if gpu else CPU_BATCH_PER_WORKER
    peeked = peek_extra(extra, args.file_values)
    problem = rules.run_problem(args.dtype, args.data_backend, peeked.mode or "train_val",
                                peeked.fuse_bn_relu == "1", gpu, why, peeked.conv_layout, peeked.gpus,
                                getattr(machine, "nvidia_fused", False))
    if problem:
        raise UsageError(problem)
    slots = host_slots(args)
    if slots is not None:
        slots = sum(slots)
        if args.ngpus > slots:
            raise UsageError(f"-n {args.ngpus} is more than the {slots} slots in the host list")
        if args.kv_store != "horovod":
            raise UsageError(f"--kv-store {args.kv_store} runs one process on one machine; "
                             "use --kv-store horovod with -H/--hostfile")
    elif args.launcher != "slurm" and not args.host_discovery_script:  # srun/the script place the processes
        if gpu and args.ngpus > machine.gpus:
            raise UsageError(f"-n {args.ngpus} is more than the {machine.gpus} GPU(s) on this machine; "
                             f"use -n {machine.gpus} or fewer, or -H host1:N,host2:N for several machines")
        if not gpu and args.ngpus > machine.cores:
            raise UsageError(f"-n {args.ngpus} worker processes is more than the {machine.cores} CPU cores of "
                             f"this machine, which has no GPU{why}; use -n {machine.cores} or fewer")
        if not gpu and args.kv_store != "horovod" and args.ngpus > 1:
            raise UsageError(f"--kv-store {args.kv_store} runs one process, which drives GPUs; "
                             f"on a machine without GPUs use --kv-store horovod for -n {args.ngpus}")
    check_data_root(args, peek_extra(extra, args.file_values))


def check_launcher(args):
    """mpirun and srun start the workers themselves: Horovod must be built with MPI to join them into one world
    (else each trains alone), and under srun the world is srun's (-n comes from it). Any Horovod must load with
    MXNet (a container's own Horovod may have been built without it)."""
    if args.kv_store != "horovod":
        return
    problem = supported.horovod_problem(horovod_build())
    if problem:
        raise UsageError(problem)
    if args.launcher == "horovod":
        return
    if args.launcher == "mpi" and shutil.which("mpirun") is None:
        raise UsageError(f"--launcher mpi: mpirun is not installed; {world.MPI_ADVICE}, or use --launcher horovod")
    if not horovod_has_mpi():
        raise UsageError(f"--launcher {args.launcher} needs Horovod built with MPI, and this one has none (each "
                         f"worker would train alone); {world.MPI_ADVICE}, or use --launcher horovod")
    if args.launcher == "slurm":
        use_srun_step(args, os.environ)


# What Horovod's MXNet extension was built with, asked of its library through ctypes in a short process (0.1 s).
# horovodrun's own check forks a process per framework that imports it: for MXNet 3 s of CPU and 5 s before any
# worker starts, on every launch; `import horovod.mxnet` costs the same.
HOROVOD_BUILD_PROBE = """
import ctypes, importlib.util, os, sysconfig
def folder(package):
    return importlib.util.find_spec(package).submodule_search_locations[0]
ctypes.CDLL(os.path.join(folder("mxnet"), "libmxnet.so"), mode=ctypes.RTLD_GLOBAL)
lib = ctypes.CDLL(os.path.join(folder("horovod"), "mxnet", "mpi_lib" + sysconfig.get_config_var("EXT_SUFFIX")))
print(lib.horovod_gloo_built(), lib.horovod_mpi_built(), lib.horovod_nccl_built())
"""


@functools.lru_cache(maxsize=None)  # asked by the checks and by the launch: one probe a process
def horovod_build(python=None):
    """{"gloo": bool, "mpi": bool, "nccl": bool} of the installed Horovod for MXNet (of ``python``, this one by
    default), or None where its library does not load."""
    probe = subprocess.run([python or sys.executable, "-c", HOROVOD_BUILD_PROBE], capture_output=True, text=True)
    try:
        gloo, mpi, nccl = (bool(int(flag)) for flag in probe.stdout.split())
    except ValueError:
        return None
    return {"gloo": gloo, "mpi": mpi, "nccl": nccl}


def horovod_has_mpi():
    """Whether the installed Horovod was built with MPI (asked for --launcher mpi and slurm)."""
    build = horovod_build()
    if build is not None:
        return build["mpi"]
    try:  # its library does not load: the import says why
        import horovod.mxnet as hvd
    except ImportError as error:
        raise UsageError(f"Horovod for MXNet does not import ({error}); run `make setup`")
    return hvd.mpi_built()


def use_srun_step(args, environ):
    """Under --launcher slurm, srun has started one runner per worker: take the world's size from it."""
    tasks = environ.get("SLURM_STEP_NUM_TASKS", "")
    if not tasks.isdigit():
        raise UsageError("--launcher slurm runs inside an srun step, one runner per worker, e.g. "
                         "`srun -n 8 ./runner --launcher slurm ...` in an sbatch script or a salloc shell")
    if args.ngpus not in (1, int(tasks)):  # 1 is the default: -n was not given
        raise UsageError(f"-n {args.ngpus} but srun started {tasks} tasks; leave -n out under --launcher slurm")
    args.ngpus = int(tasks)
    mpi_type = environ.get("SLURM_MPI_TYPE", "none")
    # Open MPI joins srun's tasks through PMIx only (with pmi2 or none its MPI_Init aborts, checked with 4.1.4).
    if mpi_type == "none" or (not mpi_type.startswith("pmix") and shutil.which("ompi_info")):
        raise UsageError(f"srun started the tasks with --mpi={mpi_type}, through which MPI cannot join them; "
                         "run `srun --mpi=pmix ...` (`srun --mpi=list` shows what this Slurm offers)")


def check_data_root(args, given):
    """The files the mode needs (the backend's row names them: backends.RootLayout) must be in --data-root, unless
    given to train.py directly."""
    layout = backends.root_layout(args.data_backend)
    needed = [name for split in layout.splits_for(given.mode or "train_val")[0] if not getattr(given, f"data_{split}")
              for name in layout.files(split).names()]
    if not needed:
        return
    problem = cli.data_root_problem(args.data_root, layout)
    if problem:
        raise UsageError(problem)
    for name in needed:
        if not backends.present(layout.path_in(args.data_root, name), name):
            raise UsageError(f"{layout.path_in(args.data_root, name)} is missing; {PREPARE_HINT}")


# --- the command ---------------------------------------------------------------------------------------------

def build_env(args, machine, environ, extra=()):
    """The variables runner sets (values already in ``environ`` win)."""
    env = dict(COMMON_ENV)
    if machine.gpus:
        env.update(GPU_ENV)
        try:  # --gpus selects the GPUs with every --kv-store (devices.select_gpus); -n must agree with it
            workers_here = workers_per_node(args, environ) if args.kv_store == "horovod" else args.ngpus
            visible = devices.runner_visible_devices(peek_extra(extra, args.file_values).gpus, workers_here,
                                                     args.kv_store)
        except ValueError as error:
            raise UsageError(str(error))
        if visible is not None and "CUDA_VISIBLE_DEVICES" not in environ:
            env["CUDA_VISIBLE_DEVICES"] = visible  # one process, N GPUs: --gpus's, else the first N
    else:
        # The cores are shared: one OpenMP thread team per worker, each with its share.
        env["OMP_NUM_THREADS"] = str(max(1, machine.cores // workers_per_node(args, environ)))
        # Horovod's background thread polls every cycle; at the GPU setting (0.1 ms) it takes a core's share
        # from the workers' compute (ResNet-18, 224 px, 2 workers on 2 cores: 23 img/s at 0.1 ms, 34 at 20 ms).
        env["HOROVOD_CYCLE_TIME"] = "20"
    if args.launcher == "mpi" and os.geteuid() == 0:
        env.update(MPIRUN_ROOT_ENV)
    env.update(interface_env(args.launcher, args.network_interface))
    env = {key: environ.get(key, value) for key, value in env.items()}
    if is_elastic(args):
        env = {key: value for key, value in env.items() if key not in ELASTIC_UNSAFE_ENV}
    return env


# Variables that fix a value of Horovod's parameter manager. Horovod 0.28.1 cannot re-initialise after an elastic
# reset with any of them set: a fixed value is taken out of its Bayesian parameter's vectors, and the next init
# writes its default to the removed index (horovod/common/parameter_manager.cc:449, BayesianParameter::SetValue):
# a segmentation fault in the background thread of every surviving worker (seen here with the two runner sets).
ELASTIC_UNSAFE_ENV = ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_AUTOTUNE")


def drop_elastic_unsafe_env(environ):
    """Take the variables above out of ``environ`` (runner's own, which horovodrun passes on), saying so for each
    one the user had set."""
    for key in ELASTIC_UNSAFE_ENV:
        if key in environ:
            print(f"runner: note: elastic runs leave out {key}={environ.pop(key)} (Horovod 0.28.1 crashes when it "
                  "re-initialises after a reset with it set)", file=sys.stderr)


def interface_env(launcher, interfaces):
    """--network-interface for mpirun's and srun's workers: Open MPI's TCP transport (mpirun passes OMPI_MCA_*
    on to its daemons and workers) and NCCL. horovodrun takes it as a flag instead: it sets both variables
    itself, from the interfaces it finds or is given."""
    if not interfaces or launcher == "horovod":
        return {}
    return {"OMPI_MCA_btl_tcp_if_include": interfaces, "OMPI_MCA_oob_tcp_if_include": interfaces,
            "NCCL_SOCKET_IFNAME": interfaces}


def build_command(args, extra, env=(), kit_dir=KIT_DIR):
    """The full command line: launcher prefix, then train.py (``kit_dir``'s) with the global batch and the
    scaled LR."""
    batch_size = args.batch_size * args.ngpus
    train = [str(kit_dir / "train.py")] if (kit_dir / "train.py").is_file() else ["-m", "train"]  # repo or installed
    command = launcher_prefix(args, env) + [sys.executable, *train]
    peeked = peek_extra(extra, args.file_values)
    command += data_flags(args, peeked.mode or "train_val", peeked)
    command += ["--dtype", args.dtype, "--kv-store", args.kv_store, "--data-backend", args.data_backend,
                "--batch-size", str(batch_size)]
    if args.num_epochs is not None:
        command += ["--num-epochs", str(args.num_epochs)]
    if args.lr is not None:  # else train.py scales the recipe's LR per 256 images by the same rule
        command += ["--lr", f"{schedules.scaled_lr(args.lr, batch_size):.10g}"]
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


def launcher_prefix(args, env=()):
    if args.kv_store != "horovod" or args.launcher == "slurm":
        return []  # one process drives every GPU, or srun has started the workers
    hosts = ["--hostfile", str(args.hostfile)] if args.hostfile else \
        ["-H", args.hosts or f"localhost:{args.ngpus}"]
    if args.launcher == "mpi":
        mpirun = shutil.which("mpirun")
        if mpirun is None:
            raise UsageError("mpirun is not installed; install Open MPI and build Horovod with MPI "
                             "(HOROVOD_WITH_MPI=1), or use --launcher horovod")
        if args.hostfile:
            hosts = ["-hostfile", str(args.hostfile)]
        # run_lock.OUTCOME_ENV and faults.FAULTS_ENV are set just before mpirun starts (main)
        exported = [x for key in mpirun_exports(env, os.environ) + [run_lock.OUTCOME_ENV, faults.FAULTS_ENV]
                    for x in ("-x", key)]
        return [mpirun, "-np", str(args.ngpus), *hosts, "-bind-to", "none", "-map-by", "slot", *exported]
    nics = ["--network-interfaces", args.network_interface] if args.network_interface else []
    if is_elastic(args):
        hosts = elastic_flags(args)
    return [horovodrun(), "-np", str(args.ngpus), *hosts, *nics, "--gloo"]


def mpirun_exports(env, environ):
    """Variables for mpirun to pass on: runner's own (env) and those of the caller's that workers read. Only
    variables that will be set: mpirun warns about each one that is not."""
    names = [key for key in env if key not in MPIRUN_ROOT_ENV]
    names += [key for key in environ if key in MPIRUN_EXPORTS or key.startswith(MPIRUN_EXPORT_PREFIXES)]
    return list(dict.fromkeys(names))


def horovodrun_path():
    """horovodrun beside this Python (a venv's bin need not be on PATH), else from PATH, else None."""
    beside = Path(sys.executable).parent / "horovodrun"
    return str(beside) if beside.is_file() else shutil.which("horovodrun")


def horovodrun():
    found = horovodrun_path()
    if found is None:
        raise UsageError("horovodrun is not installed; run `make setup` (it builds Horovod into .venv)")
    return found


def plan_launch(argv, machine, environ, kit_dir=KIT_DIR):
    """What runner runs on ``machine`` (a Machine description) for the command-line arguments ``argv``: (the
    parsed arguments, the variables it sets, the command). Looks at nothing of this machine but ``environ`` and
    the files named, so tests plan GPU machines on a CPU. Raises UsageError."""
    args, extra = parse_runner_args(argv)
    resolve_and_check(args, extra, machine)
    env = build_env(args, machine, environ, extra)
    return args, env, build_command(args, extra, env, kit_dir)


def main(argv=None, kit_dir=KIT_DIR):
    """runner: ``kit_dir`` is the folder of the train.py to start (runner's own)."""
    argv = sys.argv[1:] if argv is None else argv
    extra = get_args_parser().parse_known_args(argv)[1]  # --help and malformed flags, before the machine
    try:
        machine = detect_machine()
        args, env, command = plan_launch(argv, machine, os.environ, kit_dir)
    except UsageError as error:
        config = get_args_parser().parse_known_args(argv)[0].config
        if config and not isinstance(error, BadConfigFile):  # a typo in the file is the line to read, not the
            check_train_flags(extra + ["--config", os.path.abspath(config)], kit_dir)  # plan it led to
        fail(blame_config_file(str(error), argv))
    if machine.note:
        print(f"runner: note: {machine.note}", file=sys.stderr)
    launched = command[0] in (horovodrun_path(), shutil.which("mpirun"))
    if launched and not args.dry_run:  # first: a busy workspace's checkpoints may be half written
        refuse_busy_workspace(peek_extra(extra, args.file_values))
    # a dry run refuses what the run would, before launching: the flags and what can be known of the run
    prefix = check_train_flags(train_arguments(command), kit_dir, launch_description(args, machine))
    if args.dry_run:
        for key, value in env.items():  # shell-quoted: a pasted plan runs the same words (a discovery command)
            print(f"{key}={shlex.quote(str(value))}")
        print(shlex.join(str(part) for part in command))
        return
    if is_elastic(args):
        drop_elastic_unsafe_env(os.environ)
    os.environ.update(env)  # horovodrun and mpirun pass the environment on to every worker
    os.environ.update(console_env(args))
    if args.launcher == "slurm":
        run_srun_task(command, peek_extra(extra, args.file_values).workspace)
    if not launched:
        # The one process of --kv-store device: it is the worker, so its own exit status is the truth (0 after a
        # signal stop that saved a checkpoint).
        os.execvp(command[0], command)
    outcome = tempfile.NamedTemporaryFile(prefix="rn50-outcome-", suffix=".json", delete=False)
    outcome.close()
    os.environ[run_lock.OUTCOME_ENV] = outcome.name
    os.environ[faults.FAULTS_ENV] = fault_dir = tempfile.mkdtemp(prefix="rn50-faults-")  # faults: records
    reaper = Reaper()  # faults: no worker outlives runner
    try:
        first_failed = None
        if command[0] == horovodrun_path():
            status, failure, first_failed = run_horovodrun(command[1:])
        else:
            status, failure, first_failed = run_mpirun(command)
        reaper.finish()
        wait_for_workspace(peek_extra(extra, args.file_values).workspace)
        known = None
        if first_failed is not None and first_failed != ELASTIC_END and len(first_failed) == 3:  # mpirun's host
            first_failed, known = first_failed[:2], {"rank": first_failed[0], "host": first_failed[2]}
        summary = None
        if status not in (0, INTERRUPTED):  # the advice: resume only where a complete checkpoint exists
            resumable = has_checkpoint(prefix)
            summary = failure + (faults.RESUME if resumable else faults.RESTART) if first_failed == ELASTIC_END \
                else faults.summarize(fault_dir, first_failed, known, resumable=resumable)
        sys.exit(conclude(status, failure, run_lock.read_outcome(outcome.name), summary))
    finally:
        reaper.finish()
        os.unlink(outcome.name)
        shutil.rmtree(fault_dir, ignore_errors=True)


def refuse_busy_workspace(given):
    """A training run on a workspace another run holds is refused before any worker starts (rank 0 checks again,
    and a run without --workspace is checked there only: its default is train.py's)."""
    if (given.mode or "train_val") in ("train_val", "train") and given.workspace and not given.test_io:
        holder = run_lock.holder(given.workspace)
        if holder is not None:
            fail(run_lock.busy_message(given.workspace, holder))


def wait_for_workspace(workspace, patience_s=60.0):
    """Workers on other hosts are out of the Reaper's reach: wait (bounded) until the one holding the workspace
    lock has ended, so that the same command can be rerun at once."""
    if not workspace:
        return
    deadline = time.monotonic() + patience_s
    holder = run_lock.holder(workspace)
    if holder is not None:
        print(f"runner: note: waiting for {run_lock.describe(holder)} to end and free {workspace}", file=sys.stderr)
    while holder is not None and time.monotonic() < deadline:
        time.sleep(0.5)
        holder = run_lock.holder(workspace)
    if holder is not None:
        print(f"runner: note: {run_lock.describe(holder)} still holds {workspace}; it ends when its collectives "
              "fail or --stall-timeout passes, or stop it by hand", file=sys.stderr)


def conclude(status, failure, outcome, summary=None):
    """runner's exit status. The workers' own account wins over the launcher's status: on a signal sent to every
    process of the job, the launcher's shells die of it and report a failure while the workers saved and ended
    cleanly. A stop by SIGTERM/SIGUSR1 is 0 (requeue scripts go by run.lock); an interactive Ctrl-C is 130, as
    for any command a shell sees interrupted. ``summary``: the workers' records' account of a failure
    (faults.summarize), else ``failure``."""
    if outcome == "stopped":
        cause = "Ctrl-C" if status == INTERRUPTED else "signal"
        print(f"runner: stopped by {cause} after saving a checkpoint; rerun the same command to resume",
              file=sys.stderr)
        return INTERRUPTED if status == INTERRUPTED else 0
    if status == INTERRUPTED:
        print("runner: interrupted (Ctrl-C) before the workers had saved a checkpoint", file=sys.stderr)
        return INTERRUPTED
    if outcome == "done" or status == 0:
        return 0
    print(f"runner: error: {summary or failure}", file=sys.stderr)
    return status if status > 0 else 1


def worker_processes(mark="HOROVOD_RANK"):
    """This run's worker processes on this machine: horovodrun marks them with HOROVOD_RANK (its shells and
    ssh clients do not have it), mpirun with OMPI_COMM_WORLD_RANK."""
    import psutil  # a dependency of Horovod's launcher
    workers = []
    for process in psutil.Process().children(recursive=True):
        try:
            if mark in process.environ() and mark not in process.parent().environ():
                workers.append(process)
        except (psutil.Error, AttributeError):
            pass  # gone, or not ours to inspect
    return workers


def forward_stop_signals(forward):
    """SIGTERM and SIGUSR1 to runner ask the workers to save and stop (``forward(signum)``); returns a function
    that puts the previous handlers back."""
    previous = {sig: signal.signal(sig, lambda signum, frame: forward(signum)) for sig in (signal.SIGTERM,
                                                                                          signal.SIGUSR1)}
    return lambda: [signal.signal(sig, handler) for sig, handler in previous.items()]


def train_arguments(command):
    """The arguments train.py gets in ``command`` (runner's own flags turned into train.py's, and the user's)."""
    at = next(i for i, part in enumerate(command) if os.path.basename(str(part)) == "train.py")
    return [str(part) for part in command[at + 1:]]


def check_train_flags(extra, kit_dir=KIT_DIR, launch=None):
    """An unknown or bad train.py flag or hyper-parameter and, given ``launch`` (launch_description's), what
    train.check_before_start knows before any worker starts: train.py's one-line message, once, before any
    worker starts (and in a dry run). Returns the run's checkpoint prefix (None: it does not train)."""
    check = subprocess.run([sys.executable, "-c", "import json, sys; sys.path.insert(0, sys.argv.pop(1)); "
                            "import train; train.check_flags(sys.argv[2:], json.loads(sys.argv[1]))", str(kit_dir),
                            json.dumps(launch), *extra], stdout=subprocess.PIPE, text=True)
    lines, answer = check.stdout.splitlines(), {}
    if check.returncode == 0 and launch and lines and lines[-1].startswith('{"checkpoint_prefix"'):
        answer = json.loads(lines.pop())
    if lines:
        print("\n".join(lines))
    if check.returncode != 0:
        sys.exit(check.returncode)
    return answer.get("checkpoint_prefix")


def launch_description(args, machine):
    """What train.check_before_start needs to know of the run: its workers, those on this machine (sharing its
    memory), this machine's GPUs and whether to estimate the memory here (every worker runs here, on the CPU)."""
    workers_here = workers_per_node(args, os.environ) if args.kv_store == "horovod" else 1
    hosts = host_names(args)
    here = args.launcher != "slurm" and all(network.is_local(host) for host in hosts or ["localhost"])
    # the memory of this machine's CPU: other hosts' (and each GPU's) are estimated by their workers
    return {"workers": args.ngpus, "workers_here": workers_here, "gpus": machine.gpus,
            "memory": here and not machine.gpus}


def has_checkpoint(prefix):
    """Whether a complete checkpoint of ``prefix`` (check_train_flags') exists to resume from."""
    if not prefix:
        return False
    from rn50kit.training import checkpoint  # MXNet's import: only once a run has failed
    return checkpoint.find_latest(prefix) is not None


def console_env(args):
    """Name runner's terminal to rank 0 (RN50_CONSOLE), which then writes its progress bar and log straight to
    it: horovodrun pipes the workers' output and prefixes every line. Only when every worker runs here and both
    stdout and stderr are that terminal (`./runner | tee run.log` keeps every line in the pipe)."""
    if args.launcher == "slurm" or host_slots(args) is not None or not (sys.stdout.isatty() and sys.stderr.isatty()):
        return {}
    try:
        terminal = os.ttyname(sys.stderr.fileno())
        return {"RN50_CONSOLE": terminal} if os.ttyname(sys.stdout.fileno()) == terminal else {}
    except OSError:
        return {}


def run_horovodrun(arguments):
    """horovodrun's launcher in this process, so that a failed worker ends the run with one line (the worker's
    own message is above it) rather than the launcher's traceback. Returns (exit status, failure line).

    A SIGTERM/SIGUSR1 to runner goes on to the workers, which save at the next step boundary and exit 0.
    Horovod's own answer (terminate the workers, kill them 5 seconds later) would lose that checkpoint whenever
    a step and the save take longer, so it is kept for SIGINT (Ctrl-C) only."""
    from horovod.runner import gloo_run
    from horovod.runner import launch as horovod_launch
    from horovod.runner.common.util.timeout import TimeoutException
    build = horovod_build()
    if build is not None:  # horovodrun's own check of --gloo, answered without importing MXNet
        horovod_launch.gloo_built = lambda verbose=False: build["gloo"]
    shutdown = threading.Event()  # Horovod terminates the workers when this is set

    def interrupt(signum, frame):  # Ctrl-C: the workers save and stop as for SIGTERM; a second one: at once
        if stop.interrupted:
            shutdown.set()
        stop.interrupted = True
        stop.request()

    def register_shutdown_event():
        signal.signal(signal.SIGINT, interrupt)
        return shutdown

    stop = StopRelay()
    gloo_run.register_shutdown_event = register_shutdown_event
    drivers = record_elastic_drivers(gloo_run)
    restore = forward_stop_signals(lambda signum: stop.request())
    sys.argv = ["horovodrun", *arguments]
    driver_log, progress, level = ElasticDriverLog(), ElasticProgress(), logging.getLogger().level
    logging.getLogger().addFilter(driver_log)
    if "--min-np" in arguments:  # the elastic driver's progress (Horovod logs it at INFO to the root logger)
        logging.getLogger().addHandler(progress)
        logging.getLogger().setLevel(logging.INFO)
    try:
        horovod_launch.run_commandline()
    except RuntimeError as error:  # "Horovod detected that one or more processes exited with non-zero status"
        if driver_log.ended:
            return 1, driver_log.ended, ELASTIC_END
        codes = re.findall(r"Exit code: (-?\d+)", str(error))
        if not codes:  # horovodrun refused before starting workers (its reason per host is printed above)
            return 1, f"horovodrun: {horovodrun_refusal(error)}", None
        workers = re.findall(r"Process name: (\S+)", str(error))
        first = (int(workers[0]), int(codes[0])) if workers and workers[0].isdigit() else None  # rank, status
        return int(codes[0]), (f"worker {workers[0] if workers else '?'} exited with status {codes[0]}"
                               f"{stop.note()}; its message is above"), first
    except TimeoutException as error:  # the elastic driver's wait for the first slots (gloo_run.py)
        for driver in drivers:  # its discovery thread would go on running the script while runner ends
            driver.stop(str(error))
        return 1, f"horovodrun: {elastic_start_timeout(error)}", None
    except KeyboardInterrupt:
        return INTERRUPTED, "interrupted", None
    finally:
        stop.done.set()
        restore()
        logging.getLogger().removeFilter(driver_log)
        logging.getLogger().removeHandler(progress)
        logging.getLogger().setLevel(level)
    return (INTERRUPTED, "interrupted", None) if stop.interrupted else (0, "", None)


ELASTIC_END = "elastic"  # run_horovodrun's "first failed worker" when the elastic driver itself ended the run


class ElasticDriverLog(logging.Filter):
    """Horovod's elastic driver logs to the root logger, its stops with a traceback: its lines are kept without
    one, and ``ended`` says in one line why the driver ended the run (too few workers for too long, too many
    resets; runner adds whether to resume), or is empty (a worker's failure ended it: its own line says why)."""

    def __init__(self):
        super().__init__()
        self.ended = ""

    def filter(self, record):
        if f"{os.sep}horovod{os.sep}runner{os.sep}" not in record.pathname or record.levelno < logging.ERROR:
            return True
        message, failure = record.getMessage(), record.exc_info and record.exc_info[1]
        if type(failure).__name__ == "TimeoutException":  # waiting for --min-np slots (driver.py)
            self.ended = ("the elastic run had fewer than --min-np workers for longer than --elastic-timeout; when "
                          "enough hosts are back, ")
        elif "reset count" in message:
            self.ended = "the elastic run changed its world more often than --reset-limit allows; "
        record.exc_info = record.exc_text = None
        return True


class ElasticProgress(logging.Handler):
    """Shows the elastic driver's progress (the slots it waits for, the workers it starts, hosts it blacklists,
    resets) as ``runner: elastic: ...`` lines, and every other WARNING or worse as Python's last-resort handler
    would (this handler replaces it on the root logger)."""
    SHOWN = ("driver.py", "discovery.py", "registration.py")

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record):
        from_driver = f"{os.sep}horovod{os.sep}runner{os.sep}elastic{os.sep}" in record.pathname
        if record.levelno >= logging.WARNING:
            line = self.format(record)
        elif from_driver and os.path.basename(record.pathname) in self.SHOWN and \
                record.getMessage().startswith(("wait for", "start worker", "blacklist", "reset workers")):
            line = f"runner: elastic: {record.getMessage()}"
        else:
            return
        print(line, file=sys.stderr, flush=True)


def record_elastic_drivers(gloo_run):
    """The elastic drivers horovodrun's gloo_run creates from now on (a list that fills), so that runner can stop
    one horovodrun left running: a TimeoutException from its first wait leaves the driver's discovery thread (a
    daemon) going (horovod/runner/gloo_run.py, launch_gloo_elastic, v0.28.1)."""
    drivers, base = [], gloo_run.ElasticDriver

    class RecordedDriver(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            drivers.append(self)
    gloo_run.ElasticDriver = RecordedDriver
    return drivers


def elastic_start_timeout(error):
    """One line for the elastic driver's wait for its first --min-np slots timing out (a TimeoutException that
    horovodrun raises as it is). Without --network-interface it also waits for a second host, to find the
    interfaces the hosts share (gloo_run.py _get_min_start_hosts; runner names lo itself when every host is this
    machine)."""
    if "two hosts" in str(error):
        return ("the elastic driver waited --elastic-timeout for --min-np slots on two hosts or more (it needs a "
                "second host to find a common network interface): check the hosts, or give --network-interface "
                "IFACE (lo when every host is this machine)")
    return ("the elastic driver waited --elastic-timeout for --min-np slots: check that the hosts (-H, --hostfile "
            "or --host-discovery-script's) are up and have free slots")


def horovodrun_refusal(error):
    """One line for a horovodrun failure before any worker started, with what to do where it is known."""
    message = " ".join(str(error).split())
    if "via ssh" in message:
        return (f"{message}: each host in -H/--hostfile must accept `ssh HOST true` without a password from this "
                "machine (docs/multi-node.md), or use --launcher mpi")
    return message


class StopRelay:
    """Passes a stop request on to the workers as SIGTERM: those running now, and any that start later (a
    request during start-up would otherwise be lost). Signal handlers only set flags; a thread does the rest."""

    def __init__(self):
        self.requested = threading.Event()
        self.done = threading.Event()
        self.signalled = set()
        self.interrupted = False  # a Ctrl-C (SIGINT) asked for the stop: runner ends with status 130

    def request(self):
        if not self.requested.is_set():
            self.requested.set()
            threading.Thread(target=self._relay, daemon=True).start()

    def _relay(self):
        while not self.done.is_set():
            for worker in worker_processes():
                if worker.pid not in self.signalled:
                    try:
                        worker.send_signal(signal.SIGTERM)
                        self.signalled.add(worker.pid)
                    except Exception:  # gone meanwhile
                        pass
            self.done.wait(1.0)

    def note(self):
        return " after a stop signal, before the workers had saved a checkpoint" if self.requested.is_set() else ""


class Reaper:
    """Keeps track of the run's workers on this machine (a thread looks every half second) and, once the launcher
    is done, ends any it left behind (a worker stopped by SIGSTOP, or stuck in the kernel, outlives horovodrun's
    teardown) and waits until they are gone: their workspace lock goes with them, so the same command can be
    rerun at once."""

    def __init__(self):
        self.seen = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self):
        while not self.done.is_set():
            for mark in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK"):
                for worker in worker_processes(mark):
                    self.seen.setdefault(worker.pid, worker)
            self.done.wait(0.5)

    def finish(self, patience_s=10.0):
        """End the workers still running (SIGKILL, after ``patience_s`` for the launcher's own teardown); returns
        their pids."""
        import psutil
        if self.done.is_set():
            return []
        self.done.set()
        self.thread.join()
        alive = [p for p in self.seen.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        alive = psutil.wait_procs(alive, timeout=patience_s)[1] if alive else []
        for process in alive:
            try:
                process.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=patience_s)
        if alive:
            print(f"runner: note: ended {len(alive)} worker(s) the launcher left running (pid "
                  f"{', '.join(str(p.pid) for p in alive)})", file=sys.stderr)
        return [p.pid for p in alive]


# Open MPI's own diagnosis of the first worker to die of a signal (its stderr, before it ends the others), naming
# its host as -H does (the worker's own host name may differ: a short name, an alias)
MPIRUN_SIGNALLED = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")


def relay_stderr(stream, found):
    """Copy mpirun's stderr to ours line by line, noting in ``found`` (a list) the (rank, 128 + signal, host) of
    the first worker it says died of a signal."""
    for line in stream:
        sys.stderr.write(line)
        sys.stderr.flush()
        match = MPIRUN_SIGNALLED.search(line)
        if match and not found:
            found.append((int(match[1]), 128 + int(match[3]), match[2]))


def run_mpirun(command):
    """mpirun as a child: (status, failure, (rank, status, host) of the first worker that died of a signal, or
    None).
    A SIGTERM/SIGUSR1 to runner goes on as SIGUSR1, which Open MPI's mpirun forwards to every process and then
    waits for them (a SIGTERM makes it kill the job a second later)."""
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, errors="replace", bufsize=1)
    found = []
    relay = threading.Thread(target=relay_stderr, args=(process.stderr, found), daemon=True)
    relay.start()
    restore = forward_stop_signals(lambda signum: process.send_signal(signal.SIGUSR1))
    try:
        status = process.wait()
    except KeyboardInterrupt:  # mpirun got the Ctrl-C too (same terminal) and forwards it to the workers
        process.wait()
        return INTERRUPTED, "interrupted", None
    finally:
        restore()
        # mpirun's own lines are read by now; a worker it left behind (stopped) may hold the pipe open until the
        # Reaper ends it, so the relay goes on as a daemon after this wait
        relay.join(timeout=5)
    return status, f"mpirun exited with status {status}; the workers' messages are above", \
        (found[0] if found else None)


# --- under srun ------------------------------------------------------------------------------------------------

# A task whose worker ended only because the collectives failed (another rank is the cause) leaves the step's
# report this long to that rank's task.
TEARDOWN_GRACE_S = 3.0


def run_srun_task(command, workspace):
    """One srun task (--launcher slurm): its worker as a child, then exit as the worker did (0 after a stop that
    saved a checkpoint; killed by the same signal), so srun and the batch system see what they saw of the worker.

    Nothing oversees an srun step's workers, and when one dies srun ends the others at once (Slurm's PMIx plugin
    cancels the step when a worker leaves without MPI_Finalize): staying alive as their parent, each task's
    runner sees its own worker's end, and the first task to see a failure reads every worker's record
    (faults.step_directory, shared by the step's tasks) and prints the one line naming the rank, its host and the
    cause, before srun's own lines about the tasks."""
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    folder = faults.step_directory(workspace)
    try:
        os.makedirs(folder, exist_ok=True)
        if rank == 0:
            faults.remove_stale_steps(folder)
        os.environ[faults.FAULTS_ENV] = folder
    except OSError:  # the worker runs without a record (a read-only workspace is train.py's to report)
        folder = None
    # Slurm signals every process of a task, the worker too: a Ctrl-C on srun must not reach it twice (a second
    # one stops at once, unsaved). A SIGTERM/SIGUSR1 sent to this task's process alone goes on to the worker.
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    worker = subprocess.Popen(command)
    restore = forward_stop_signals(lambda signum: worker.send_signal(signum))
    status = worker.wait()
    # srun ends the step's tasks as soon as one worker fails: its SIGTERM waits until the line is out and the
    # records removed (Slurm's KillWait, 30 s by default, before SIGKILL), then ends this task as before.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    restore()
    if status != 0 and folder is not None:
        report_step_failure(folder, rank, status, worker.pid)
    elif folder is not None:
        faults.leave_step(folder, rank)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    if status < 0:  # killed by a signal: end the same way
        if -status in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):  # this process's handlers: the default back
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    sys.exit(status if status >= 0 else 128 - status)


def report_step_failure(folder, rank, status, pid):
    """The step's one line on a failure, printed by the first task to see one: the task of the worker that died
    (a signal) or recorded the cause (its error, or the stall its watchdog saw); a task whose worker only saw the
    collectives fail waits a little for that one's line first."""
    own = faults.read_all(folder).get(rank, {})
    if status > 0 and own.get("kind") not in ("error", "stall"):
        deadline = time.monotonic() + TEARDOWN_GRACE_S
        while not faults.reported(folder) and time.monotonic() < deadline:
            time.sleep(0.1)
    if not faults.claim_report(folder):
        return
    summary = faults.summarize(folder, (rank, status if status > 0 else 128 - status),
                               known={"rank": rank, "host": socket.gethostname(), "pid": pid},
                               ended="srun ends the step's other tasks")
    print(f"runner: error: {summary}", file=sys.stderr, flush=True)
    faults.remove_step(folder)
