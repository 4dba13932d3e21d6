"""Before launching (issue 58, items 3 to 5): the network interface an elastic run talks over, a workspace that
cannot be written, and runner's advice after a failure (resume only from a checkpoint that exists, never after a
refusal of the configuration). No processes: the end-to-end walk is tests/e2e/test_launch_refusals.py."""
import json
import socket

import pytest

from rn50kit.launch import network
from rn50kit.reliability import faults
from rn50kit.training import prelaunch

RESUMES = "resumes from the last complete checkpoint"


def test_a_named_interface_must_exist_here():
    assert network.missing_interface("lo,eth0", available=["lo", "eth0"]) is None
    line = network.missing_interface("eth0,ib0", available=["lo", "eth0"])
    assert line.startswith("--network-interface ib0: this machine has no such interface; it has lo, eth0")


def test_an_elastic_run_on_this_machine_alone_uses_the_loopback():
    # the reference: the interface the kernel lists that holds 127.0.0.1 (psutil reads the same table)
    import psutil
    loopback = [name for name, addresses in psutil.net_if_addrs().items()
                if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addresses)]
    assert network.elastic_interface(["localhost", "127.0.0.1", socket.gethostname()]) == loopback[0]
    # two hosts or more: horovodrun finds the interfaces they share (".invalid" never resolves: RFC 6761)
    assert network.elastic_interface(["node1.invalid", "node2.invalid"]) is None
    with pytest.raises(ValueError, match=r"an elastic run on one host \(node1.invalid\) needs --network-interface"):
        network.elastic_interface(["node1.invalid", "node1.invalid"])


def test_a_workspace_that_cannot_be_written_is_named(tmp_path):
    assert prelaunch.unwritable(tmp_path / "new" / "deeper") is None  # made by the run, under a writable folder
    (tmp_path / "file").write_text("x")
    assert prelaunch.unwritable(tmp_path / "file" / "ws") == f"{tmp_path / 'file'} is a file, not a folder"
    assert prelaunch.unwritable("/proc/rn50-workspace").startswith("cannot write into /proc (")
    assert not list(tmp_path.glob(".rn50-write-check-*"))  # the probe leaves nothing behind


def record(folder, **fields):
    (folder / "rank-0.json").write_text(json.dumps(dict(rank=0, host="vm", pid=7, failed=1.0, **fields)))


def test_the_advice_resumes_only_from_a_checkpoint_and_not_after_a_refused_configuration(tmp_path):
    record(tmp_path, kind="error", failure="RuntimeError: boom")
    assert RESUMES in faults.summarize(str(tmp_path), (0, 1), resumable=True)
    assert faults.summarize(str(tmp_path), (0, 1), resumable=False).endswith("; fix the cause, then rerun")
    record(tmp_path, kind="error", failure="the workspace is busy", configuration=True)
    line = faults.summarize(str(tmp_path), (0, 2), resumable=True)
    assert line.endswith("; fix it, then rerun") and RESUMES not in line
    (tmp_path / "rank-0.json").unlink()  # killed before writing a record
    assert faults.summarize(str(tmp_path), (0, 137), resumable=True).endswith(faults.RESUME)
    assert faults.summarize(str(tmp_path), (0, 137), resumable=False).endswith(
        "rerun the same command to start again (no checkpoint was saved)")
