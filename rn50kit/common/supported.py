"""What the kit runs on, checked at start in one line each: the Python, the MXNet and the Horovod it finds.

Python 3.10 (NVIDIA's MXNet containers 24.05 and 24.06) and 3.11 (the kit's own .venv); MXNet 1.9 (PyPI's 1.9.1
or NVIDIA's container build); Horovod built with MXNet. This module is imported first by the kit's commands, so
it must also load on the Pythons it refuses (the 3.8 of NVIDIA's older containers): plain 3.6 syntax here.
"""
import sys

PYTHONS = ((3, 10), (3, 11))
MIN_MXNET = (1, 9)
CONTAINER = "nvcr.io/nvidia/mxnet:24.06-py3"  # the newest MXNet container, Python 3.10 (docs/gpu.md)


def python_problem(version_info):
    """Why the kit cannot run on the Python of ``version_info`` (a sys.version_info), or None."""
    found = tuple(version_info[:2])
    if found in PYTHONS:
        return None
    version = ".".join(str(part) for part in version_info[:3])
    if found < PYTHONS[0]:
        return (f"the kit needs Python 3.10 or 3.11, found {version}; in NVIDIA's containers use the MXNet "
                f"container 24.05 or later ({CONTAINER}, Python 3.10), elsewhere run `make setup` with "
                f"PYTHON=python3.11")
    return (f"the kit needs Python 3.10 or 3.11 (MXNet 1.9 has no release for newer ones), found {version}; "
            f"run `make setup PYTHON=python3.11` and use .venv/bin/python")


def require_supported_python(prog):
    """Exit with one line (status 2) where this Python is not one the kit runs on."""
    problem = python_problem(sys.version_info)
    if problem:
        print(f"{prog}: error: {problem}", file=sys.stderr)
        sys.exit(2)


def version_tuple(text):
    """(major, minor) of a version string such as 1.9.1, 1.9.1.dev0 or 1.9.0+nv; (0, 0) where unreadable."""
    parts = []
    for part in str(text).replace("+", ".").split(".")[:2]:
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) if len(parts) == 2 else (0, 0)


def mxnet_problem(version):
    """Why an MXNet of ``version`` cannot run the kit, or None."""
    if version_tuple(version)[0] == MIN_MXNET[0] and version_tuple(version) >= MIN_MXNET:  # 2.x is another API
        return None
    return (f"the kit needs MXNet 1.9 (PyPI's mxnet==1.9.1 or NVIDIA's container build), found {version}; in "
            f"NVIDIA's containers use 24.05 or later ({CONTAINER}), elsewhere run `make setup`")


def horovod_problem(build):
    """Why the installed Horovod cannot run the kit's workers, or None. ``build`` is horovod_build.horovod_build()'s
    answer: {"gloo": bool, "mpi": bool}, or None where Horovod's MXNet library does not load."""
    if build is None:
        return ("Horovod with MXNet support is not installed for this Python (horovod.mxnet does not load); in a "
                "container rebuild it with HOROVOD_WITH_MXNET=1 (`tools/install_horovod.sh python`), elsewhere run "
                "`make setup`; or train one worker with --kv-store device")
    if not (build["gloo"] or build["mpi"]):
        return "Horovod was built with neither Gloo nor MPI, so no worker can join another; rebuild it with Gloo"
    return None


class WithoutUnusedLibraries:
    """MXNet 1.9.1 imports, where they are installed, scikit-learn (the kit's demo data needs it) for a legacy base
    class the kit never uses, SciPy for sparse arrays and entropy calibration (quantize.py gives it scipy.stats when
    that is asked for), and onnx for its ONNX exporter (tools/export_onnx.py binds it again): together 1.2 s of
    every worker's and every check's start. Hidden while MXNet loads; MXNet handles their absence."""
    HIDDEN = ("sklearn", "scipy", "onnx")

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] in WithoutUnusedLibraries.HIDDEN:
            raise ImportError(f"{name}: not needed by MXNet here")
        return None


def import_mxnet():
    """MXNet, loaded without scikit-learn, SciPy and onnx (an ImportError where MXNet is not installed)."""
    sys.meta_path.insert(0, WithoutUnusedLibraries)
    try:
        import mxnet
    finally:
        sys.meta_path.remove(WithoutUnusedLibraries)
    return mxnet
