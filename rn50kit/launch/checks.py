"""runner's checks before anything starts: the machine-dependent defaults filled in, then what cannot run here
refused in one line (the numbers, the launcher, an elastic run, the network interface, the rules of a run, the
workers against the machine or the host list, the data root, a busy workspace)."""
import os

from rn50kit.common import backends, rules, supported
from rn50kit.config import cli
from rn50kit.config.cli import PREPARE_HINT, UsageError
from rn50kit.launch import arguments, horovod_build, hosts, network
from rn50kit.launch.launchers import elastic
from rn50kit.reliability import run_lock

CPU_BATCH_PER_WORKER = 32  # -b without a GPU: a batch a CPU holds (ResNet-50 at 224 px in about 5 GiB)


def resolve_and_check(args, extra, machine, launcher):
    """Fill the machine-dependent defaults and refuse what cannot run here, before anything is started
    (``launcher``: the launchers.Launcher of --launcher)."""
    if args.ngpus < 1:
        raise UsageError(f"-n (--ngpus) must be at least 1, got {args.ngpus}")
    if args.batch_size is not None and args.batch_size < 1:
        raise UsageError(f"-b must be at least 1, got {args.batch_size}")
    if args.lr is not None and args.lr < 0:
        raise UsageError(f"-l must not be negative, got {args.lr}")
    check_launcher(args, launcher)
    elastic.check_elastic(args, launcher)
    choose_network_interface(args)
    if args.batch_size is None and "batch_size" in args.file_values:
        args.batch_size = arguments.batch_from_file(args)
    gpu = machine.gpus > 0
    why = f" ({machine.note})" if machine.note else ""
    if args.dtype is None:
        args.dtype = "float16" if gpu else "float32"
    if args.data_backend is None:
        args.data_backend = backends.default(gpu)
    if args.batch_size is None:
        args.batch_size = 192 if gpu else CPU_BATCH_PER_WORKER
    peeked = arguments.peek_extra(extra, args.file_values)
    problem = rules.run_problem(args.dtype, args.data_backend, peeked.mode or "train_val",
                                peeked.fuse_bn_relu == "1", gpu, why, peeked.conv_layout, peeked.gpus,
                                getattr(machine, "nvidia_fused", False))
    if problem:
        raise UsageError(problem)
    check_workers(args, machine, launcher, why)
    check_data_root(args, peeked)


def check_launcher(args, launcher):
    """Any Horovod must load with MXNet (a container's own Horovod may have been built without it), and the
    launcher must be able to start this run."""
    if args.kv_store != "horovod":
        return
    problem = supported.horovod_problem(horovod_build.horovod_build())
    if problem:
        raise UsageError(problem)
    launcher.check(args, os.environ)


def check_workers(args, machine, launcher, why):
    """The workers against the host list's slots, or against this machine's GPUs or cores (where runner places
    them: not srun, not a discovery script)."""
    slots = hosts.host_slots(args)
    if slots is not None:
        slots = sum(slots)
        if args.ngpus > slots:
            raise UsageError(f"-n {args.ngpus} is more than the {slots} slots in the host list")
        if args.kv_store != "horovod":
            raise UsageError(f"--kv-store {args.kv_store} runs one process on one machine; "
                             "use --kv-store horovod with -H/--hostfile")
        return
    if launcher.places_workers or args.host_discovery_script:
        return
    gpu = machine.gpus > 0
    if gpu and args.ngpus > machine.gpus:
        raise UsageError(f"-n {args.ngpus} is more than the {machine.gpus} GPU(s) on this machine; "
                         f"use -n {machine.gpus} or fewer, or -H host1:N,host2:N for several machines")
    if not gpu and args.ngpus > machine.cores:
        raise UsageError(f"-n {args.ngpus} worker processes is more than the {machine.cores} CPU cores of "
                         f"this machine, which has no GPU{why}; use -n {machine.cores} or fewer")
    if not gpu and args.kv_store != "horovod" and args.ngpus > 1:
        raise UsageError(f"--kv-store {args.kv_store} runs one process, which drives GPUs; "
                         f"on a machine without GPUs use --kv-store horovod for -n {args.ngpus}")


def choose_network_interface(args):
    """A named --network-interface must exist here; an elastic run over -H/--hostfile without one gets the
    loopback when every host is this machine (network.py: horovodrun's driver would wait --elastic-timeout for
    a second host to find one), or a refusal when it cannot be found."""
    if args.network_interface:
        problem = network.missing_interface(args.network_interface)
        if problem:
            raise UsageError(problem)
    elif elastic.is_elastic(args) and args.host_discovery_script:  # the hosts it reports now; more may come later
        found = network.discovered_hosts(args.host_discovery_script)
        if found and all(network.is_local(host) for host in found):
            args.network_interface = network.loopback_interface()
    elif elastic.is_elastic(args):
        names = hosts.host_names(args) or ["localhost"]
        try:
            args.network_interface = network.elastic_interface(names)
        except ValueError as error:
            raise UsageError(str(error))


def check_data_root(args, given):
    """The files the mode needs (the backend's row names them: backends.RootLayout) must be in --data-root, unless
    given to train.py directly (``given``: arguments.peek_extra's)."""
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


def refuse_busy_workspace(given):
    """A training run on a workspace another run holds is refused before any worker starts (rank 0 checks again,
    and a run without --workspace is checked there only: its default is train.py's). Returns the line, or None."""
    if (given.mode or "train_val") in ("train_val", "train") and given.workspace and not given.test_io:
        holder = run_lock.holder(given.workspace)
        if holder is not None:
            return run_lock.busy_message(given.workspace, holder)
    return None
