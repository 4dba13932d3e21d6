"""What the figures were measured on: the machine (CPU, GPUs, Python) and the libraries' versions, read without
importing them."""
import os
import platform
import shutil
import subprocess
from collections import OrderedDict


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
