"""The launchers' services (Open MPI, a one-node Slurm, sshd on two loopback hosts; tools/ci_services.sh): a test
that needs a missing one is skipped for a user's `make test` and fails in CI (e2e/test_launchers,
test_fault_recovery, test_elastic_training, test_horovod_training)."""
import os
import shutil
import socket
import subprocess
import sys

import pytest

from .processes import HANG_S, venv_env

SERVICES_HINT = "run `sudo tools/ci_services.sh --install` (see docs/multi-node.md)"
TEST_HOSTS = ("hostA", "hostB")


def require(ok, missing):
    """Skip for a user's `make test` when a service is missing; in CI (CI set) that is a failure."""
    if ok:
        return
    message = f"needs {missing}; {SERVICES_HINT}"
    if os.environ.get("CI"):
        pytest.fail(f"CI: {message}")
    pytest.skip(message)


def quiet(command, timeout=HANG_S):
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None


def loopback_address(host):
    try:
        address = socket.gethostbyname(host)
    except socket.gaierror:
        return None
    return address if address.startswith("127.") else None


def need_ssh_hosts():
    for host in TEST_HOSTS:
        require(loopback_address(host) is not None, f"{host} in /etc/hosts on a loopback address")
        result = quiet(["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", host, "true"])
        require(result is not None and result.returncode == 0, f"key-based ssh to {host}")
    require(len({loopback_address(host) for host in TEST_HOSTS}) == 2, "hostA and hostB on different addresses")


def horovod_has_mpi():
    code = "import horovod.mxnet as hvd; print(hvd.mpi_built())"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S)
    return result.stdout.strip() == "True"


def need_mpi():
    require(shutil.which("mpirun") is not None, "Open MPI's mpirun (apt-get install openmpi-bin libopenmpi-dev)")
    require(horovod_has_mpi(), "Horovod built with MPI (install Open MPI, then rerun `make setup`)")


def need_slurm():
    need_mpi()
    ping = quiet(["scontrol", "ping"]) if shutil.which("scontrol") else None
    require(ping is not None and "UP" in ping.stdout, "a running Slurm controller (scontrol ping)")
    # A node that is up: idle, or busy with another test's job (the two test workers share it; srun waits its turn)
    cpus = quiet(["sinfo", "-h", "-t", "idle,mix,alloc,comp", "-o", "%c"])
    require(cpus is not None and any(c.isdigit() and int(c) >= 2 for c in cpus.stdout.split()),
            "a Slurm node that is up, with 2 CPUs (sinfo)")


def mpirun_root_env():
    env = venv_env()
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    return env
