"""The devices of a run, decided once for runner and train.py: the defaults of a float16 run on GPUs, which GPUs
``--gpus`` selects (under runner's CUDA_VISIBLE_DEVICES too), the cores a process may use, and what an MXNet
error on a GPU means to the user, in one line. No MXNet import at module level: runner uses it before MXNet.
"""
import os
import re
import sys

from rn50kit.common import backends

# The original's float16 settings on GPUs (its runner, 2019-10): compute in NHWC, the layout of the tensor-core
# convolutions (upstream MXNet runs NHWC float16 convolutions in cuDNN with float32 accumulation, and NHWC
# BatchNorm and pooling in cuDNN too: src/operator/nn/convolution.cu, cudnn/cudnn_batch_norm-inl.h,
# cudnn/cudnn_pooling-inl.h), and a zero 4th input channel from DALI (not from the mxnet backend, which writes
# 3-channel NCHW: the network transposes its input on the GPU). The fusions (the original's `--fuse-bn-relu 1
# --fuse-bn-add-relu 1`) only with NVIDIA's build (nvidia_fused_batchnorm): upstream's BatchNormWithReLU is a
# CPU (oneDNN) kernel for axis 1 only and BatchNormAddRelu exists only in NVIDIA's builds.
FLOAT16_GPU_LAYOUT = {"input_layout": "NHWC", "conv_layout": "NHWC", "batchnorm_layout": "NHWC",
                      "pooling_layout": "NHWC"}


FUSED_BATCHNORM = {"fuse_bn_relu": 1, "fuse_bn_add_relu": 1}


def float16_gpu_defaults(dtype, gpu, data_backend, given, image_shape, fused=False, conv_layout=None):
    """{flag destination: value} a float16 run on GPUs gets where the user has not chosen (``given``: the
    destinations of the flags typed; ``fused``: this MXNet is NVIDIA's build with the fused BatchNorm ops;
    ``conv_layout``: the --conv-layout in effect). The one place these defaults live: train.py applies them on a
    GPU machine, started by runner or alone."""
    if dtype != "float16" or not gpu:
        return {}
    fixed = backends.get(data_backend).input_layout_fixed if data_backend else None
    values = {}
    if not set(given) & set(FLOAT16_GPU_LAYOUT):
        values.update(FLOAT16_GPU_LAYOUT)
        if fixed:  # e.g. ImageRecordIter writes NCHW: the network's transpose runs on the GPU
            values["input_layout"] = fixed
    if "image_shape" not in given and not fixed:
        values["image_shape"] = [4] + list(image_shape)[1:]
    # the original fuses in NHWC only (its runner); an NCHW run the user chose keeps the plain ops
    if fused and values.get("conv_layout", conv_layout) == "NHWC":
        values.update({dest: on for dest, on in FUSED_BATCHNORM.items() if dest not in given})
    return values


def apply_float16_gpu_defaults(args, given, num_gpus):
    fused = num_gpus > 0 and args.dtype == "float16" and nvidia_fused_batchnorm()
    for dest, value in float16_gpu_defaults(args.dtype, num_gpus > 0, args.data_backend, given,
                                            args.image_shape, fused, getattr(args, "conv_layout", None)).items():
        setattr(args, dest, value)


# --- NVIDIA's fused BatchNorm ops, read from MXNet's operator registry -----------------------------------------
# NVIDIA's container builds add `act_type` to BatchNorm (BatchNorm+ReLU in one cuDNN kernel) and register
# BatchNormAddRelu; upstream MXNet 1.9.1 has neither (its BatchNorm's arguments end at max_calib_range). Read from
# MXNet itself, never from a version string: NVIDIA's builds call themselves 1.9.1 too.

def registered_operators():
    from mxnet import operator
    return set(operator.get_all_registered_operators())


def operator_arguments(name):
    from mxnet import operator
    return list(operator.get_operator_arguments(name).names)


def nvidia_bn_relu():
    """This MXNet's BatchNorm takes act_type='relu' (NVIDIA's fused BatchNorm+ReLU; any axis, NHWC on GPUs)."""
    return "act_type" in operator_arguments("BatchNorm")


def nvidia_bn_add_relu():
    """This MXNet registers BatchNormAddRelu (NVIDIA's fused BatchNorm+add+ReLU)."""
    return "BatchNormAddRelu" in registered_operators()


def nvidia_fused_batchnorm():
    """Both of NVIDIA's fused BatchNorm ops are here: the original kit's float16 GPU runs use them. Where MXNet is
    not loaded (runner's launch check), this MXNet's answer, kept by mxnet_answers."""
    if "mxnet" not in sys.modules:
        from rn50kit.hardware import mxnet_answers
        return mxnet_answers.nvidia_fused_batchnorm()
    return nvidia_bn_relu() and nvidia_bn_add_relu()


# --- GPUs the installed MXNet has no kernels for (the self-check's test; runner refuses by it too) -------------
# Every MXNet 1.9.1 GPU wheel on PyPI (mxnet-cu101 to mxnet-cu117) carries machine code up to sm_86 and no PTX
# (read with cuobjdump): on compute capability 9.0 and newer no kernel can run.
PYPI_WHEEL = re.compile(r"^mxnet[-_]cu\d+$")
NEWEST_WHEEL_GPU = 89  # sm_86's cubins run on 8.x up to 8.9
SM90_ROUTES = ("NVIDIA's NGC MXNet container 24.05 or 24.06 (MXNet 1.9.1, CUDA 12.4; see docs/gpu.md), "
               "a source build of MXNet 1.9.1 for sm_90 (CUDA 11.8, gcc 11, cuDNN 8.9 for CUDA 11), "
               "or a GPU of compute capability 5.0-8.9")
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 75, 76


def compute_capability(ordinal=0):
    """The compute capability of GPU ``ordinal`` as an int (90 for 9.0) from the driver API, or None. The driver
    installs ``libcuda.so.1``; the unversioned ``libcuda.so`` that mx.util.get_cuda_compute_capability loads comes
    only with the development package. No kernel runs."""
    import ctypes
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    device, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    if lib.cuInit(0) != 0 or lib.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
        return None
    for value, attribute in ((major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                             (minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)):
        if lib.cuDeviceGetAttribute(ctypes.byref(value), attribute, device) != 0:
            return None
    return major.value * 10 + minor.value


def pypi_gpu_wheel():
    """'mxnet-cu112 1.9.1' when MXNet is a GPU wheel from PyPI (NGC's and source builds install as 'mxnet'),
    else None."""
    from importlib import metadata
    for dist in metadata.distributions():
        name = dist.metadata.get("Name") or ""
        if PYPI_WHEEL.match(name.lower()):
            return f"{name} {dist.version}"
    return None


def unsupported_gpu(num_gpus):
    """The one line saying this machine's GPU cannot run the installed MXNet and what to do, or None."""
    if not num_gpus:
        return None
    arch, wheel = compute_capability(0), pypi_gpu_wheel()
    if arch is None or arch <= NEWEST_WHEEL_GPU or wheel is None:
        return None
    return (f"this GPU is compute capability {arch // 10}.{arch % 10} (sm_{arch}), and the installed {wheel} from "
            f"PyPI has kernels up to sm_86 and no PTX: every MXNet kernel fails here (\"no kernel image is "
            f"available\"). Routes: {SM90_ROUTES}")


# --- which GPUs -----------------------------------------------------------------------------------------------

def parse_gpus(text):
    """--gpus "0,1,2" -> [0, 1, 2] (None for None); a ValueError names the flag."""
    if text is None or text == "":
        return None
    try:
        ids = [int(part) for part in str(text).split(",")]
    except ValueError:
        raise ValueError(f"--gpus {text}: give GPU ids separated by commas, e.g. --gpus 0,1,2,3") from None
    if any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise ValueError(f"--gpus {text}: give each GPU id (0 or more) once")
    return ids


def visible_entries(environ):
    """CUDA_VISIBLE_DEVICES as CUDA reads it (entries up to the first invalid one, -1), or None when unset."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    entries = [v.strip() for v in value.split(",") if v.strip()]
    return entries[:entries.index("-1")] if "-1" in entries else entries


def ordinal(gpu_id, visible, num_gpus):
    """The CUDA ordinal (mx.gpu(i)) of the GPU numbered ``gpu_id`` as nvidia-smi numbers it (--gpus), in a process
    seeing ``num_gpus`` GPUs through CUDA_VISIBLE_DEVICES ``visible`` (None: unset, every GPU visible)."""
    if visible is None:
        if gpu_id >= num_gpus:
            raise ValueError(f"--gpus names GPU {gpu_id}, and this machine has GPUs {_ids(num_gpus)}")
        return gpu_id
    if str(gpu_id) not in visible:
        raise ValueError(f"--gpus names GPU {gpu_id}, which CUDA_VISIBLE_DEVICES={','.join(visible)} hides; "
                         "name GPUs among those, or leave --gpus out")
    return visible.index(str(gpu_id))


def _ids(count):
    return f"0 to {count - 1}" if count > 1 else ("0 only" if count == 1 else "none")


def select_gpus(gpus, kv_store, local_rank, local_size, num_gpus, environ):
    """The CUDA ordinals this process computes on. ``gpus``: --gpus (GPU ids as nvidia-smi numbers them; None:
    every visible GPU), the same meaning with every --kv-store: device/local drive all of them in one process,
    horovod gives local rank r the r-th. Raises ValueError for ids that do not exist or are hidden."""
    ids = parse_gpus(gpus)
    visible = visible_entries(environ)
    if ids is None:
        if kv_store == "horovod":
            return [horovod_ordinal(local_rank, local_size, num_gpus)]
        return list(range(num_gpus))
    ordinals = [ordinal(i, visible, num_gpus) for i in ids]
    if kv_store != "horovod":
        return ordinals
    if len(ids) < local_size:
        raise ValueError(f"--gpus {gpus} names {len(ids)} GPU(s) for the {local_size} workers of this machine; "
                         f"name one per worker, or leave --gpus out")
    return [ordinals[local_rank]]


def horovod_ordinal(local_rank, local_size, visible_gpus):
    """The GPU of this Horovod rank among the ``visible_gpus`` it sees: its local rank when the node's GPUs are
    all visible (horovodrun, mpirun), the only one when it sees one (per-rank CUDA_VISIBLE_DEVICES, srun
    --gpus-per-task=1)."""
    if visible_gpus >= local_size:
        return local_rank
    if visible_gpus == 1:
        return 0
    raise ValueError(f"this rank (local rank {local_rank} of {local_size}) sees {visible_gpus} GPUs: either make "
                     f"every GPU of the node visible to every rank, or give each rank one (CUDA_VISIBLE_DEVICES, "
                     "srun --gpus-per-task=1)")


def runner_visible_devices(gpus, ngpus, kv_store):
    """CUDA_VISIBLE_DEVICES runner sets for one process driving ``ngpus`` GPUs (--kv-store device/local), given
    --gpus: the GPUs named, else the first ``ngpus``. None under Horovod (every rank sees the node's GPUs).
    Raises ValueError when --gpus names another number of GPUs than -n."""
    ids = parse_gpus(gpus)
    if ids is not None and len(ids) != ngpus:
        raise ValueError(f"-n {ngpus} but --gpus {gpus} names {len(ids)} GPU(s); give -n {len(ids)}, or name "
                         f"{ngpus} GPUs")
    if kv_store == "horovod":
        return None
    return ",".join(str(i) for i in (ids if ids is not None else range(ngpus)))


# --- cores ----------------------------------------------------------------------------------------------------

def usable_cpus():
    """The logical CPUs this process may run on: its affinity mask (Slurm's and cgroups' cpusets, taskset), not
    the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return os.sched_getaffinity(0)
    return set(range(os.cpu_count() or 1))


def usable_cores():
    """How many logical CPUs this process may run on (usable_cpus)."""
    return max(1, len(usable_cpus()))


def openmp_threads():
    """OpenMP threads for one process alone on this machine: one per physical core of its affinity mask. Hyper-
    thread siblings share a core's vector units, and oneDNN runs best with one thread a core."""
    cores = set()
    for cpu in usable_cpus():
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
                cores.add(f.read().strip())  # the same list for every thread of one core
        except OSError:
            cores.add(str(cpu))
    return max(1, len(cores))


def nvidia_gpu_present():
    """Whether the NVIDIA driver lists a GPU on this machine (read without loading CUDA or MXNet)."""
    try:
        return bool(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return False


# --- MXNet's errors, in one line ------------------------------------------------------------------------------

def describe_mxnet_error(error, num_gpus=None, environ=None):
    """One line saying what an MXNetError (pages of C++ stack) means and what to do: CUDA out of memory (a
    smaller batch), a GPU id that does not exist (the ids that do), no kernel for this GPU, else the telling
    line of the message."""
    text = str(error)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    lower = text.lower()
    if "out of memory" in lower or "cudamalloc" in lower and "failed" in lower:
        return ("the GPU ran out of memory; use a smaller batch (runner's -b is per GPU; train.py's --batch-size "
                "is the global batch), or --dtype float16")
    if "invalid device ordinal" in lower:
        visible = visible_entries(environ if environ is not None else os.environ)
        seen = f"; CUDA_VISIBLE_DEVICES={','.join(visible)}" if visible is not None else ""
        count = f"this process sees GPUs {_ids(num_gpus)}" if num_gpus is not None else "no such GPU"
        return f"a GPU id that does not exist was asked for: {count}{seen}; check --gpus and -n"
    if "no kernel image is available" in lower:
        return ("the installed MXNet has no kernels for this GPU (the mxnet-cu112/cu117 wheels cover sm_50 to "
                "sm_86: V100, A100, A10, RTX 30xx); see docs/gpu.md")
    telling = [line for line in lines if re.search(r"Error|Check failed", line) and not line.startswith("Stack")]
    return f"MXNet failed: {(telling or lines or [type(error).__name__])[0]}"
