"""Self-check of this machine for the kit: versions, numerics, training, data, collectives, speed and memory.

    python tools/gpu_check.py [--json gpu_check.json] [--only NAME,...] [--data-val val.rec] [-b 192]

Prints a verdict table (pass / warn / fail / not run) and writes the same as JSON. On a GPU machine it checks
what the kit's developers could not run (they have no GPU that MXNet 1.9.1 supports): the driver against DALI
2.4, MXNet's kernels for this GPU, float16 NHWC numerics against float32 on the CPU, float16 training with dynamic
loss scaling, the dali-gpu pipeline and the batch that reaches MXNet on the GPU, NCCL's allreduce, NVIDIA's fused
BatchNorm ops against the plain ones (its MXNet builds only), NCHW against NHWC step time at the batch you train with
(-b, runner's default) and whether that batch fits beside a stated margin for the data pipeline and the collectives,
each in a fresh process started before any GPU work here. It runs with the variables runner gives its workers (CUDA
graphs on, cuDNN autotune off, ...): the configuration training runs, but with an OpenMP thread per core for the
CPU checks. On a CPU machine every check with a CPU form runs and the GPU ones say "not run (no GPU)". A GPU
of compute capability 9.0 or newer (H100, H200) with an MXNet wheel from PyPI is named in one line before any
kernel runs. Exit status 1 when a check fails.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from rn50kit.common import supported  # noqa: E402  (loads on the Pythons it refuses)

if __name__ == "__main__":
    supported.require_supported_python("gpu_check")  # NVIDIA's 3.8 containers: one line, not a traceback

from selfcheck import NO_KERNELS, NOT_RUN  # noqa: E402  (the checks import MXNet inside, when they run)
from selfcheck.collectives import allreduce_worker, check_allreduce_cpu, check_allreduce_gpu  # noqa: E402
from selfcheck.environment import check_driver, check_horovod_build, check_kernels, check_versions  # noqa: E402
from selfcheck.fused_batchnorm import check_fused_batchnorm  # noqa: E402
from selfcheck.numerics import BACKWARD_TOLERANCE, FORWARD_TOLERANCE, check_numerics_cpu, check_numerics_gpu  # noqa
from selfcheck.pipelines import PIXEL_TOLERANCE, check_data_cpu, check_data_gpu  # noqa: E402
from selfcheck.speed import check_layout_speed, check_memory, step_worker  # noqa: E402
from selfcheck.training import check_training_cpu, check_training_gpu  # noqa: E402

from rn50kit.hardware import devices  # noqa: E402  (no MXNet import: runner's variables are set before it)


class Check:
    def __init__(self, name, what, run, gpu_only=False):
        self.name, self.what, self.run, self.gpu_only = name, what, run, gpu_only


class Machine:
    """What the checks need to know of this machine, found once."""

    def __init__(self):
        import mxnet as mx
        self.num_gpus = mx.context.num_gpus()
        self.gpu = self.num_gpus > 0
        self.workdir = tempfile.mkdtemp(prefix="rn50-gpu-check-")


def runner_plan(gpus, cores, environ):
    """(the variables runner sets, runner's default batch per GPU) for `runner -n <gpus>` on a machine of ``gpus``
    GPUs and ``cores`` cores (environment.build_env, as runner plans it; values already in ``environ`` win)."""
    from rn50kit.launch import arguments, checks, environment, launchers
    from rn50kit.launch.machine import Machine
    # synthetic data: the variables do not depend on the data, and runner's plan would look for the data root
    args, extra = arguments.get_args_parser().parse_known_args(["-n", str(max(1, gpus)), "--data-backend",
                                                                "synthetic"])
    machine, launcher = Machine(gpus, cores), launchers.get(args.launcher)
    checks.resolve_and_check(args, extra, machine, launcher)
    return environment.build_env(args, machine, environ, extra, launcher), args.batch_size


def unsupported_gpu(machine):
    """The one line saying this GPU cannot run the installed MXNet and what to do, or None (runner refuses by the
    same test before it starts any worker)."""
    return devices.unsupported_gpu(machine.num_gpus if machine.gpu else 0)


CHECKS = [
    Check("versions", "MXNet, DALI, Horovod, numpy versions and MXNet's build features", check_versions),
    Check("driver", "NVIDIA driver (r525+ for DALI 2.4), CUDA runtime, cuDNN, NCCL", check_driver, gpu_only=True),
    # in fresh processes, before any GPU work in this one (MXNet's and DALI's pools keep what they take)
    Check("layout-speed", "float16 NCHW vs NHWC step time at -b", check_layout_speed, gpu_only=True),
    Check("memory", "-b fits (float16 NHWC ResNet-50, in a fresh process, a margin held for data and collectives)",
          check_memory, gpu_only=True),
    Check("kernels", "the GPU's architecture has MXNet kernels (a float16 NHWC convolution runs)", check_kernels,
          gpu_only=True),
    Check("horovod-build", "horovodrun --check-build: MXNet, Gloo (and NCCL with GPUs)", check_horovod_build),
    Check("numerics-cpu", "float32 ResNet-50 vs a float64 reference, and in the 4-channel structure",
          check_numerics_cpu),
    Check("numerics-gpu", "float16 NHWC 4-channel ResNet-50 on the GPU vs float32 NCHW on the CPU", check_numerics_gpu,
          gpu_only=True),
    Check("fused-batchnorm", "NVIDIA's fused BatchNorm+ReLU and +add+ReLU vs the plain ops (logits, gradients, "
          "time)", check_fused_batchnorm, gpu_only=True),
    Check("training-cpu", "float32 steps on synthetic data: the loss falls", check_training_cpu),
    Check("training-gpu", "float16 steps with dynamic loss scaling: loss falls, scale settles", check_training_gpu,
          gpu_only=True),
    Check("data-cpu", "dali-cpu validation batch vs OpenCV", check_data_cpu),
    Check("data-gpu", "dali-gpu and dali-cpu batches on the GPU vs dali-cpu on the CPU", check_data_gpu, gpu_only=True),
    Check("allreduce-cpu", "Horovod Gloo allreduce over 2 processes is exact", check_allreduce_cpu),
    Check("allreduce-gpu", "Horovod allreduce over every local GPU (NCCL) is exact", check_allreduce_gpu,
          gpu_only=True),
]


def run_checks(machine, args, checks=CHECKS, unsupported=None):
    """Each check's result; ``unsupported``: the line saying MXNet has no kernels for this GPU (unsupported_gpu),
    which the kernels check reports and for which no other GPU check runs."""
    results = []
    for check in checks:
        start = time.perf_counter()
        if check.gpu_only and not machine.gpu:
            verdict, detail, found = NOT_RUN, check.what, {}
        elif check.gpu_only and unsupported:
            verdict, detail, found = ("fail", unsupported, {}) if check.name == "kernels" else \
                (NO_KERNELS, check.what, {})
        else:
            try:
                verdict, detail, found = check.run(machine, args)
            except Exception as error:  # a check that breaks is a failed check, with its reason
                reason = devices.describe_mxnet_error(error, machine.num_gpus) \
                    if type(error).__name__ == "MXNetError" else f"{type(error).__name__}: {error}"
                verdict, detail, found = "fail", reason, {"traceback": traceback.format_exc()}
        results.append({"name": check.name, "what": check.what, "verdict": verdict, "detail": detail,
                        "seconds": round(time.perf_counter() - start, 2), "gpu_only": check.gpu_only, "data": found})
        print(f"  {check.name}: {verdict} ({results[-1]['seconds']:.1f} s)", file=sys.stderr, flush=True)
    return results


def table(results):
    width = max(len(r["name"]) for r in results)
    verdict_width = max(len(r["verdict"]) for r in results)
    lines = [f"{'check':<{width}}  {'verdict':<{verdict_width}}  detail", "-" * (width + verdict_width + 60)]
    lines += [f"{r['name']:<{width}}  {r['verdict']:<{verdict_width}}  {r['detail']}" for r in results]
    return "\n".join(lines)


def summary(results):
    counts = {}
    for r in results:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    return counts


def parse_args(argv):
    from rn50kit.common.helptext import HelpFormatter
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    parser.add_argument("--json", default="gpu_check.json", help="where the JSON report goes")
    parser.add_argument("--only", help="comma-separated check names (default: all): " +
                        ", ".join(c.name for c in CHECKS))
    parser.add_argument("--data-val", help="validation RecordIO to compare the pipelines on (default: 16 photos "
                                           "built in a temporary folder)")
    parser.add_argument("-b", "--batch-size", type=int, default=None,
                        help="per-GPU batch you train with, for the layout timing and the memory check (default: "
                             "runner's, 192 on GPUs; -b 208 for the original's)")
    parser.add_argument("--steps", type=int, default=30, help="training steps of the training checks")
    parser.add_argument("--allreduce-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--step-worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.batch_size is not None and args.batch_size < 1:
        parser.error(f"-b must be at least 1, got {args.batch_size}")
    checks = CHECKS
    if args.only:
        names = args.only.split(",")
        unknown = [n for n in names if n not in {c.name for c in CHECKS}]
        if unknown:
            parser.error(f"unknown check(s) {', '.join(unknown)}; choose from {', '.join(c.name for c in CHECKS)}")
        checks = [c for c in CHECKS if c.name in names]
    return args, checks


def use_runners_environment(args):
    """Set the variables runner gives its workers on this machine (values already set win), before MXNet is
    imported: the checks run the configuration training runs. Returns them."""
    from rn50kit.config import cli
    from rn50kit.launch import machine
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        env, default_batch = runner_plan(machine.nvidia_gpu_count(), cores, os.environ)
    except cli.UsageError as error:
        cli.fail("gpu_check", f"runner cannot plan a run on this machine: {error}")
    # The CPU checks run in this one process alone: one OpenMP thread per core, not the 1 of runner's GPU workers
    # (the user's value wins, as with runner)
    env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", str(devices.openmp_threads()))
    os.environ.update(env)
    if args.batch_size is None:
        args.batch_size = default_batch
    return env


def main(argv=None):
    args, checks = parse_args(argv)
    if args.allreduce_worker:
        return allreduce_worker()
    if args.step_worker:
        return step_worker(args.step_worker)
    env = use_runners_environment(args)
    machine = Machine()
    print(f"gpu_check: {machine.num_gpus} GPU(s) visible to MXNet; running {len(checks)} check(s) with runner's "
          f"variables ({', '.join(f'{k}={v}' for k, v in sorted(env.items()))})", file=sys.stderr)
    unsupported = unsupported_gpu(machine)
    if unsupported:
        print(f"gpu_check: {unsupported}", file=sys.stderr, flush=True)
    results = run_checks(machine, args, checks, unsupported)
    counts = summary(results)
    print(table(results))
    verdict = "fail" if counts.get("fail") else "pass"
    report = {"verdict": verdict, "gpus": machine.num_gpus, "summary": counts, "checks": results,
              "environment": env, "batch_size": args.batch_size,
              "tolerances": {"forward": FORWARD_TOLERANCE, "backward": BACKWARD_TOLERANCE, "pixels": PIXEL_TOLERANCE}}
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    shutil.rmtree(machine.workdir, ignore_errors=True)
    counted = ", ".join(f"{n} {v}" for v, n in counts.items())
    print(f"\n{verdict.upper()}: {counted}; JSON: {os.path.abspath(args.json)}")
    return 1 if verdict == "fail" else 0


if __name__ == "__main__":
    sys.exit(main())
