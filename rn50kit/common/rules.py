"""The rules a run must satisfy on its machine, each worded once, checked by runner before any worker starts and
by train.py (which also runs alone). No MXNet here: runner checks them before it can import it.

Each function returns one line saying what is wrong and what to do, or None."""
from rn50kit.common import backends

BFLOAT16_ISA = ("avx512f", "avx512bw", "avx512vl", "avx512dq")  # oneDNN's avx512_core: its bfloat16 kernels


def cpu_flags(path="/proc/cpuinfo"):
    """The CPU's feature flags (empty where they cannot be read: not Linux)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def dtype_problem(dtype, mode, gpu, why=""):
    """``gpu``: the run's workers use GPUs; ``why``: why the machine has none, when known."""
    if dtype == "float16" and not gpu:
        return (f"--dtype float16 needs a GPU and this machine has none{why}; use --dtype float32 or --dtype "
                "bfloat16 on the CPU")
    if dtype == "bfloat16" and gpu:
        return "--dtype bfloat16 runs on the CPU only in MXNet 1.9 (oneDNN); use --dtype float16 on GPUs"
    if dtype == "int8" and mode not in ("val", "pred"):
        return (f"--dtype int8 scores and predicts only (--mode val or pred), not --mode {mode}: train in float32 "
                "or bfloat16, then score the checkpoint with --dtype int8")
    if dtype == "int8" and gpu:
        return ("--dtype int8 runs on the CPU only (oneDNN); use --dtype float16 on GPUs "
                "(or hide them: CUDA_VISIBLE_DEVICES=)")
    return None


def bfloat16_problem(dtype, flags=None):
    """oneDNN's bfloat16 kernels need AVX-512 (its avx512_core level); without it MXNet fails deep inside the
    first convolution ("could not create a primitive descriptor iterator"). None where the flags cannot be read."""
    if dtype != "bfloat16":
        return None
    flags = cpu_flags() if flags is None else flags
    missing = [flag for flag in BFLOAT16_ISA if flag not in flags]
    if not flags or not missing:
        return None
    return (f"--dtype bfloat16 needs a CPU with AVX-512 (oneDNN's bfloat16 kernels) and this one lacks "
            f"{', '.join(missing)}; use --dtype float32")


def backend_problem(data_backend, gpu, why=""):
    if backends.needs_gpu(data_backend) and not gpu:
        return (f"--data-backend {data_backend} needs a GPU (and a GPU build of MXNet) and this machine has "
                f"none{why}; use --data-backend dali-cpu (or mxnet, or synthetic)")
    return None


def fusion_problem(fuse_bn_relu, gpu, nvidia_fused=False):
    """``nvidia_fused``: this MXNet is NVIDIA's build, whose BatchNorm fuses the ReLU on GPUs
    (devices.nvidia_bn_relu, read from MXNet's operator registry by whoever imports it)."""
    if fuse_bn_relu and gpu and not nvidia_fused:
        return ("--fuse-bn-relu 1 runs on CPUs only: upstream MXNet's BatchNormWithReLU has a oneDNN kernel and no "
                "GPU one; leave it out on GPUs")
    return None


def augment_problem(data_backend, auto_augment="none", color_jitter=(0.0,)):
    """--auto-augment and --color-jitter run in the DALI pipelines (DALI's auto_aug); other backends refuse them."""
    asked = [flag for flag, on in (("--auto-augment", auto_augment not in (None, "none")),
                                   ("--color-jitter", any(color_jitter or ()))) if on]
    if asked and data_backend and not backends.get(data_backend).auto_augment:
        able = " or ".join(name for name, backend in backends.BACKENDS.items() if backend.auto_augment)
        verb, them = ("run", "them") if len(asked) > 1 else ("runs", "it")
        return (f"{' and '.join(asked)} {verb} in the DALI pipelines only, not with --data-backend {data_backend}; "
                f"use --data-backend {able}, or leave {them} out")
    return None


def layout_problem(conv_layout, gpu, why=""):
    """MXNet 1.9.1's CPU build (oneDNN) has no NHWC strided convolution: the first one fails with "could not
    create a descriptor for a dilated convolution forward propagation primitive"."""
    if conv_layout == "NHWC" and not gpu:
        return (f"--conv-layout NHWC needs a GPU (cuDNN) and this machine has none{why}: MXNet's CPU build has no "
                "NHWC strided convolution; leave --conv-layout out (NCHW) on the CPU")
    return None


def devices_problem(gpus, gpu, why=""):
    """--gpus names GPUs for --kv-store device/local: without any, the run would train on one CPU context."""
    if gpus and not gpu:
        return (f"--gpus {gpus} names GPUs and this machine has none{why}; leave --gpus out on the CPU (use -n N "
                "worker processes, or --kv-store device --cpu-contexts N)")
    return None


def run_problem(dtype, data_backend, mode, fuse_bn_relu, gpu, why="", conv_layout=None, gpus=None,
                nvidia_fused=False):
    """The first rule a run breaks on a machine with (``gpu``) or without GPUs, or None. The CPU's own features
    (bfloat16_problem) are checked where the worker runs: runner may be planning for other hosts."""
    return (dtype_problem(dtype, mode, gpu, why) or backend_problem(data_backend, gpu, why)
            or fusion_problem(fuse_bn_relu, gpu, nvidia_fused) or layout_problem(conv_layout, gpu, why)
            or devices_problem(gpus, gpu, why))
