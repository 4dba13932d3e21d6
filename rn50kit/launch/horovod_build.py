"""What the installed Horovod for MXNet was built with (Gloo, MPI, NCCL), asked of its library without importing
MXNet: runner's checks, horovodrun's own --gloo check, tools/check_environment.py and the container set-up."""
import functools
import subprocess
import sys

from rn50kit.config.cli import UsageError

# Asked of its library through ctypes in a short process (0.1 s). horovodrun's own check forks a process per
# framework that imports it: for MXNet 3 s of CPU and 5 s before any worker starts, on every launch;
# `import horovod.mxnet` costs the same.
HOROVOD_BUILD_PROBE = """
import ctypes, importlib.util, os, sysconfig
def folder(package):
    return importlib.util.find_spec(package).submodule_search_locations[0]
ctypes.CDLL(os.path.join(folder("mxnet"), "libmxnet.so"), mode=ctypes.RTLD_GLOBAL)
lib = ctypes.CDLL(os.path.join(folder("horovod"), "mxnet", "mpi_lib" + sysconfig.get_config_var("EXT_SUFFIX")))
print(lib.horovod_gloo_built(), lib.horovod_mpi_built(), lib.horovod_nccl_built())
"""


@functools.lru_cache(maxsize=None)  # asked by the checks and by the launch: one probe a process
def horovod_build(python=None):
    """{"gloo": bool, "mpi": bool, "nccl": bool} of the installed Horovod for MXNet (of ``python``, this one by
    default), or None where its library does not load."""
    probe = subprocess.run([python or sys.executable, "-c", HOROVOD_BUILD_PROBE], capture_output=True, text=True)
    try:
        gloo, mpi, nccl = (bool(int(flag)) for flag in probe.stdout.split())
    except ValueError:
        return None
    return {"gloo": gloo, "mpi": mpi, "nccl": nccl}


def horovod_has_mpi():
    """Whether the installed Horovod was built with MPI (asked for --launcher mpi and slurm)."""
    build = horovod_build()
    if build is not None:
        return build["mpi"]
    try:  # its library does not load: the import says why
        import horovod.mxnet as hvd
    except ImportError as error:
        raise UsageError(f"Horovod for MXNet does not import ({error}); run `make setup`")
    return hvd.mpi_built()
