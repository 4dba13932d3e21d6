"""This machine as runner plans for it: its usable GPUs and its cores. The planner takes a Machine (tests and the
docs' dry runs describe an 8-GPU node on a CPU); runner asks detect_machine() for the real one."""
import os
import shutil
import subprocess
from pathlib import Path

from rn50kit.config.cli import UsageError
from rn50kit.hardware import devices


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
