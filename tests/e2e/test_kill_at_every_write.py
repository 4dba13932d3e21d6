"""A kill at every file operation of a checkpoint save (issue 57): tests/fault_injection counts the operations of
epoch 2's save in an uninterrupted run (each file's write, fsync and rename, then the folder's fsync: 15 with a new
best), then a chain of runs of the same command in one workspace is killed (SIGKILL) just before operation 1, 2,
... N of that save in turn, each run resuming from what the one before left. After each kill the newest whole
checkpoint is epoch 2's once its state file was renamed into place and epoch 1's before; the next run resumes from
it, each killed run logged epoch 2's metrics as the uninterrupted run did, and the last run reports its metrics.
Tiny ResNet-18 on synthetic data: N + 2 short runs."""
import json
import os
import re
import sys

import pytest

from rn50kit.weights import checkpoint
from support.processes import ROOT, run, venv_env
from support.runs import TINY_RUN

pytestmark = pytest.mark.slow  # launches processes or trains end to end

INJECTION = os.path.join(ROOT, "tests", "fault_injection")


def command(workspace):
    return [sys.executable, os.path.join(ROOT, "train.py"), *TINY_RUN, "--batch-size", "8", "--num-examples", "16",
            "--num-epochs", "2", "--seed", "3", "--workspace", str(workspace)]


def injected(kill_at, log):
    env = venv_env()
    env.update(PYTHONPATH=INJECTION + os.pathsep + env["PYTHONPATH"], RN50_INJECT_KIND="kill-in-save",
               RN50_INJECT_EPOCH="2", RN50_INJECT_STEP=str(kill_at), RN50_INJECT_LOG=str(log))
    return env


def epoch_2_lines(stderr):
    """Epoch 2's logged train and validation figures (not the time and speed)."""
    return re.findall(r"Epoch\[2\] (?:train loss \S+ top1 [\d.]+|validation top1 .*)", stderr)


def test_a_kill_at_each_file_operation_of_a_save_resumes_from_the_newest_whole_checkpoint(tmp_path):
    reference = run(command(tmp_path / "reference"), env=injected(0, tmp_path / "operations.log"))
    assert reference.returncode == 0, reference.stderr[-3000:]
    operations = (tmp_path / "operations.log").read_text().split("\n")[:-1]
    kinds = {line.split()[1] for line in operations}
    assert kinds == {"write", "fsync", "rename"} and len(operations) >= 12, operations
    state_renamed = next(int(line.split()[0]) for line in operations
                         if line.endswith(f"rename model-0002{checkpoint.STATE_SUFFIX}"))
    expected_lines = epoch_2_lines(reference.stderr)
    assert len(expected_lines) == 2, reference.stderr[-3000:]

    workspace = tmp_path / "killed"
    prefix = str(workspace / "model")
    resumed_from = None
    for kill_at in range(1, len(operations) + 1):
        killed = run(command(workspace), env=injected(kill_at, tmp_path / f"killed-{kill_at}.log"))
        what = f"killed before operation {operations[kill_at - 1]}"
        assert killed.returncode == -9, f"{what}: {killed.stderr[-3000:]}"
        if resumed_from is not None:
            assert f"Resuming from {resumed_from}" in killed.stderr, f"{what}: {killed.stderr[-3000:]}"
        assert epoch_2_lines(killed.stderr) == expected_lines, f"{what}: {killed.stderr[-3000:]}"
        latest = checkpoint.find_latest(prefix)
        assert latest is not None and latest["epoch"] == (2 if kill_at > state_renamed else 1), \
            f"{what}: {latest and latest['state_path']}: {os.listdir(workspace)}"
        resumed_from = latest["state_path"]
    rerun = run(command(workspace))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"Resuming from {resumed_from}" in rerun.stderr
    report = json.load(open(workspace / "report.json"))["metrics"]
    full = json.load(open(tmp_path / "reference" / "report.json"))["metrics"]
    for key in ("train.loss", "train.top1", "val.top1", "val.top5", "val.loss"):
        assert len(report[key]) == 2 and report[key] == full[key], key
