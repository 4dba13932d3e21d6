"""What the kit runs on (rn50kit/common/supported.py): the Pythons of NVIDIA's MXNet containers and of the kit's
.venv, MXNet 1.9 in the forms it comes in, and a Horovod that loads with MXNet."""
import sys

import pytest

from rn50kit.common import supported


@pytest.mark.parametrize("version, runs", [((3, 8, 10), False), ((3, 9, 18), False), ((3, 10, 12), True),
                                           ((3, 11, 7), True), ((3, 12, 1), False), ((3, 13, 0), False)])
def test_pythons_the_kit_runs_on(version, runs):
    problem = supported.python_problem(version)
    assert (problem is None) == runs
    if not runs:
        assert f"found {'.'.join(map(str, version))};" in problem and "\n" not in problem
        assert ("24.05 or later" in problem) == (version < (3, 10))  # an older container: name a newer one


def test_this_python_is_one_of_them():
    assert supported.python_problem(sys.version_info) is None


@pytest.mark.parametrize("version, runs", [("1.9.1", True), ("1.9.0", True), ("1.9.1.dev0", True),
                                           ("1.9.1+nv24.6", True), ("2.0.0", False), ("1.8.0", False),
                                           ("1.6.0", False), ("nightly", False)])
def test_mxnet_versions(version, runs):
    problem = supported.mxnet_problem(version)
    assert (problem is None) == runs
    if not runs:
        assert f"found {version};" in problem


def test_horovod_builds():
    assert "not installed" in supported.horovod_problem(None)
    assert "neither Gloo nor MPI" in supported.horovod_problem({"gloo": False, "mpi": False, "nccl": True})
    assert supported.horovod_problem({"gloo": True, "mpi": False, "nccl": False}) is None
    assert supported.horovod_problem({"gloo": False, "mpi": True, "nccl": False}) is None
