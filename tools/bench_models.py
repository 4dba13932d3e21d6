"""Benchmark (not a test): our ResNet-50 v1.5 beside PyTorch's on this CPU, each in its own process.

Ours (MXNet 1.9.1, oneDNN): float32 and bfloat16 (MXNet AMP) training steps (forward, backward, SGD update) and
inference with the graph scoring uses (oneDNN's conv+BN+ReLU fusion; bfloat16: cast by AMP, then fused), plus
INT8 inference (quantize.py's oneDNN graph, naive calibration). PyTorch: the same network in channels_last,
float32 and torch.autocast("cpu", dtype=torch.bfloat16), training step and inference. Every variant runs in
interleaved rounds (one batch group of each in turn, again and again), so load from other processes hits them
alike; the median of the rounds is kept and the ratios ours/PyTorch are printed. Before the first round each
variant is warmed up until its step time is steady (rn50kit/common/steady.py: the median of its last 3 step times
within --settle-tolerance of the 3 before, at least --warmup and at most --max-warmup steps), and how many steps
that took, or that it never settled, is printed and written to --json: a fixed count is not enough (PyTorch's
float32 training step still sped up by a quarter after its first step). Each worker also measures the
practical ceiling of its precision (a large matrix product through the same library), at the start and again in
every round, and every figure is given as a fraction of the best of them (ResNet-50 at 224 px: 8.2 GFLOP per
image forward, 24.5 per training image).

The bfloat16 worker builds on any CPU (AMP, its graph, the operands cast to bfloat16; the `built:` lines say what
each worker computes in); only oneDNN's bfloat16 kernels need AVX-512: without them it is reported as not
measured, with the reason. Where they run, the bfloat16 inference graph's logits are checked against float32's
(same weights and image); that graph is built in the float32 worker, without amp.init, as train.py builds it.

PyTorch is optional and never a dependency of the kit: give its interpreter with --torch-python, e.g.

    python3.11 -m venv .venv-torch && .venv-torch/bin/pip install torch numpy
    .venv/bin/python tools/bench_models.py --torch-python .venv-torch/bin/python --rounds 5

Where a training step's time goes (a ratio free of PyTorch's noise): one more float32 worker (and bfloat16 where
the CPU has its kernels) runs a few steps with oneDNN's verbose log on, and the time of every oneDNN kernel it
ran is summed by kind (convolution and inner product: the matrix products; reorders between layouts; batch
normalization; eltwise; pooling; sum; ...). Against the wall time of those steps in that process, what is not a
matrix product is overhead, and so is the time outside oneDNN (the optimizer update and MXNet's own operators, Python,
the engine). `--no-breakdown` skips it; `--fuse-bn-relu` trains with MXNet's fused BatchNorm+ReLU (train.py's
`--fuse-bn-relu 1`), which runs the ReLUs that follow a BatchNorm inside it.

Separate processes, because two OpenMP runtimes in one process distort both; each with one OpenMP thread per physical
core (worker_env). Timings on a shared machine are
noisy: compare the ratios of one run, not figures across runs.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for folder in (ROOT, HERE):  # the repository's MXNet-free modules and the workers', in the PyTorch worker's venv
    if folder not in sys.path:  # too (a Python started with -I leaves out the script's folder)
        sys.path.insert(0, folder)
from model_workers.breakdown import breakdown_worker, kernel_times, print_breakdown, step_breakdown  # noqa: E402
from model_workers.serve import worker  # noqa: E402
from model_workers.timing import CEILING_SIZE  # noqa: E402

from rn50kit.common import steady  # noqa: E402

GFLOP_PER_IMAGE = {"inference": 8.2, "training": 24.5}  # ResNet-50 (v1 and v1.5) at 224 px
WORKERS = ("mxnet-float32", "mxnet-int8", "mxnet-bfloat16", "torch")


def worker_env(**extra):
    """Every worker's environment: one OpenMP thread per physical core this process may use, the same for both
    libraries (an OMP_NUM_THREADS already set wins). Without it MXNet 1.9 takes half of the logical CPUs on x86
    (it assumes two hyper-threads a core, src/engine/openmp.cc), which on a machine without them leaves half the
    cores idle; PyTorch takes one thread per physical core."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from rn50kit.hardware import devices
    threads = os.environ.get("OMP_NUM_THREADS") or str(devices.openmp_threads())
    return dict(os.environ, OMP_NUM_THREADS=threads, **extra)


def measure_breakdown(python, precision, args):
    """Run the breakdown worker under DNNL_VERBOSE=1: ({oneDNN kind: total ms}, wall ms) of its steps."""
    command = [python, os.path.abspath(__file__), "--breakdown-worker", precision,
               "--breakdown-steps", str(args.breakdown_steps), *network_args(args)]
    env = worker_env(DNNL_VERBOSE="1", ONEDNN_VERBOSE="1")
    child = subprocess.run(command, env=env, capture_output=True, text=True)
    if child.returncode:
        raise SystemExit(f"bench_models: error: the {precision} breakdown worker failed:\n{child.stderr[-2000:]}")
    totals, wall_ms = kernel_times(child.stdout)
    if not totals or wall_ms is None:
        raise SystemExit("bench_models: error: oneDNN logged no kernels (DNNL_VERBOSE=1); is MXNet built with oneDNN?")
    return totals, wall_ms


def fused_label():
    import models
    if models.fused_bn_relu_available():
        return "fused BatchNorm+ReLU"
    return "BatchNorm and ReLU apart (--fuse-bn-relu: this MXNet has no BatchNormWithReLU)"


def network_args(args):
    """What every worker is told of the networks to build."""
    return ["--model", args.model, "--batch-size", str(args.batch_size), "--image-size", str(args.image_size),
            *(["--fuse-bn-relu"] if args.fuse_bn_relu else [])]


class Worker:
    def __init__(self, python, kind, args):
        command = [python, os.path.abspath(__file__), "--worker", kind, *network_args(args)]
        self.kind = kind
        env = worker_env()
        if kind == "mxnet-int8":  # the INT8 graph: the fusion switch quantize.py needs, set before MXNet loads
            env.update({"MXNET_DISABLE_MKLDNN_FUSE_CONV_SUM": "1"})
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        hello = self.process.stdout.readline()
        if not hello:
            raise SystemExit(f"bench_models: error: the {kind} worker ({python}) failed to start; see above")
        hello = json.loads(hello)
        self.steps, self.version = hello["steps"], hello["version"]
        self.ceiling_samples = {precision: [rate] for precision, rate in hello["ceilings"].items()}
        self.unavailable, self.built, self.logits = hello["unavailable"], hello["built"], hello["logits"]

    def time(self, key, iters, warmup):
        self.process.stdin.write(f"{key}\t{iters}\t{warmup}\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())["ips"]

    def warm_up(self, key, minimum, maximum, tolerance):
        """Run the step until its time is steady (steady.warm_up's result)."""
        self.process.stdin.write(f"warm\t{key}\t{minimum}\t{maximum}\t{tolerance}\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def measure_ceiling(self, precision):
        self.process.stdin.write(f"ceiling\t{precision}\n")
        self.process.stdin.flush()
        self.ceiling_samples[precision].append(json.loads(self.process.stdout.readline())["rate"])

    @property
    def ceilings(self):
        """The best of this worker's measures of each ceiling: what the machine can do, where load from other
        processes only ever slows a measure down (one measure on a busy moment put steps above 100 %)."""
        return {precision: max(rates) for precision, rates in self.ceiling_samples.items()}

    def close(self):
        self.process.stdin.close()
        self.process.wait()


def check_torch_python(path):
    """Why ``path`` cannot be used as the PyTorch interpreter, or None."""
    if not os.path.isfile(path):
        return f"--torch-python {path} does not exist"
    probe = subprocess.run([path, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    if probe.returncode:
        return (f"--torch-python {path} cannot import torch; make one with `python3 -m venv .venv-torch && "
                ".venv-torch/bin/pip install torch numpy`")
    return None


def fraction(key, ips, ceilings, model, image_size):
    """Share of the precision's ceiling that ``ips`` images/s is, or None where the cost is not known."""
    if not model.startswith("resnet50") or image_size != 224:
        return None
    precision = next((p for p in ("bfloat16", "int8", "float32") if p in key), None)
    ceiling = ceilings.get(precision)
    kind = "training" if "training" in key else "inference"
    return ips * GFLOP_PER_IMAGE[kind] / ceiling if ceiling else None


def above_ceiling_note(results):
    """A line for a share of the ceiling above 100 %: the ceiling is a large matrix product's rate, not the
    hardware's peak, and each measure of it can be lowered by load."""
    over = [key for key, r in results.items() if (r["ceiling_fraction"] or 0) > 1]
    if not over:
        return None
    return (f"note: {', '.join(over)} above 100 % of the ceiling: the ceiling is a {CEILING_SIZE}-square matrix "
            "product's rate, not the hardware's peak; fused kernels can pass it, and load while it was measured "
            "lowers it (compare its best and least below)")


def ratios(results):
    pairs = [("float32 training step", "float32 training step"), ("bfloat16 training step", "bfloat16 training step"),
             ("float32 inference", "float32 inference"), ("bfloat16 inference", "bfloat16 inference"),
             ("int8 inference", "bfloat16 inference"), ("int8 inference", "float32 inference")]
    out = {}
    for ours, theirs in pairs:
        a, b = results.get(f"ours {ours}"), results.get(f"PyTorch {theirs}")
        if a and b:
            out[f"ours {ours} / PyTorch {theirs}"] = a["median"] / b["median"]
    return out


def ratio_lines(ratio, results):
    """A line per ratio, flagged where either side's warm-up never settled (its figure is not a steady state's)."""
    lines = []
    for key, value in ratio.items():
        unsteady = [variant for variant in key.split(" / ") if not results[variant].get("settled", True)]
        flag = f"  (NOT steady: {', '.join(unsteady)})" if unsteady else ""
        lines.append(f"{key:<60}{value:>6.2f}x{flag}")
    return lines


def logits_difference(workers):
    """The float32 worker's bfloat16 graph's logits against its float32 network's (the same weights and image), as
    the largest difference over the largest float32 logit; None where bfloat16 was not computed."""
    logits = next((w.logits for w in workers if w.kind == "mxnet-float32" and w.logits), {})
    if "bfloat16" not in logits:
        return None
    reference, low = logits["float32"], logits["bfloat16"]
    return max(abs(a - b) for a, b in zip(reference, low)) / max(abs(a) for a in reference)


def describe_built(built):
    """One line for what a worker built (graph_summary and the operands)."""
    parts = []
    if "convolutions" in built:
        dtype, shape = built["logits"]
        parts.append(f"{built['bfloat16 convolutions']}/{built['convolutions']} convolutions take bfloat16, "
                     f"logits {dtype} {tuple(shape)}")
    parts.append(f"matrix product of {' x '.join(built['operands'])}")
    return "; ".join(parts)


def add_model_args(parser, model_names):
    """What is timed: our model, the batch and the image size, and our training's BatchNorm+ReLU."""
    group = parser.add_argument_group("Model")
    group.add_argument("--model", default="resnet50_v1.5", choices=model_names,
                       help="our model (PyTorch's is always ResNet-50 v1.5)")
    group.add_argument("--batch-size", type=int, default=16, help="images per batch")
    group.add_argument("--image-size", type=int, default=224, help="image height and width")
    group.add_argument("--fuse-bn-relu", action="store_true",
                       help="our training steps with MXNet's fused BatchNorm+ReLU, as train.py --fuse-bn-relu 1 "
                       "trains (inference graphs fold BatchNorm into the convolutions either way)")
    return group


def add_timing_args(parser):
    """How the variants are timed, and against which PyTorch."""
    group = parser.add_argument_group("Timing")
    group.add_argument("--iters", type=int, default=3, help="timed batches per variant per round")
    group.add_argument("--warmup", type=int, default=1,
                       help="untimed batches before each round's timing of a variant, and the fewest of its first "
                       "warm-up (which goes on until its step time is steady)")
    group.add_argument("--max-warmup", type=int, default=steady.MAX_WARMUP,
                       help="most steps of a variant's first warm-up; a variant still not steady then is timed "
                       "anyway and said NOT steady")
    group.add_argument("--settle-tolerance", type=float, default=steady.TOLERANCE,
                       help=f"steady: the median of the last {steady.WINDOW} step times within this fraction of the "
                       f"median of the {steady.WINDOW} before")
    group.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the median is reported")
    group.add_argument("--torch-python", default=None,
                       help="a Python with PyTorch (its own venv); without it only ours is measured")
    return group


def add_breakdown_args(parser):
    """The oneDNN kernel breakdown of the training steps."""
    group = parser.add_argument_group("Breakdown")
    group.add_argument("--breakdown-steps", type=int, default=5,
                       help="training steps the breakdown sums (on a shared machine 2 steps' shares moved by 3 "
                       "points between runs, 5 steps' by 1-3)")
    group.add_argument("--no-breakdown", action="store_true",
                       help="skip the oneDNN kernel breakdown of the training steps")
    return group


def add_output_args(parser):
    group = parser.add_argument_group("Output")
    group.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    return group


def get_args_parser(model_names):
    """The driver's flags, and the hidden ones its worker processes are started with."""
    from rn50kit.common.helptext import HelpFormatter
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    add_model_args(parser, model_names)
    add_timing_args(parser)
    add_breakdown_args(parser)
    add_output_args(parser)
    parser.add_argument("--worker", default=None, choices=WORKERS, help=argparse.SUPPRESS)
    parser.add_argument("--breakdown-worker", default=None, choices=("float32", "bfloat16"), help=argparse.SUPPRESS)
    return parser


def our_model_names(argv):
    """The models --model takes; None in the PyTorch worker (its own venv has no MXNet; the driver checked --model)."""
    if (sys.argv[1:] if argv is None else argv)[:2] == ["--worker", "torch"]:
        return None
    import models
    return models.list_models()


def check_args(parser, args):
    """Refuse bad numbers and a PyTorch interpreter that cannot import torch, before any worker starts."""
    if min(args.batch_size, args.iters, args.rounds, args.image_size, args.breakdown_steps) < 1 or args.warmup < 0:
        parser.error("--batch-size, --image-size, --iters, --rounds and --breakdown-steps must be positive, --warmup "
                     "not negative")
    if args.max_warmup < 2 * steady.WINDOW or not 0 < args.settle_tolerance < 1:
        parser.error(f"--max-warmup must be at least {2 * steady.WINDOW} (two windows of step times to compare), "
                     "--settle-tolerance between 0 and 1 (e.g. 0.05)")
    if args.torch_python:
        why = check_torch_python(args.torch_python)
        if why:
            parser.error(why)


def start_workers(args):
    workers = [Worker(sys.executable, kind, args) for kind in ("mxnet-float32", "mxnet-int8", "mxnet-bfloat16")]
    if args.torch_python:
        workers.append(Worker(args.torch_python, "torch", args))
    return workers


def warm_up_all(workers, args):
    """{variant: steady.warm_up's result}: every variant run until its step time is steady, one after the other
    before the first round, each said as it ends."""
    warmups = {}
    for w in workers:
        for key in w.steps:
            warmups[key] = w.warm_up(key, args.warmup, args.max_warmup, args.settle_tolerance)
            print(f"bench_models: warm-up: {key}: {steady.describe(warmups[key])}", file=sys.stderr, flush=True)
    return warmups


def time_rounds(workers, args):
    """({(worker, variant): images/s of each round}, {variant: its first warm-up}): every variant warmed up until
    steady, then once per round (interleaved), each worker's ceilings measured again in every round; the workers are
    closed at the end."""
    samples = {}
    try:
        warmups = warm_up_all(workers, args)
        for round_ in range(args.rounds):
            for w in workers:
                for key in w.steps:
                    samples.setdefault((w, key), []).append(w.time(key, args.iters, args.warmup))
                for precision in w.ceiling_samples:
                    w.measure_ceiling(precision)
            print(f"bench_models: round {round_ + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    finally:
        for w in workers:
            w.close()
    return samples, warmups


def machine_ceilings(workers):
    """The machine's practical ceiling per precision: the fastest matrix product either library reached."""
    ceilings = {}
    for w in workers:
        for precision, rate in w.ceilings.items():
            ceilings[precision] = max(rate, ceilings.get(precision, 0.0))
    return ceilings


def variant_results(samples, ceilings, args, warmups):
    """{variant: median, min, max, the rounds, the share of its precision's ceiling, and its first warm-up: how many
    steps, whether it settled, their times}."""
    results = {}
    for (w, key), values in samples.items():
        median = statistics.median(values)
        warmup = warmups[key]
        results[key] = {"median": median, "min": min(values), "max": max(values), "rounds": values,
                        "ceiling_fraction": fraction(key, median, ceilings, args.model, args.image_size),
                        "warmup_steps": warmup["steps"], "settled": warmup["settled"],
                        "warmup_step_seconds": warmup["step_seconds"]}
    return results


def print_results(args, results, torch_version):
    """The heading line and a line per variant (and a note for a share above the ceiling)."""
    print(f"# {args.model}, batch {args.batch_size}, {args.image_size} px, {args.rounds} interleaved rounds of "
          f"{args.iters} timed batches, {os.cpu_count()} CPUs"
          + (f"; our training with {fused_label()}" if args.fuse_bn_relu else "") + "; images/s, median [min-max]"
          + (f"; PyTorch {torch_version} channels_last" if torch_version else ""))
    for key, r in results.items():
        share = f"{100 * r['ceiling_fraction']:5.0f} % of ceiling" if r["ceiling_fraction"] else ""
        warm = f"steady after {r['warmup_steps']} steps" if r["settled"] else \
            f"NOT steady after {r['warmup_steps']} steps"
        print(f"{key:<34}{r['median']:>8.2f}  [{r['min']:.2f}-{r['max']:.2f}]  {share:<20}{warm}")
    note = above_ceiling_note(results)
    if note:
        print(note)


def print_workers(workers):
    """Per worker: what it could not measure, what it built, and its ceilings."""
    for w in workers:
        if w.unavailable:
            print(f"not measured: {w.kind}: {w.unavailable}")
        if w.built:
            print(f"built: {w.kind:<15} {describe_built(w.built)}")
        for precision, rate in w.ceilings.items():
            unit = "GOP/s" if precision == "int8" else "GFLOP/s"
            rates = w.ceiling_samples[precision]
            print(f"ceiling: {w.kind:<15} {precision:<9} matrix product {rate:8.1f} {unit} (best of {len(rates)}; "
                  f"least {min(rates):.1f})")


def breakdowns_of(results, args):
    """Where the timed training steps' time goes (bfloat16 only where the CPU has its kernels), printed."""
    breakdowns = {}
    for precision in ("float32", "bfloat16"):
        key = f"ours {precision} training step"
        if key in results:
            kernels_ms, wall_ms = measure_breakdown(sys.executable, precision, args)
            breakdowns[key] = step_breakdown(kernels_ms, args.breakdown_steps, wall_ms)
            timed_ms = 1000 * args.batch_size / results[key]["median"]
            print_breakdown(key, breakdowns[key], args.breakdown_steps, timed_ms)
    return breakdowns


def write_numbers(path, args, workers, results, torch_version, ratio, difference, breakdowns):
    """--json: every number, written atomically."""
    out = {"model": args.model, "batch_size": args.batch_size, "image_size": args.image_size,
           "fuse_bn_relu": args.fuse_bn_relu,
           "rounds": args.rounds, "iters": args.iters, "warmup": args.warmup, "max_warmup": args.max_warmup,
           "settle_tolerance": args.settle_tolerance, "settle_window": steady.WINDOW,
           "breakdown_steps": args.breakdown_steps,
           "torch": torch_version, "images_per_s": results,
           "ceilings": {w.kind: w.ceilings for w in workers},
           "ceiling_samples": {w.kind: w.ceiling_samples for w in workers}, "ratios": ratio, "cmd": sys.argv,
           "not_measured": {w.kind: w.unavailable for w in workers if w.unavailable},
           "built": {w.kind: w.built for w in workers if w.built}, "bfloat16_logits_difference": difference,
           "breakdown": breakdowns}
    with open(path + ".tmp", "w") as f:
        json.dump(out, f, indent=2)
    os.replace(path + ".tmp", path)


def main(argv=None):
    sys.path.insert(0, ROOT)
    parser = get_args_parser(our_model_names(argv))
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.model, args.batch_size, args.image_size, args.fuse_bn_relu)
    if args.breakdown_worker:
        return breakdown_worker(args.breakdown_worker, args.model, args.batch_size, args.image_size,
                                args.breakdown_steps, args.fuse_bn_relu)
    check_args(parser, args)
    workers = start_workers(args)
    samples, warmups = time_rounds(workers, args)
    results = variant_results(samples, machine_ceilings(workers), args, warmups)
    torch_version = next((w.version for w in workers if w.version), None)
    print_results(args, results, torch_version)
    print_workers(workers)
    difference = logits_difference(workers)
    if difference is not None:
        print(f"check: bfloat16 logits vs float32 (same weights and image): largest difference "
              f"{100 * difference:.2f} % of the largest logit")
    ratio = ratios(results)
    for line in ratio_lines(ratio, results):
        print(line)
    breakdowns = {} if args.no_breakdown else breakdowns_of(results, args)
    if args.json:
        write_numbers(args.json, args, workers, results, torch_version, ratio, difference, breakdowns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
