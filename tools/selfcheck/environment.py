"""The environment: library versions and MXNet's build, the NVIDIA driver and CUDA libraries, MXNet's kernels for
this GPU, Horovod's build."""
import ctypes
import re
import shutil
import subprocess
import sys

from rn50kit.hardware import devices

DALI_MIN_DRIVER = (525, 60)  # nvidia-dali-cuda120: CUDA 12 needs driver r525 or newer (NVIDIA's compatibility table)


# mxnet-cu112 1.9.1's sm_ list: MXNET_CUDA_ARCH "5.0;6.0;7.0;8.0;8.6" in apache/mxnet config/distribution/
# linux_cu112.cmake. A cubin for sm_XY also runs on sm_XZ with Z >= Y (same major): T4 (7.5), L4 (8.9) too.
MXNET_WHEEL_ARCHS = (50, 60, 70, 80, 86)


def library_version(names, symbol, decode):
    for name in names:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        value = ctypes.c_int()
        try:
            function = getattr(lib, symbol)
        except AttributeError:
            continue
        if symbol == "cudnnGetVersion":
            return decode(function())
        if function(ctypes.byref(value)) == 0:
            return decode(value.value)
    return None


def nvidia_smi():
    """[(name, driver version)] of the GPUs nvidia-smi lists, or []."""
    if not shutil.which("nvidia-smi"):
        return []
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=60).stdout
    return [tuple(part.strip() for part in line.split(",")) for line in out.splitlines() if line.strip()]


def check_versions(machine, args):
    import mxnet as mx
    import numpy
    found = {"python": sys.version.split()[0], "mxnet": mx.__version__, "numpy": numpy.__version__}
    try:
        import nvidia.dali
        found["dali"] = nvidia.dali.__version__
    except ImportError:
        found["dali"] = None
    try:
        import horovod
        found["horovod"] = horovod.__version__
    except ImportError:
        found["horovod"] = None
    features = [f.name for f in mx.runtime.Features().values() if f.enabled]
    found["mxnet_features"] = features
    problems = [name for name, want in (("mxnet", "1.9.1"), ("dali", "2.4"), ("horovod", "0.28.1"))
                if not (found[name] or "").startswith(want)]
    if tuple(int(x) for x in re.findall(r"\d+", numpy.__version__)[:2]) >= (1, 24):
        problems.append("numpy (MXNet 1.9.1 needs numpy<1.24)")
    detail = ", ".join(f"{k} {v}" for k, v in found.items() if k != "mxnet_features")
    detail += f"; MXNet built with {'CUDA, ' if 'CUDA' in features else ''}" \
              f"{'cuDNN, ' if 'CUDNN' in features else ''}{'NCCL, ' if 'NCCL' in features else ''}" \
              f"{'oneDNN' if 'MKLDNN' in features else 'no oneDNN'}"
    if problems:
        return "warn", f"not the pinned versions: {', '.join(problems)}; {detail}", found
    return "pass", detail, found


def check_driver(machine, args):
    gpus = nvidia_smi()
    found = {"gpus": gpus}
    found["cuda_runtime"] = library_version(["libcudart.so", "libcudart.so.11.0", "libcudart.so.12"],
                                            "cudaRuntimeGetVersion", lambda v: f"{v // 1000}.{v % 1000 // 10}")
    found["cudnn"] = library_version(["libcudnn.so", "libcudnn.so.8"], "cudnnGetVersion",
                                     lambda v: f"{v // 1000}.{v % 1000 // 100}.{v % 100}")
    found["nccl"] = library_version(["libnccl.so", "libnccl.so.2"], "ncclGetVersion",
                                    lambda v: f"{v // 10000}.{v % 10000 // 100}.{v % 100}" if v >= 10000
                                    else f"{v // 1000}.{v % 1000 // 100}.{v % 100}")
    if not gpus:
        return "fail", "nvidia-smi lists no GPU while MXNet sees one", found
    driver = gpus[0][1]
    major_minor = tuple(int(x) for x in re.findall(r"\d+", driver)[:2])
    detail = (f"{len(gpus)} x {gpus[0][0]}, driver {driver}, CUDA runtime {found['cuda_runtime']}, "
              f"cuDNN {found['cudnn']}, NCCL {found['nccl']}")
    if major_minor < DALI_MIN_DRIVER:
        return "fail", (f"driver {driver} is older than r525, which DALI 2.4 (nvidia-dali-cuda120) needs; update "
                        f"the driver, or use --data-backend mxnet; {detail}"), found
    return "pass", detail, found


def wheel_covers(arch):
    """Whether the mxnet-cu112 wheel has a cubin that runs on compute capability ``arch`` (e.g. 75)."""
    return any(a // 10 == arch // 10 and a <= arch for a in MXNET_WHEEL_ARCHS)


def check_kernels(machine, args):
    """The GPU's architecture against the wheel's sm_ list, and a real float16 convolution on every GPU."""
    import mxnet as mx
    arch = devices.compute_capability(0)
    found = {"compute_capability": arch, "wheel_archs": list(MXNET_WHEEL_ARCHS)}
    for i in range(machine.num_gpus):
        try:
            x = mx.nd.ones((2, 16, 16, 4), ctx=mx.gpu(i), dtype="float16")
            w = mx.nd.ones((8, 3, 3, 4), ctx=mx.gpu(i), dtype="float16")
            mx.nd.Convolution(x, w, no_bias=True, kernel=(3, 3), num_filter=8, layout="NHWC").wait_to_read()
        except mx.base.MXNetError as error:
            return "fail", f"gpu({i}): {devices.describe_mxnet_error(error, machine.num_gpus)}", found
    if arch is None:
        return "pass", (f"a float16 NHWC convolution ran on all {machine.num_gpus} GPU(s); compute capability "
                        "unknown (the driver's libcuda.so.1 did not answer)"), found
    note = "" if wheel_covers(arch) else \
        f" (sm_{arch} has no cubin in the mxnet-cu112 wheel's list: this is another build, or it ran from PTX)"
    return "pass", f"sm_{arch}; a float16 NHWC convolution ran on all {machine.num_gpus} GPU(s){note}", found


def check_horovod_build(machine, args):
    from rn50kit.launch.launchers.horovodrun import horovodrun_path
    horovodrun = horovodrun_path()
    if horovodrun is None:
        return "fail", "horovodrun is not installed; run `make setup`", {}
    out = subprocess.run([horovodrun, "--check-build"], capture_output=True, text=True, timeout=300).stdout
    built = {m.group(2).strip(): m.group(1) == "X" for m in re.finditer(r"\[(X| )\]\s+(\S+)", out)}
    needed = ["MXNet", "Gloo"] + (["NCCL"] if machine.gpu else [])
    missing = [name for name in needed if not built.get(name)]
    detail = "built with " + ", ".join(name for name, on in built.items() if on)
    if missing:
        return "fail", (f"Horovod lacks {', '.join(missing)}; rebuild it: `make setup` (with the GPU MXNet "
                        f"installed, it builds with NCCL); {detail}"), built
    return "pass", detail, built
