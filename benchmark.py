"""Throughput sweep: runs `runner` for every GPU count and batch size and gathers images/s and latencies.

    python benchmark.py -n 1,4,8 -b 64,128,192,208 -i 100 -e 2 -w 1 -o report.json
    python benchmark.py -n 1 --only-inference -e 3 -w 1

Each configuration runs `runner -n N -b B --benchmark-iters I -e E --mode M --no-metrics --report FILE ...`;
its per-epoch images/s after the warmup epochs are combined by the harmonic mean (the rate of the whole
measured run), its latencies by the mean. Every flag benchmark.py does not know goes through to runner
(and from there to train.py). A configuration that fails or times out is recorded with its reason and the
sweep goes on. Writes the JSON (-o), a PNG chart beside it and Markdown tables on stdout.
"""
import argparse
import importlib.machinery
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict, deque
from pathlib import Path

HERE = Path(__file__).resolve().parent
LATENCIES = ["latency_avg", "latency_50", "latency_90", "latency_95", "latency_99", "latency_100"]
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
    """Run under the kit's .venv (MXNet for train.py --help, matplotlib for the chart) when started by another
    Python."""
    venv_python = HERE / ".venv" / "bin" / "python"
    if venv_python.is_file() and Path(sys.prefix).resolve() != (HERE / ".venv").resolve():
        os.execv(str(venv_python), [str(venv_python), str(Path(__file__).resolve())] + sys.argv[1:])


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
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--executable", default=str(HERE / "runner"), help="the launcher to sweep")
    parser.add_argument("-o", "--output", default="benchmark.json", help="JSON result (the chart goes beside it)")
    parser.add_argument("-n", "--ngpus", type=int_list, default=[1], help="worker counts, e.g. 1,4,8")
    parser.add_argument("-b", "--batch-sizes", type=int_list, default=None,
                        help="batch sizes per worker (default: the original kit's list for the mode and dtype)")
    parser.add_argument("-i", "--benchmark-iters", type=int, default=100, help="iterations per epoch")
    parser.add_argument("-e", "--epochs", type=int, default=1, help="epochs per configuration")
    parser.add_argument("-w", "--warmup", type=int, default=0, help="first epochs left out of the results")
    parser.add_argument("--num-examples", type=int, default=None,
                        help="samples per epoch (default: iterations x global batch)")
    parser.add_argument("--mode", default="train_val", choices=["train_val", "train", "val"], help="what to time")
    parser.add_argument("--only-inference", action="store_true", help="the same as --mode val")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per configuration (default: none)")
    parser.add_argument("--baseline", default=None,
                        help="an earlier benchmark JSON (e.g. float32) to compute the speed-up against")
    parser.add_argument("--dry-run", action="store_true", help="print the runner commands, run nothing")
    return parser


def peek_dtype(passthrough):
    """The --dtype going to runner, or None for runner's machine-dependent default."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--dtype")
    return parser.parse_known_args(passthrough)[0].dtype


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


def runner_command(args, ngpus, batch_size, report, workspace, passthrough, flags):
    command = [args.executable, "-n", str(ngpus), "-b", str(batch_size), "-e", str(args.epochs),
               "--mode", args.mode, "--report", str(report)]
    if flags is None or "--benchmark-iters" in flags:
        command += ["--benchmark-iters", str(args.benchmark_iters)]
    if flags is None or "--no-metrics" in flags:
        command += ["--no-metrics"]
    if "--workspace" not in passthrough:
        command += ["--workspace", str(workspace)]
    # An epoch of exactly -i iterations for the synthetic and DALI readers, even without --benchmark-iters.
    command += ["--num-examples", str(args.num_examples or args.benchmark_iters * batch_size * ngpus)]
    return command + passthrough


def load_runner(path):
    """The runner script as a module, to reuse its own parser and checks (it has no .py suffix)."""
    loader = importlib.machinery.SourceFileLoader("kit_runner", str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("kit_runner", loader))
    loader.exec_module(module)
    return module


def no_data_reason(executable, mode, passthrough):
    """Why runner would find no records for ``mode`` at its data root, or None; only for our own runner and
    when no --data-backend is chosen."""
    if Path(executable).resolve() != (HERE / "runner").resolve() or "--data-backend" in passthrough:
        return None
    runner = load_runner(executable)
    args, extra = runner.get_args_parser().parse_known_args(passthrough + ["--mode", mode])
    args.data_backend = None
    try:
        runner.check_data_root(args, runner.peek_extra(extra))
    except runner.UsageError as problem:
        return str(problem)
    return None


def check_upfront(command):
    """Ask runner (--dry-run: no launch, no MXNet on CPU machines) whether it accepts the configuration."""
    result = subprocess.run(command + ["--dry-run"], capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        return last_error(result.stderr.splitlines()) or f"runner exited with {result.returncode}"
    return None


def last_error(lines):
    """The line that best says why a run failed: the first error line (the root cause, before the
    shutdown errors it sets off in the other workers), else the last line."""
    lines = [re.sub(r"^\[\d+\]<std(err|out)>:", "", line).strip() for line in lines]
    lines = [line for line in lines if line]
    for line in lines:
        if re.search(r"(^|\w)(Error|error):", line) and not line.startswith("Exception ignored"):
            return line
    return lines[-1] if lines else ""


def run_one(command, timeout):
    """Run a configuration, echoing its output to stderr; return None or the reason it failed."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)  # its own process group: a timeout ends all workers
    tail = deque(maxlen=400)

    def pump():
        for line in process.stdout:
            sys.stderr.write(line)
            tail.append(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        reader.join(timeout=5)
        return f"timed out after {timeout:g} s"
    reader.join(timeout=5)
    if code != 0:
        return f"exit code {code}: {last_error(tail)}"
    return None


# --- results -------------------------------------------------------------------------------------------------

def harmonic_mean(values):
    return len(values) / sum(1.0 / v for v in values)


def metric_keys(mode):
    modes = {"train_val": ["train", "val"], "train": ["train"], "val": ["val"]}[mode]
    return [f"{m}.{k}" for m in modes for k in ["total_ips"] + LATENCIES]


def summarize(report, keys, epochs, warmup):
    """One number per metric: harmonic mean of images/s, mean of latencies, over the epochs after warmup."""
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
    return cell


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


def markdown_table(title, rows, columns, values, row_name, fmt):
    lines = [f"### {title}", "", f"| {row_name} | " + " | ".join(str(c) for c in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for r in rows:
        cells = []
        for c in columns:
            value = values.get(str(r), {}).get(str(c))
            cells.append(fmt(value) if isinstance(value, (int, float)) else "-")
        lines.append(f"| {r} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def tables(result):
    ngpus, bss, ips_key = result["ngpus"], result["bs"], result["metric_keys"][0]
    metrics = result["metrics"]
    ips = {n: {bs: cell.get(ips_key) for bs, cell in row.items()} for n, row in metrics.items()}
    dtype = result.get("dtype") or "default dtype"
    out = [markdown_table(f"{ips_key} (images/s, {dtype}): workers x batch size per worker", ngpus, bss, ips,
                          "workers", lambda v: f"{v:.1f}")]
    if len(ngpus) > 1 and result.get("weak_scaling"):
        out.append(markdown_table("Weak scaling: ips(n) / ips(1)", ngpus, bss, result["weak_scaling"],
                                  "workers", lambda v: f"{v:.2f}"))
    if result.get("speedup"):
        out.append(markdown_table(f"Speed-up of {dtype} over the baseline", ngpus, bss, result["speedup"],
                                  "workers", lambda v: f"{v:.2f}"))
    mode = ips_key.split(".")[0]
    for n in ngpus:
        rows = {str(bs): {k: metrics.get(str(n), {}).get(str(bs), {}).get(f"{mode}.{k}") for k in LATENCIES}
                for bs in bss}
        rows = {bs: {k: v * 1000 for k, v in row.items() if v is not None} for bs, row in rows.items()}
        if any(rows.values()):
            out.append(markdown_table(f"{mode} latency per iteration (ms), {n} worker(s)", bss, LATENCIES,
                                      rows, "batch size", lambda v: f"{v:.2f}"))
    failed = [f"- n={f['ngpus']} bs={f['bs']}: {f['reason']}" for f in result["failed"]]
    if failed:
        out.append("### Failed configurations\n\n" + "\n".join(failed) + "\n")
    return "\n".join(out)


def plot(result, path):
    """images/s per batch size, one line per worker count; skipped with a note without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("benchmark: note: matplotlib is not installed, no chart", file=sys.stderr)
        return None
    ips_key = result["metric_keys"][0]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for n in result["ngpus"]:
        row = result["metrics"].get(str(n), {})
        points = [(bs, row[str(bs)][ips_key]) for bs in result["bs"] if ips_key in row.get(str(bs), {})]
        if points:
            ax.plot(*zip(*points), marker="o", label=f"{n} worker(s)")
    ax.set_xlabel("batch size per worker")
    ax.set_ylabel("images/s")
    ax.set_title(f"{result['model']} {ips_key} ({result.get('dtype') or 'default dtype'})")
    ax.grid(True, alpha=0.3)
    if ax.lines:
        ax.legend()
    fig.tight_layout()
    tmp = f"{path}.tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def save_json(result, path):
    """Atomically, after every configuration: an interrupted sweep keeps what it measured."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=4)
    os.replace(tmp, path)


def error(message):
    print(f"benchmark: error: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv=None):
    args, passthrough = get_args_parser().parse_known_args(argv)
    if args.only_inference:
        args.mode = "val"
    if args.benchmark_iters < 1 or args.epochs < 1:
        error("-i and -e must be at least 1")
    if not 0 <= args.warmup < args.epochs:
        error(f"-w {args.warmup} must leave at least one of the -e {args.epochs} epochs to measure")
    if args.timeout is not None and args.timeout <= 0:
        error(f"--timeout must be positive, got {args.timeout:g}")
    if not Path(args.executable).is_file():
        error(f"{args.executable} does not exist")
    dtype = peek_dtype(passthrough)
    if dtype == "int8" and args.mode != "val":
        error("--dtype int8 benchmarks inference only: add --only-inference")
    if args.batch_sizes is None:
        args.batch_sizes = DEFAULT_BATCH_SIZES[("val" if args.mode == "val" else "train", dtype or "float32")]
    baseline = None
    if args.baseline:
        try:
            with open(args.baseline) as f:
                baseline = json.load(f)
        except (OSError, ValueError) as problem:
            error(f"--baseline {args.baseline} cannot be read: {problem}")
    output = Path(args.output).resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    keys = metric_keys(args.mode)
    result = OrderedDict(model="", ngpus=args.ngpus, bs=args.batch_sizes, dtype=dtype, mode=args.mode,
                         metric_keys=keys, metrics=OrderedDict(), weak_scaling=OrderedDict(), failed=[])
    flags = None if args.dry_run else train_flags(args.executable)
    if flags is not None:
        missing = [f for f in ("--benchmark-iters", "--no-metrics") if f not in flags]
        if missing:
            print(f"benchmark: note: train.py has no {', '.join(missing)}; epochs are capped by --num-examples",
                  file=sys.stderr)
    missing = no_data_reason(args.executable, args.mode, passthrough)
    if missing:  # a throughput sweep still means something on synthetic data: the compute alone
        print(f"benchmark: note: {missing.split(';')[0]}: benchmarking on --data-backend synthetic "
              "(give --data-root, or --data-backend, to choose)", file=sys.stderr)
        passthrough = passthrough + ["--data-backend", "synthetic"]
        result["data_backend"] = "synthetic"
    configs = [(n, bs) for n in args.ngpus for bs in args.batch_sizes]
    with tempfile.TemporaryDirectory(prefix="benchmark-", dir=output.parent) as scratch:
        commands = {}
        for n, bs in configs:
            report = output.parent / f"{output.stem}-{n},{bs}.json"  # the original's per-run report names
            commands[n, bs] = (runner_command(args, n, bs, report, Path(scratch) / f"run-{n},{bs}", passthrough,
                                              flags), report)
        if args.dry_run:
            for command, _ in commands.values():
                print(" ".join(command))
            return 0

        def record_failure(n, bs, reason):
            result["metrics"].setdefault(str(n), OrderedDict())[str(bs)] = {"failed": reason}
            result["failed"].append(OrderedDict(ngpus=n, bs=bs, reason=reason))

        # Say up front what cannot run here (too many workers, float16 without a GPU, ...): no minutes lost.
        runnable = []
        for n, bs in configs:
            reason = check_upfront(commands[n, bs][0])
            if reason:
                print(f"benchmark: skipping n={n} bs={bs}: {reason}", file=sys.stderr)
                record_failure(n, bs, reason)
            else:
                runnable.append((n, bs))
        start = time.time()
        for done, (n, bs) in enumerate(runnable):
            elapsed = time.time() - start
            eta = f", ETA {elapsed / done * (len(runnable) - done):.0f} s" if done else ""
            print(f"benchmark: [{done + 1}/{len(runnable)}] n={n} bs={bs}{eta}", file=sys.stderr, flush=True)
            command, report_path = commands[n, bs]
            reason = run_one(command, args.timeout)
            if reason is None:
                try:
                    with open(report_path) as f:
                        report = json.load(f)
                    cell = summarize(report, keys, args.epochs, args.warmup)
                    result["model"] = result["model"] or report.get("model", "")
                    result["metrics"].setdefault(str(n), OrderedDict())[str(bs)] = cell
                    print(f"benchmark: n={n} bs={bs}: {keys[0]} {cell[keys[0]]:.1f} images/s",
                          file=sys.stderr, flush=True)
                except (OSError, ValueError, KeyError) as problem:
                    reason = f"bad report: {problem}"
            if reason is not None:
                print(f"benchmark: n={n} bs={bs} failed: {reason}", file=sys.stderr, flush=True)
                record_failure(n, bs, reason)
            result["weak_scaling"] = weak_scaling(result["metrics"], keys[0])
            save_json(result, output)
    if baseline is not None:
        result["speedup"] = speedup(result["metrics"], baseline, keys[0])
    save_json(result, output)
    print(tables(result))
    chart = plot(result, output.with_suffix(".png"))
    print(f"benchmark: results in {output}" + (f", chart {chart}" if chart else ""), file=sys.stderr)
    return 1 if len(result["failed"]) == len(configs) else 0


if __name__ == "__main__":
    reexec_in_venv()
    sys.exit(main())
