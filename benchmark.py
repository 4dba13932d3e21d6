"""Throughput sweep: runs `runner` for every GPU count and batch size and gathers images/s and latencies.

    python benchmark.py -n 1,4,8 -b 64,128,192,208 -i 100 -e 2 -w 1 -o report.json
    python benchmark.py -n 1,4,8 --only-inference                  # fresh weights, or --load CKPT.params
    python benchmark.py -n 1 --only-inference --data-root DIR --repeat 3

Each configuration runs `runner -n N -b B --benchmark-iters W+I --untimed-iters W -e E --mode M --no-metrics
--report FILE ...`: every epoch runs W untimed warmup iterations (--untimed-iters, 20), then I timed ones, in every
mode and data backend (a validation set shorter than that is cycled). Each run's report says after how many of
those W its step time was steady (the median of 3 iterations' times within 5 % of the 3 before;
rn50kit/common/steady.py). A run that was not steady by their end is not kept: the configuration runs again with
twice as many, up to --max-untimed-iters (160); the sweep prints how many it took, or that the figure is NOT a
steady state's.
Its per-epoch images/s after the -w warmup epochs are combined by the harmonic mean (the rate of the whole
measured run), its latencies by the mean; with --repeat R each configuration runs R times (in interleaved rounds)
and the median is reported with the min and max. Every flag
benchmark.py does not know goes through to runner (and from there to train.py). A configuration that fails or
times out is recorded with its reason and the sweep goes on. Writes the JSON (-o) with what a reader needs to
trust the numbers (machine, library versions, dtype, layout, data, weights, commands), a PNG chart beside it
and Markdown tables on stdout.
"""
import argparse
import json
import os
import shlex
import signal
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

from rn50kit.common import supported

if __name__ == "__main__":
    supported.require_supported_python("benchmark")  # before the imports a Python it refuses could fail on

from rn50kit.benchmarking.chart import plot  # noqa: E402
from rn50kit.benchmarking.machine import library_versions, machine_info  # noqa: E402
from rn50kit.benchmarking.results import WARMUP_ITERS, metric_keys, weights_used  # noqa: E402
from rn50kit.benchmarking.runs import iterations_per_epoch, no_data_reason, train_flags  # noqa: E402
from rn50kit.benchmarking.sweep import (  # noqa: E402
    Sweep,
    command_builder,
    compare_with_baseline,
    dry_run,
    runner_commands,
    save_json,
)
from rn50kit.benchmarking.tables import tables  # noqa: E402
from rn50kit.common import rules, steady  # noqa: E402
from rn50kit.common.helptext import HelpFormatter  # noqa: E402
from rn50kit.config import cli  # noqa: E402

HERE = Path(__file__).resolve().parent
# The most untimed iterations a configuration is given (doubled from --untimed-iters while not steady).
MAX_UNTIMED_ITERS = 160
# The original kit's sweeps (examples/BENCHMARK_*.sh, INFER_BENCHMARK_*.sh), per GPU.
DEFAULT_BATCH_SIZES = {
    ("train", "float16"): [64, 128, 192, 208],
    ("train", "float32"): [32, 64, 96],
    ("train", "bfloat16"): [32, 64, 96],
    ("val", "float16"): [1, 2, 4, 64, 128, 192, 208],
    ("val", "float32"): [1, 2, 4, 32, 64, 96],
    ("val", "bfloat16"): [1, 2, 4, 32, 64, 96],
    ("val", "int8"): [1, 2, 4, 32, 64, 96],  # INT8 (oneDNN, CPU) scores only
}


def reexec_in_venv():
    """Run under the Python runner would pick (MXNet for train.py --help, matplotlib for the chart): $RN50_PYTHON,
    else this one when it has MXNet (e.g. .venv-gpu's), else the kit's .venv; the runs it starts get the same."""
    cli.rerun_under_chosen_python(Path(__file__).resolve(), "benchmark.py", HERE)
    os.environ[cli.PYTHON_VARIABLE] = sys.executable  # runner, started by its #! line, runs under this one too


def int_list(text):
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, got {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False,
                                     formatter_class=HelpFormatter,
                                     epilog="Every other flag goes to runner for each configuration (--dtype, "
                                            "--data-root, --data-backend, --num-layers, --image-shape, ... : see "
                                            "./runner --help and python train.py --help).")
    parser.add_argument("--executable", default=str(HERE / "runner"), help="the launcher to sweep")
    parser.add_argument("-o", "--output", default="benchmark.json", help="JSON result (the chart goes beside it)")
    parser.add_argument("-n", "--ngpus", type=int_list, default=[1], help="worker counts, e.g. 1,4,8")
    parser.add_argument("-b", "--batch-sizes", type=int_list, default=None,
                        help="batch sizes per worker (default: the original kit's list for the mode and dtype)")
    parser.add_argument("-i", "--benchmark-iters", type=int, default=100,
                        help="timed iterations per epoch, after --untimed-iters untimed warmup iterations")
    parser.add_argument("--untimed-iters", type=int, default=WARMUP_ITERS,
                        help="untimed warmup iterations at the start of each epoch, at first; a configuration whose "
                             "step time was not steady by their end runs again with twice as many")
    parser.add_argument("--max-untimed-iters", type=int, default=MAX_UNTIMED_ITERS,
                        help="the most untimed iterations a configuration is given; a run still not steady then "
                             "is kept, said to be NOT a steady state's figure")
    parser.add_argument("-e", "--epochs", type=int, default=1, help="epochs per configuration")
    parser.add_argument("-w", "--warmup", type=int, default=0, help="first epochs left out of the results")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs per configuration; the tables show the median and the min-max spread")
    parser.add_argument("--num-examples", type=int, default=None,
                        help="training samples per epoch (default: (warmup + timed iterations) x global batch)")
    parser.add_argument("--mode", default="train_val", choices=["train_val", "train", "val"], help="what to time")
    parser.add_argument("--only-inference", action="store_true", help="the same as --mode val")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per run (default: none)")
    parser.add_argument("--baseline", default=None,
                        help="an earlier benchmark JSON (e.g. float32) to compute the speed-up against")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the runner commands, run nothing (configurations runner refuses are named; "
                             "status 1 when none would run)")
    return parser


def peek_flags(passthrough):
    """The runner/train.py flags benchmark.py needs to know about, as the user gave them (None: not given)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in ("--dtype", "--load", "--workspace", "--resume", "--data-backend", "--data-root", "--hostfile",
                 "--launcher"):
        parser.add_argument(flag)
    parser.add_argument("-H", "--hosts")
    return parser.parse_known_args(passthrough)[0]


def cpu_refuses(given):
    """Why this machine's CPU cannot run the --dtype given (train.py's own check), or None. Runs on other hosts
    (-H, --hostfile, --launcher slurm) are left to their workers."""
    if given.dtype != "bfloat16" or given.hosts or given.hostfile or given.launcher == "slurm":
        return None
    return rules.bfloat16_problem(given.dtype)


def peek_dtype(passthrough):
    """The --dtype going to runner, or None for runner's machine-dependent default."""
    return peek_flags(passthrough).dtype


def error(message):
    cli.fail("benchmark", message)


def check_args(args, given):
    """Refuse bad input before anything runs; fill in the default batch sizes."""
    if args.benchmark_iters < 1 or args.epochs < 1:
        error("-i and -e must be at least 1")
    if not (args.untimed_iters == 0 or steady.WINDOW * 2 <= args.untimed_iters <= args.max_untimed_iters):
        error(f"--untimed-iters {args.untimed_iters}: give 0 (none), or from {steady.WINDOW * 2} (the iterations "
              f"steadiness is judged over) to --max-untimed-iters {args.max_untimed_iters}")
    if args.repeat < 1:
        error(f"--repeat must be at least 1, got {args.repeat}")
    if not 0 <= args.warmup < args.epochs:
        error(f"-w {args.warmup} must leave at least one of the -e {args.epochs} epochs to measure")
    if args.timeout is not None and args.timeout <= 0:
        error(f"--timeout must be positive, got {args.timeout:g}")
    if not Path(args.executable).is_file():
        error(f"{args.executable} does not exist")
    if given.load is not None and not Path(given.load).is_file():
        error(f"--load {given.load} does not exist; give the .params file of a checkpoint, or leave --load out "
              "to time fresh weights")
    if given.load is not None and args.mode != "val":
        error(f"--load scores a checkpoint: it needs --only-inference (--mode val), not --mode {args.mode}")
    if given.dtype == "int8" and args.mode != "val":
        error("--dtype int8 benchmarks inference only: add --only-inference")
    refused = cpu_refuses(given)
    if refused:  # one line now, not a failed run per configuration
        error(refused)
    if args.batch_sizes is None:
        mode = "val" if args.mode == "val" else "train"
        args.batch_sizes = DEFAULT_BATCH_SIZES.get((mode, given.dtype or "float32"),
                                                   DEFAULT_BATCH_SIZES[mode, "float32"])
    if args.num_examples is not None and args.mode != "val":
        short = [(n, bs) for n in args.ngpus for bs in args.batch_sizes
                 if -(-args.num_examples // (n * bs)) < iterations_per_epoch(args.benchmark_iters, args.untimed_iters)]
        if short:
            n, bs = short[0]
            error(f"--num-examples {args.num_examples} gives fewer than the {args.untimed_iters} + "
                  f"{args.benchmark_iters} iterations an epoch needs (e.g. n={n} bs={bs}); leave it out or raise it")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, or a SIGTERM (``signum``): the sweep ends, the finished runs' results kept."""

    def __init__(self, signum=signal.SIGINT):
        super().__init__(signum)
        self.status = 128 + signum


def raise_interrupted(signum, frame):
    raise Interrupted(signum)


def read_baseline(path):
    """--baseline's earlier result, or None without it."""
    if not path:
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as problem:
        error(f"--baseline {path} cannot be read: {problem}")


def new_result(args, dtype, keys, argv):
    """The sweep's JSON before any run: dtype, layout, data and weights are filled in from what runner resolves and
    what the runs report."""
    return OrderedDict(model="", image_shape=None, ngpus=args.ngpus, bs=args.batch_sizes, dtype=dtype, mode=args.mode,
                       layout=None, data_backend=None, real_data=None, data=None, kv_store=None, weights=None,
                       metric_keys=keys, timed_iters=args.benchmark_iters, warmup_iters=args.untimed_iters,
                       max_untimed_iters=args.max_untimed_iters,
                       epochs=args.epochs, warmup_epochs=args.warmup, repeat=args.repeat,
                       benchmark_command=shlex.join([sys.executable, str(Path(__file__).resolve())] +
                                                    list(sys.argv[1:] if argv is None else argv)),
                       date=time.strftime("%Y-%m-%dT%H:%M:%S%z"), machine=machine_info(),
                       versions=library_versions(),
                       metrics=OrderedDict((str(n), OrderedDict()) for n in args.ngpus),
                       weak_scaling=OrderedDict(), failed=[], runs=OrderedDict())


def note_missing_train_flags(flags):
    """An older train.py without --benchmark-iters or --no-metrics: its epochs are capped by --num-examples."""
    if flags is None:
        return
    missing = [f for f in ("--benchmark-iters", "--no-metrics") if f not in flags]
    if missing:
        print(f"benchmark: note: train.py has no {', '.join(missing)}; epochs are capped by --num-examples",
              file=sys.stderr)


def with_data_backend(args, passthrough):
    """``passthrough``, with --data-backend synthetic when no data was given: a throughput sweep still means
    something on synthetic data, the compute alone."""
    missing = no_data_reason(args.executable, args.mode, passthrough)
    if not missing:
        return passthrough
    print(f"benchmark: note: {missing.split(';')[0]}: benchmarking on --data-backend synthetic "
          "(give --data-root, or --data-backend, to choose)", file=sys.stderr)
    return passthrough + ["--data-backend", "synthetic"]


def main(argv=None):
    signal.signal(signal.SIGTERM, raise_interrupted)  # clean up as for Ctrl-C
    args, passthrough = get_args_parser().parse_known_args(argv)
    if args.only_inference:
        args.mode = "val"
    given = peek_flags(passthrough)
    check_args(args, given)
    baseline = read_baseline(args.baseline)
    output = Path(args.output).resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    keys = metric_keys(args.mode)
    result = new_result(args, given.dtype, keys, argv)
    flags = None if args.dry_run else train_flags(args.executable)
    note_missing_train_flags(flags)
    passthrough = with_data_backend(args, passthrough)
    configs = [(n, bs) for n in args.ngpus for bs in args.batch_sizes]
    with tempfile.TemporaryDirectory(prefix="benchmark-", dir=output.parent) as scratch:
        build = command_builder(args, output, scratch, passthrough, flags)
        commands = runner_commands(args, configs, build)
        if args.dry_run:
            return dry_run(args, configs, commands)
        sweep = Sweep(args, keys, given.load, result, output, build, flags is None or "--untimed-iters" in flags)
        if not sweep.can_raise_untimed and args.untimed_iters != WARMUP_ITERS:
            error(f"{args.executable}'s train.py has no --untimed-iters: it leaves out its first {WARMUP_ITERS} "
                  f"iterations, so --untimed-iters {args.untimed_iters} cannot be given")
        interrupted = sweep.run_all(sweep.plan(configs, commands), commands)
        if interrupted is not None:
            return interrupted
    result["weights"] = weights_used(args.mode, given.load, sweep.scored)
    if baseline is not None:
        compare_with_baseline(result, baseline, keys[0], args.baseline)
    save_json(result, output)
    print(tables(result))
    chart = plot(result, output.with_suffix(".png"))  # None, saying why, when nothing succeeded
    print(f"benchmark: results in {output}" + (f", chart {chart}" if chart else ""), file=sys.stderr)
    return 1 if len(result["failed"]) == len(configs) else 0


if __name__ == "__main__":
    reexec_in_venv()
    try:
        sys.exit(main())
    except KeyboardInterrupt as interrupt:  # before or between the runs: nothing of a run to clean up
        print("benchmark: interrupted", file=sys.stderr)
        sys.exit(getattr(interrupt, "status", 130))
