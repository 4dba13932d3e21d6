"""One configuration of a sweep: the runner command that runs it, what runner would run (--dry-run), what the run
really uses (its dtype, layout, data), and the run itself, its output echoed and its failure said in one line."""
import argparse
import os
import re
import signal
import subprocess
import sys
import threading
from collections import OrderedDict, deque
from pathlib import Path

from rn50kit.benchmarking.results import WARMUP_ITERS
from rn50kit.common import backends
from rn50kit.config import cli
from rn50kit.hardware import devices
from rn50kit.launch import arguments, checks

KIT_DIR = Path(__file__).resolve().parents[2]


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
    if Path(executable).resolve() != (KIT_DIR / "runner").resolve() or "--data-backend" in passthrough:
        return None
    args, extra = arguments.get_args_parser().parse_known_args(passthrough + ["--mode", mode])
    args.data_backend = None
    try:
        checks.check_data_root(args, arguments.peek_extra(extra))
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
        from rn50kit.weights import checkpoint  # only for benchmarks of a checkpoint
        state = checkpoint.trained_settings(found.load) or {}
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
