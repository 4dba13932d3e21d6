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
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict, deque
from pathlib import Path

from rn50kit.common import supported

if __name__ == "__main__":
    supported.require_supported_python("benchmark")  # before the imports a Python it refuses could fail on

from rn50kit.common import backends  # noqa: E402
from rn50kit.common import cli  # noqa: E402
from rn50kit.launch import devices
from rn50kit.common.helptext import HelpFormatter
from rn50kit.launch import launcher
from rn50kit.common import rules
from rn50kit.common import steady
from rn50kit.reporting.report import write_json

HERE = Path(__file__).resolve().parent
LATENCIES = ["latency_avg", "latency_50", "latency_90", "latency_95", "latency_99", "latency_100"]
# Untimed iterations at the start of every epoch (train.py --untimed-iters: graph building, caches), at first;
# doubled, up to MAX_UNTIMED_ITERS, while a run's step time was not steady by their end.
WARMUP_ITERS = 20
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


# --- running one configuration -------------------------------------------------------------------------------

def train_flags(executable):
    """The flags train.py accepts, read from its --help, so a train.py without one of the benchmark
    flags still gets a working sweep (the iteration cap then comes from --num-examples alone)."""
    train = Path(executable).resolve().parent / "train.py"
    if not train.is_file():
        return None
    try:
        text = subprocess.run([sys.executable, str(train), "--help"], capture_output=True, text=True,
                              timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {word.strip(",[]") for word in text.split() if word.startswith("--")}


def iterations_per_epoch(timed_iters, untimed_iters=WARMUP_ITERS):
    return untimed_iters + timed_iters


def runner_command(args, ngpus, batch_size, report, workspace, passthrough, flags, untimed=None):
    """The runner command of one run, with ``untimed`` warmup iterations per epoch (default: --untimed-iters)."""
    untimed = args.untimed_iters if untimed is None else untimed
    iters = iterations_per_epoch(args.benchmark_iters, untimed)
    command = [args.executable, "-n", str(ngpus), "-b", str(batch_size), "-e", str(args.epochs),
               "--mode", args.mode, "--report", str(report)]
    if flags is None or "--benchmark-iters" in flags:
        command += ["--benchmark-iters", str(iters)]
    if flags is None or "--untimed-iters" in flags:
        command += ["--untimed-iters", str(untimed)]
    if flags is None or "--no-metrics" in flags:
        command += ["--no-metrics"]
    if "--workspace" not in passthrough:
        command += ["--workspace", str(workspace)]
    if args.mode != "val" and "--resume" not in passthrough and (flags is None or "--resume" in flags):
        command += ["--resume", "none"]  # a checkpoint in a given --workspace must not shorten the run
    # An epoch of exactly W+I training iterations for every reader, even without --benchmark-iters.
    command += ["--num-examples", str(args.num_examples or iters * batch_size * ngpus)]
    return command + passthrough


def no_data_reason(executable, mode, passthrough):
    """Why runner would find no records for ``mode`` at its data root, or None; only for our own runner and
    when no --data-backend is chosen."""
    if Path(executable).resolve() != (HERE / "runner").resolve() or "--data-backend" in passthrough:
        return None
    args, extra = launcher.get_args_parser().parse_known_args(passthrough + ["--mode", mode])
    args.data_backend = None
    try:
        launcher.check_data_root(args, launcher.peek_extra(extra))
    except cli.UsageError as problem:
        return str(problem)
    return None


def check_upfront(command):
    """Ask runner (--dry-run: no launch, no MXNet on CPU machines) whether it accepts the configuration.
    Returns (None, what runner would run) or (the reason it refuses, None)."""
    result = subprocess.run(command + ["--dry-run"], capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        return last_error(result.stderr.splitlines()) or f"runner exited with {result.returncode}", None
    return None, result.stdout


def launch_plan(dry_run_output):
    """runner --dry-run's output (VAR=value lines, then the command) as {"env": {...}, "command": "..."}."""
    lines = [line for line in dry_run_output.splitlines() if line.strip()]
    env = OrderedDict(line.split("=", 1) for line in lines[:-1] if re.match(r"^\w+=", line))
    return OrderedDict(env=env, command=lines[-1] if lines else "")


def run_settings(train_command):
    """What a run really uses, read from the train.py command runner builds (its defaults filled in; the
    last occurrence of a flag wins, as in train.py)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag, default in (("--dtype", "float32"), ("--data-backend", "dali-gpu"), ("--input-layout", "NCHW"),
                          ("--conv-layout", "NCHW"), ("--data-train", None), ("--data-val", None),
                          ("--load", None), ("--kv-store", "horovod"), ("--image-shape", "3,224,224")):
        parser.add_argument(flag, default=default)
    found = parser.parse_known_args(train_command.split())[0]
    # a float16 run (GPUs) gets train.py's NHWC defaults where no layout flag is typed (devices.py)
    typed = {word.split("=")[0][2:].replace("-", "_") for word in train_command.split() if word.startswith("--")}
    gpu_defaults = devices.float16_gpu_defaults(found.dtype, found.dtype == "float16", found.data_backend, typed,
                                                [3, 224, 224])
    return OrderedDict(dtype=found.dtype, data_backend=found.data_backend,
                       layout=OrderedDict(input=gpu_defaults.get("input_layout", found.input_layout),
                                          conv=gpu_defaults.get("conv_layout", found.conv_layout)),
                       real_data=backends.reads_records(found.data_backend),
                       data=None if not backends.reads_records(found.data_backend) else
                       OrderedDict((k, v) for k, v in (("train", found.data_train), ("val", found.data_val)) if v),
                       kv_store=found.kv_store, load=found.load, image_shape=scored_shape(found, typed))


def scored_shape(found, typed):
    """The image shape the runs use: --image-shape where typed, else a --load checkpoint's own (train.py takes
    it from the checkpoint's state), else train.py's default."""
    if found.load and "image_shape" not in typed:
        from rn50kit.config import settings  # imports MXNet: only for benchmarks of a checkpoint
        state = settings.trained_settings(found.load) or {}
        saved = (state.get("args") or {}).get("image_shape")
        if saved:
            return ",".join(str(v) for v in saved)
    return found.image_shape


def last_error(lines):
    """The line that best says why a run failed: the first error line (the root cause, before the
    shutdown errors it sets off in the other workers), else the last line."""
    lines = [re.sub(r"^\[\d+\]<std(err|out)>:", "", line).strip() for line in lines]
    lines = [line for line in lines if line]
    for line in lines:
        if re.search(r"(^|\w)(Error|error):", line) and not line.startswith("Exception ignored"):
            return line
    return lines[-1] if lines else ""


def end_process_group(process):
    """SIGTERM the run's process group (runner, the launcher, every worker), SIGKILL after 30 s. runner relays the
    SIGTERM to workers that are still starting up too, but only while it lives: the grace period covers a slow start
    (a worker importing MXNet on a loaded machine) and a checkpoint save."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def run_one(command, timeout):
    """Run a configuration, echoing its output to stderr; return None or the reason it failed."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)  # its own process group: a timeout ends all workers
    tail = deque(maxlen=400)
    interrupted = threading.Event()  # after a Ctrl-C the run's own farewell ("rerun to resume") is not shown

    def pump():
        for line in process.stdout:
            if not interrupted.is_set():
                sys.stderr.write(line)
            tail.append(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        end_process_group(process)
        reader.join(timeout=5)
        return f"timed out after {timeout:g} s"
    except BaseException:  # Ctrl-C or SIGTERM: the run's own session would not get the signal and outlive us
        interrupted.set()
        end_process_group(process)
        reader.join(timeout=5)
        raise
    reader.join(timeout=5)
    if code != 0:
        return f"exit code {code}: {last_error(tail)}"
    return None


# --- what the numbers were measured on -----------------------------------------------------------------------

def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_models():
    """[name, memory, driver] per NVIDIA GPU the driver reports (nvidia-smi), or []."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [[part.strip() for part in line.split(",")] for line in out.splitlines() if line.strip()]


def machine_info():
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return OrderedDict(host=platform.node(), os=platform.platform(), cpu=cpu_model(), cpu_cores_usable=cores,
                       cpu_count=os.cpu_count(), gpus=gpu_models(), python=platform.python_version())


def library_versions():
    """Installed distributions of MXNet, DALI and Horovod (any build: mxnet-cu112, nvidia-dali-cuda120...),
    read from their metadata, without importing them."""
    from importlib import metadata
    wanted = {"mxnet": "mxnet", "dali": "nvidia-dali", "horovod": "horovod"}
    found = OrderedDict((key, None) for key in wanted)
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        for key, prefix in wanted.items():
            if name == prefix or name.startswith(prefix + "-"):
                found[key] = f"{name} {dist.version}"
    return found


# --- results -------------------------------------------------------------------------------------------------

def harmonic_mean(values):
    return len(values) / sum(1.0 / v for v in values)


def metric_keys(mode):
    modes = {"train_val": ["train", "val"], "train": ["train"], "val": ["val"]}[mode]
    return [f"{m}.{k}" for m in modes for k in ["total_ips"] + LATENCIES]


def summarize(report, keys, epochs, warmup, timed_iters=None):
    """One number per metric: harmonic mean of images/s, mean of latencies, over the epochs after warmup.
    With ``timed_iters``, every measured epoch must have timed exactly that many iterations."""
    metrics = report.get("metrics", {})
    cell = OrderedDict()
    for key in keys:
        values = metrics.get(key)
        if values is None:
            continue
        if len(values) != epochs:
            raise ValueError(f"{key} has {len(values)} epochs in the report, expected {epochs}")
        values = values[warmup:]
        if key.endswith("total_ips"):
            if min(values) <= 0:
                raise ValueError(f"{key} is not positive: {values}")
            cell[key] = harmonic_mean(values)
        else:
            cell[key] = sum(values) / len(values)
    ips_key = keys[0]
    if ips_key not in cell:
        raise ValueError(f"the report has no {ips_key}")
    for mode in sorted({key.split(".")[0] for key in cell}):
        counts = metrics.get(f"{mode}.timed_iters")
        if counts is None:
            continue  # a report from before timed_iters
        counts = counts[warmup:]
        if timed_iters is not None and any(count != timed_iters for count in counts):
            raise ValueError(f"{mode} timed {counts} iterations per epoch, expected {timed_iters}")
        cell[f"{mode}.timed_iters"] = min(counts)
    for mode in sorted({key.split(".")[0] for key in cell}):
        if f"{mode}.steady_after" in metrics:  # the latest of the measured epochs; None: one never was
            after = metrics[f"{mode}.steady_after"][warmup:]
            cell[f"{mode}.steady_after"] = None if None in after else max(after)
    return cell


def combine_runs(cells):
    """Repeated runs of one configuration: the median of each metric; with more than one run also its
    [min, max] spread and every run's value."""
    combined = OrderedDict()
    keys = [key for key in cells[0] if isinstance(cells[0][key], (int, float)) and
            not key.endswith(("steady_after", "untimed_iters"))]
    for key in (key for key in cells[0] if key.endswith("steady_after")):  # the slowest run to settle
        after = [cell.get(key) for cell in cells]
        combined[key] = None if None in after else max(after)
    if "untimed_iters" in cells[0]:
        combined["untimed_iters"] = max(cell["untimed_iters"] for cell in cells)
    for key in keys:
        values = [cell[key] for cell in cells]
        combined[key] = min(values) if key.endswith("timed_iters") else statistics.median(values)
    combined["runs"] = len(cells)
    if len(cells) > 1:
        combined["spread"] = OrderedDict((key, [min(c[key] for c in cells), max(c[key] for c in cells)])
                                         for key in keys if not key.endswith("timed_iters"))
        combined["repeats"] = OrderedDict((key, [c[key] for c in cells])
                                          for key in keys if not key.endswith("timed_iters"))
    return combined


def weak_scaling(metrics, ips_key):
    """ips(n) / ips(1) per batch size, where the single-worker run exists."""
    scaling = OrderedDict()
    for n, row in metrics.items():
        for bs, cell in row.items():
            base = metrics.get("1", {}).get(bs, {}).get(ips_key)
            if base and ips_key in cell:
                scaling.setdefault(n, OrderedDict())[bs] = cell[ips_key] / base
    return scaling


def speedup(metrics, baseline, ips_key):
    """ips / baseline ips per cell present in both (e.g. bfloat16 or float16 against float32)."""
    result = OrderedDict()
    for n, row in metrics.items():
        for bs, cell in row.items():
            base = baseline.get("metrics", {}).get(n, {}).get(bs, {}).get(ips_key)
            if base and ips_key in cell:
                result.setdefault(n, OrderedDict())[bs] = cell[ips_key] / base
    return result


def baseline_problems(result, baseline):
    """Why a speed-up against ``baseline`` may compare other things than precision: another network, image shape
    or mode (another dtype is the usual purpose, and named in the table's title), or no configuration in common."""
    problems = []
    for key, what in (("model", "network"), ("image_shape", "image shape"), ("mode", "mode")):
        ours, theirs = result.get(key), baseline.get(key)
        if ours and theirs and str(ours) != str(theirs):
            problems.append(f"the baseline's {what} is {theirs}, this sweep's {ours}")
    common = [(n, bs) for n, row in result["metrics"].items() for bs in row
              if bs in baseline.get("metrics", {}).get(n, {})]
    if not common:
        problems.append("the baseline has none of this sweep's worker counts and batch sizes: no speed-up to show")
    return problems


def markdown_table(title, rows, columns, values, row_name, fmt):
    """Numbers are formatted with ``fmt``; strings are taken as they are; anything else is '-'."""
    lines = [f"### {title}", "", f"| {row_name} | " + " | ".join(str(c) for c in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for r in rows:
        cells = []
        for c in columns:
            value = values.get(str(r), {}).get(str(c))
            cells.append(fmt(value) if isinstance(value, (int, float)) else value if isinstance(value, str) else "-")
        lines.append(f"| {r} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def with_spread(cell, key, fmt, scale=1.0):
    """'median (min-max)' for a repeated configuration, the plain number otherwise, None when absent."""
    if key not in cell:
        return None
    text = fmt(cell[key] * scale)
    spread = cell.get("spread", {}).get(key)
    if spread:
        text += f" ({fmt(spread[0] * scale)}-{fmt(spread[1] * scale)})"
    return text


def model_title(result):
    """The network and its input, e.g. 'resnet50_v1.5, 3x224x224'."""
    shape = result.get("image_shape")
    return (result.get("model") or "model") + (f", {shape.replace(',', 'x')}" if shape else "")


def describe(result):
    """One line: what was measured, on what, with which weights."""
    data = f"real data ({result.get('data_backend')})" if result.get("real_data") else "synthetic data"
    parts = [result.get("dtype") or "default dtype", data]
    layout = result.get("layout")
    if layout:
        parts.append(f"{layout['input']} input")
    if result.get("weights"):
        parts.append("fresh weights" if result["weights"] == "fresh" else f"weights {result['weights']}")
    repeat = result.get("repeat", 1)
    parts.append(f"{result.get('timed_iters')} timed iterations per epoch")
    if repeat > 1:
        parts.append(f"median of {repeat} runs (min-max)")
    return ", ".join(parts)


def latency_tables(result, mode):
    """One table per worker count: batch sizes x latency statistics of ``mode``, in ms."""
    out = []
    for n in result["ngpus"]:
        row = result["metrics"].get(str(n), {})
        rows = {str(bs): {k: with_spread(row.get(str(bs), {}), f"{mode}.{k}", lambda v: f"{v:.2f}", 1000)
                          for k in LATENCIES} for bs in result["bs"]}
        if any(value for r in rows.values() for value in r.values()):
            out.append(markdown_table(f"{mode} latency per iteration (ms), {n} worker(s)", result["bs"], LATENCIES,
                                      rows, "batch size", lambda v: f"{v:.2f}"))
    return out


def tables(result):
    ngpus, bss, ips_key = result["ngpus"], result["bs"], result["metric_keys"][0]
    metrics = result["metrics"]
    dtype = result.get("dtype") or "default dtype"
    out = [f"{model_title(result)}: {describe(result)}\n"]
    modes = [key.split(".")[0] for key in result["metric_keys"] if key.endswith("total_ips")]
    for mode in modes:  # train_val: training first, then validation
        ips = {n: {bs: with_spread(cell, f"{mode}.total_ips", lambda v: f"{v:.1f}") for bs, cell in row.items()}
               for n, row in metrics.items()}
        out.append(markdown_table(f"{mode}.total_ips (images/s, {dtype}): workers x batch size per worker", ngpus,
                                  bss, ips, "workers", lambda v: f"{v:.1f}"))
    if len(ngpus) > 1 and result.get("weak_scaling"):
        out.append(markdown_table(f"Weak scaling of {ips_key}: ips(n) / ips(1)", ngpus, bss,
                                  result["weak_scaling"], "workers", lambda v: f"{v:.2f}"))
    if result.get("speedup"):
        against = result.get("speedup_against") or {}
        base = ", ".join(str(against[k]) for k in ("model", "image_shape", "dtype", "mode") if against.get(k))
        out.append(markdown_table(f"Speed-up of {dtype} over the baseline{f' ({base})' if base else ''} "
                                  f"({ips_key})", ngpus, bss, result["speedup"], "workers", lambda v: f"{v:.2f}"))
    for problem in result.get("speedup_warnings") or ():
        out.append(f"Warning about the baseline: {problem}\n")
    for mode in modes:
        out += latency_tables(result, mode)
    failed = [f"- n={f['ngpus']} bs={f['bs']}: {f['reason']}" for f in result["failed"]]
    for n, row in metrics.items():
        for bs, cell in row.items():
            failed += [f"- n={n} bs={bs}, one of {cell['runs'] + len(cell['failed_runs'])} runs: {reason}"
                       for reason in cell.get("failed_runs", [])]
    warmups = warmup_lines(result, modes)
    if warmups:
        out.append("### Warm-up: after how many of each epoch's untimed iterations the step time was steady (the "
                   "slowest run)\n\n" + "\n".join(warmups) + "\n")
    if failed:
        out.append("### Failed configurations\n\n" + "\n".join(failed) + "\n")
    return "\n".join(out)


def describe_steady(after, untimed=WARMUP_ITERS):
    """'steady after 7 of 20 untimed iterations' or 'NOT steady within the 160 untimed iterations: ...'."""
    if after is None:
        return f"NOT steady within the {untimed} untimed iterations: not a steady state's figure"
    return f"steady after {after:.0f} of {untimed} untimed iterations"


def warmup_lines(result, modes):
    """A line per configuration and mode whose runs' reports say when their step time was steady."""
    lines = []
    for n, row in result["metrics"].items():
        for bs, cell in row.items():
            untimed = cell.get("untimed_iters", result.get("warmup_iters", WARMUP_ITERS))
            lines += [f"- n={n} bs={bs} {mode}: {describe_steady(cell[f'{mode}.steady_after'], untimed)}"
                      for mode in modes if f"{mode}.steady_after" in cell]
    return lines


def plot(result, path):
    """images/s per batch size, one line per worker count (error bars: min-max of repeated runs); None, with
    the reason on stderr, when there is nothing to draw or no matplotlib."""
    ips_key = result["metric_keys"][0]
    lines = []
    for n in result["ngpus"]:
        row = result["metrics"].get(str(n), {})
        points = [(bs, row[str(bs)]) for bs in result["bs"] if ips_key in row.get(str(bs), {})]
        if points:
            lines.append((n, points))
    if not lines:
        print("benchmark: no chart: no configuration succeeded", file=sys.stderr)
        if Path(path).exists():  # an older sweep's chart beside this JSON would contradict it
            os.remove(path)
        return None
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("benchmark: note: matplotlib is not installed, no chart", file=sys.stderr)
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for n, points in lines:
        xs = [bs for bs, _ in points]
        ys = [cell[ips_key] for _, cell in points]
        spreads = [cell.get("spread", {}).get(ips_key, [cell[ips_key]] * 2) for _, cell in points]
        errors = [[y - lo for y, (lo, _) in zip(ys, spreads)], [hi - y for y, (_, hi) in zip(ys, spreads)]]
        ax.errorbar(xs, ys, yerr=errors if result.get("repeat", 1) > 1 else None, marker="o", capsize=3,
                    label=f"{n} worker(s)")
    ax.set_xlabel("batch size per worker")
    ax.set_ylabel("images/s")
    ax.set_title(f"{model_title(result)} {ips_key}\n{describe(result)}", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = f"{path}.tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def save_json(result, path):
    """Atomically, after every configuration: an interrupted sweep keeps what it measured."""
    write_json(path, result)


def error(message):
    cli.fail("benchmark", message)


def report_name(output, n, bs, run, repeat):
    """The original's per-run report names, <out>-<n>,<bs>.json; -runK added when runs repeat."""
    return output.parent / (f"{output.stem}-{n},{bs}" + (f"-run{run + 1}" if repeat > 1 else "") + ".json")


def read_run(report_path, keys, args):
    """(the run's summary cell, the weights it scored) from its report; ValueError/OSError/KeyError if bad."""
    with open(report_path) as f:
        report = json.load(f)
    cell = summarize(report, keys, args.epochs, args.warmup, args.benchmark_iters)
    cell["untimed_iters"] = report.get("untimed_iters", WARMUP_ITERS)  # a train.py without --untimed-iters: 20
    return cell, report.get("weights"), report.get("model", "")


def weights_used(mode, given_load, scored):
    """'fresh' or the .params path; training runs start from fresh weights (--resume none)."""
    if mode != "val":
        return "fresh"
    if scored:
        return scored[0] if len(set(scored)) == 1 else "mixed: " + ", ".join(sorted(set(scored)))
    return os.path.abspath(given_load) if given_load else "fresh"


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


def command_builder(args, output, scratch, passthrough, flags):
    """build(n, bs, run, untimed=None) -> (runner's command, the report it writes) for one run."""
    def build(n, bs, run, untimed=None):
        report = report_name(output, n, bs, run, args.repeat)
        workspace = Path(scratch) / (f"run-{n},{bs}-{run}" + (f"-untimed{untimed}" if untimed is not None else ""))
        return runner_command(args, n, bs, report, workspace, passthrough, flags, untimed), report
    return build


def runner_commands(args, configs, build):
    """{(n, bs, run): (runner's command, the report it writes)} for every configuration and repeat, with
    --untimed-iters warmup iterations."""
    return {(n, bs, run): build(n, bs, run) for n, bs in configs for run in range(args.repeat)}


def next_untimed(args, n, bs, untimed):
    """The untimed iterations to run a configuration with after a run not steady within ``untimed``: twice as
    many, at most --max-untimed-iters and what a given --num-examples holds; None when no more can be given."""
    most = args.max_untimed_iters
    if args.num_examples is not None and args.mode != "val":
        most = min(most, args.num_examples // (n * bs) - args.benchmark_iters)
    more = min(max(2 * untimed, untimed + 1), most)
    return more if more > untimed else None


def not_steady(report_path, keys, args):
    """Whether a run's report says its step time was not steady by the end of its untimed iterations."""
    try:
        cell = read_run(report_path, keys, args)[0]
    except (OSError, ValueError, KeyError):
        return False  # a bad report is recorded as such
    return any(cell[key] is None for key in cell if key.endswith("steady_after"))


def dry_run(args, configs, commands):
    """--dry-run: what the sweep would run, and what it would skip (runner's own checks, as the run); status 1
    when nothing would run."""
    runnable = 0
    for n, bs in configs:
        reason, _ = check_upfront(commands[n, bs, 0][0])
        if reason:
            print(f"benchmark: would skip n={n} bs={bs}: {reason}", file=sys.stderr)
            continue
        runnable += 1
        for run in range(args.repeat):
            print(shlex.join(commands[n, bs, run][0]))
    return 0 if runnable else 1


class Sweep:
    """The runs of a sweep and their results as they come: each configuration's cells (a run that reported), its
    failures and the weights scored, written to the JSON (-o) after every run."""

    def __init__(self, args, keys, given_load, result, output, build, can_raise_untimed=True):
        self.args, self.keys, self.given_load, self.result, self.output = args, keys, given_load, result, output
        self.build, self.can_raise_untimed = build, can_raise_untimed  # whether the runs take --untimed-iters
        self.cells, self.failures, self.scored = {}, {}, []
        self.untimed = {}  # (n, bs): the untimed iterations its runs need, once one was not steady

    def record_failure(self, n, bs, reason):
        self.result["metrics"].setdefault(str(n), OrderedDict())[str(bs)] = {"failed": reason}
        self.result["failed"].append(OrderedDict(ngpus=n, bs=bs, reason=reason))

    def plan(self, configs, commands):
        """The configurations that can run here; the others (too many workers, float16 without a GPU, ...) are
        said and recorded up front: no minutes lost. Records each one's runner commands and launch plan."""
        runnable = []
        for n, bs in configs:
            reason, plan = check_upfront(commands[n, bs, 0][0])
            if reason:
                print(f"benchmark: skipping n={n} bs={bs}: {reason}", file=sys.stderr)
                self.record_failure(n, bs, reason)
                continue
            runnable.append((n, bs))
            plan = launch_plan(plan)
            self.result["runs"].setdefault(str(n), OrderedDict())[str(bs)] = OrderedDict(
                runner=[shlex.join(commands[n, bs, run][0]) for run in range(self.args.repeat)], **plan)
            if len(runnable) == 1:  # what runner resolved (machine defaults included) is the same for all
                settings = run_settings(plan["command"])
                self.result.update((key, settings[key]) for key in
                                   ("dtype", "layout", "data_backend", "real_data", "data", "kv_store", "image_shape"))
        return runnable

    def run_all(self, runnable, commands):
        """Every run, in interleaved rounds, with progress and ETA; the exit status if interrupted, else None."""
        todo = [(n, bs, run) for run in range(self.args.repeat) for n, bs in runnable]
        start = time.time()
        for done, (n, bs, run) in enumerate(todo):
            elapsed = time.time() - start
            eta = f", ETA {elapsed / done * (len(todo) - done):.0f} s" if done else ""
            which = f" run {run + 1}/{self.args.repeat}" if self.args.repeat > 1 else ""
            print(f"benchmark: [{done + 1}/{len(todo)}] n={n} bs={bs}{which}{eta}", file=sys.stderr, flush=True)
            try:
                self.run_until_steady(n, bs, run, which, commands[n, bs, run])
            except KeyboardInterrupt as stop:
                finished = sum(len(c) for c in self.cells.values())
                kept = f"; the {finished} finished run(s) are in {self.output}" if finished else ""
                print(f"benchmark: interrupted during n={n} bs={bs}{which}{kept}", file=sys.stderr, flush=True)
                return getattr(stop, "status", 130)
        return None

    def run_until_steady(self, n, bs, run, which, planned):
        """One run of a configuration (``planned``: its command and report with --untimed-iters); again with
        more untimed iterations (next_untimed) while its report says the step time was not steady by their end,
        and for its later runs too. Records the run kept."""
        command, report_path = planned
        untimed = self.untimed.get((n, bs), self.args.untimed_iters)
        earlier = None  # (untimed, its report set aside, its command): the last run not steady
        while True:
            if untimed != self.args.untimed_iters:
                command, report_path = self.build(n, bs, run, untimed)
            try:
                reason = run_one(command, self.timeout(untimed))
            except KeyboardInterrupt:  # the interrupted run's report (a partial epoch) is not a result
                report_path.unlink(missing_ok=True)
                raise
            if reason is not None and earlier is not None:  # a figure not steady beats none
                print(f"benchmark: n={n} bs={bs}{which}: the run with {untimed} untimed iterations failed ({reason}); "
                      f"keeping the one with {earlier[0]}", file=sys.stderr, flush=True)
                (untimed, aside, command), reason = earlier, None
                os.replace(aside, report_path)
                break
            more = next_untimed(self.args, n, bs, untimed) if self.can_raise_untimed and reason is None else None
            if more is None or not not_steady(report_path, self.keys, self.args):
                break
            print(f"benchmark: n={n} bs={bs}{which}: the step time was not steady within {untimed} untimed "
                  f"iterations; running it again with {more}", file=sys.stderr, flush=True)
            earlier = (untimed, report_path.with_name(f"{report_path.stem}.untimed-{untimed}.json"), command)
            os.replace(report_path, earlier[1])
            untimed = self.untimed[n, bs] = more
        if earlier is not None:
            Path(earlier[1]).unlink(missing_ok=True)
        self.result["runs"][str(n)][str(bs)]["runner"][run] = shlex.join(command)
        self.record_run(n, bs, run, which, reason, report_path)

    def timeout(self, untimed):
        """--timeout for a run with ``untimed`` iterations: stretched by its share of the first runs' iterations."""
        if self.args.timeout is None:
            return None
        first = self.args.untimed_iters + self.args.benchmark_iters
        return self.args.timeout * max(1.0, (untimed + self.args.benchmark_iters) / first)

    def read_report(self, n, bs, which, report_path):
        """The run's report into its configuration's cells; why it is bad, or None."""
        try:
            cell, weights, model = read_run(report_path, self.keys, self.args)
            self.result["model"] = self.result["model"] or model
            self.cells.setdefault((n, bs), []).append(cell)
            if weights:
                self.scored.append(weights)
            scored_note = f" ({'fresh weights' if weights == 'fresh' else weights})" if weights else ""
            mode = self.keys[0].split(".")[0]
            if f"{mode}.steady_after" in cell:
                scored_note += f"; {describe_steady(cell[f'{mode}.steady_after'], cell['untimed_iters'])}"
            print(f"benchmark: n={n} bs={bs}{which}: {self.keys[0]} {cell[self.keys[0]]:.1f} images/s{scored_note}",
                  file=sys.stderr, flush=True)
        except (OSError, ValueError, KeyError) as problem:
            return f"bad report: {problem}"
        return None

    def record_run(self, n, bs, run, which, reason, report_path):
        """One run's outcome (``reason`` it failed, or None) into the result, saved at once."""
        if reason is None:
            reason = self.read_report(n, bs, which, report_path)
        if reason is not None:
            print(f"benchmark: n={n} bs={bs}{which} failed: {reason}", file=sys.stderr, flush=True)
            self.failures.setdefault((n, bs), []).append(reason)
        result = self.result
        if (n, bs) in self.cells:
            combined = combine_runs(self.cells[n, bs])
            if self.failures.get((n, bs)):
                combined["failed_runs"] = self.failures[n, bs]
            result["metrics"].setdefault(str(n), OrderedDict())[str(bs)] = combined
        elif run + 1 == self.args.repeat:
            self.record_failure(n, bs, self.failures[n, bs][0])
        result["weights"] = weights_used(self.args.mode, self.given_load, self.scored)
        result["weak_scaling"] = weak_scaling(result["metrics"], self.keys[0])
        save_json(result, self.output)


def compare_with_baseline(result, baseline, ips_key, baseline_path):
    """--baseline: the speedup per configuration, what it is against, and warnings where the two differ."""
    result["speedup"] = speedup(result["metrics"], baseline, ips_key)
    result["speedup_against"] = OrderedDict((k, baseline.get(k)) for k in ("model", "image_shape", "dtype", "mode"))
    result["speedup_warnings"] = baseline_problems(result, baseline)
    for problem in result["speedup_warnings"]:
        print(f"benchmark: warning: --baseline {baseline_path}: {problem}", file=sys.stderr)


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
