"""What can be known before any worker starts is refused by runner before launching, and by its dry run alike, in
one line (issue 58, items 3 to 5): each refusal below used to come 7-24 s after the workers started, 5-31 lines
long, while --dry-run passed it; an elastic run on one machine waited 600 s in silence; and the failure line
advised resuming from a checkpoint that did not exist, or after a refusal of the configuration."""
import fcntl
import os
import subprocess
import sys

import pytest

from support.processes import HANG_S, ROOT, venv_env

pytestmark = pytest.mark.slow  # launches runner, trains end to end

INJECTION = os.path.join(ROOT, "tests", "fault_injection")  # its sitecustomize raises on one rank, on request
RESUMES = "resumes from the last complete checkpoint"


def runner(*args, env=None, cwd=None):
    return subprocess.run([sys.executable, os.path.join(ROOT, "runner"), *args], env=env or venv_env(), cwd=cwd,
                          capture_output=True, text=True, timeout=HANG_S, stdin=subprocess.DEVNULL)


def digits_flags(digits):
    return ["--data-root", str(digits), "--data-backend", "dali-cpu", "--dtype", "float32", "--num-layers", "18",
            "--num-classes", "10", "--image-shape", "3,32,32", "--data-val-resize", "32", "--dali-threads", "1",
            "--dali-validation-threads", "1", "-e", "1", "-b", "32", "--num-examples", "64"]


@pytest.fixture(scope="module")
def trained(digits_data, tmp_path_factory):
    """A ResNet-18 workspace with one complete checkpoint, at runs/resnet18_v1.5 of its folder (the default
    workspace of a ResNet-18 run started there)."""
    folder = tmp_path_factory.mktemp("trained")
    workspace = folder / "runs" / "resnet18_v1.5"
    result = runner("-n", "1", *digits_flags(digits_data), "--workspace", str(workspace))
    assert result.returncode == 0, result.stderr[-3000:]
    assert (workspace / "model-0001.state.json").is_file()
    return folder, workspace, digits_data


def one_line(result):
    """The one line on stderr of a refused command (no traceback, non-zero exit)."""
    assert result.returncode != 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


# (flags, a part of the one line naming the problem); "{tmp}": the test's folder
REFUSALS = {
    "a batch far beyond the memory": (["-b", "4000000"], "training needs about"),
    "labels beyond --num-classes": (["--num-classes", "5"], "the data has labels up to 9 but --num-classes is 5"),
    "an image shape without channels": (["--image-shape", "32,32"], "--image-shape must be C,H,W"),
    "a --resume file that is not there": (["--resume", "{tmp}/model-0003.params"], "--resume {tmp}/model-0003.params"),
    "a workspace nobody can write": (["--workspace", "/proc/rn50-workspace"], "--workspace /proc/rn50-workspace"),
}


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
@pytest.mark.parametrize("name", REFUSALS)
def test_known_problems_are_refused_before_launching_in_one_line(name, dry_run, digits_data, tmp_path):
    flags, expected = REFUSALS[name]
    flags = [flag.replace("{tmp}", str(tmp_path)) for flag in flags]
    workspace = tmp_path / "ws"
    if "--workspace" not in flags:
        flags += ["--workspace", str(workspace)]
    result = runner(*(["--dry-run"] if dry_run else []), "-n", "1", *digits_flags(digits_data), *flags)
    line = one_line(result)
    assert expected.replace("{tmp}", str(tmp_path)) in line, line
    assert not workspace.exists()  # nothing started: no workspace made, no run.lock left
    assert not os.path.exists("/proc/rn50-workspace")


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
def test_a_workspace_of_another_depth_is_refused_before_launching(dry_run, trained):
    _, workspace, digits = trained
    lock_before = (workspace / "run.lock").read_text()
    result = runner(*(["--dry-run"] if dry_run else []), "-n", "1", *digits_flags(digits), "--num-layers", "34",
                    "--workspace", str(workspace))
    line = one_line(result)
    assert "comes from another architecture (resnet18_v1.5; this run: resnet34_v1.5)" in line, line
    assert (workspace / "run.lock").read_text() == lock_before  # no run took the workspace


# --- item 3: an elastic run on one machine ---------------------------------------------------------------------

ELASTIC_ON_ONE_MACHINE = ["-n", "2", "-H", "localhost:2", "--min-np", "1"]


def test_an_elastic_run_on_one_machine_talks_over_the_loopback(digits_data, tmp_path):
    """horovodrun's elastic driver waits for a second host to find a common interface (600 s, then a traceback)
    unless it is named: runner names lo when every host is this machine, and shows the driver's progress."""
    plan = runner("--dry-run", *ELASTIC_ON_ONE_MACHINE, *digits_flags(digits_data), "--workspace", str(tmp_path))
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert "--network-interfaces lo" in plan.stdout, plan.stdout
    result = runner(*ELASTIC_ON_ONE_MACHINE, *digits_flags(digits_data), "--workspace", str(tmp_path / "ws"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "runner: elastic: start worker process: localhost[1]" in result.stderr, result.stderr[-3000:]
    assert (tmp_path / "ws" / "model-0001.state.json").is_file()


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
def test_an_interface_this_machine_lacks_is_refused_in_one_line(dry_run, digits_data, tmp_path):
    result = runner(*(["--dry-run"] if dry_run else []), *ELASTIC_ON_ONE_MACHINE, "--network-interface", "nosuch0",
                    *digits_flags(digits_data), "--workspace", str(tmp_path / "ws"))
    line = one_line(result)
    assert line.startswith("runner: error: --network-interface nosuch0: this machine has no such interface"), line
    assert "lo" in line.split("it has ")[1]


def test_an_elastic_run_without_hosts_ends_in_one_line(digits_data, tmp_path):
    """A discovery script that finds no host: the driver's wait for --min-np slots ends at --elastic-timeout with
    one line (it was a raw TimeoutException traceback)."""
    script = tmp_path / "no_hosts.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    result = runner("-n", "2", "--min-np", "1", "--host-discovery-script", str(script), "--elastic-timeout", "3",
                    *digits_flags(digits_data), "--workspace", str(tmp_path / "ws"))
    line = one_line(result)
    assert line.startswith("runner: error: horovodrun: the elastic driver waited --elastic-timeout for --min-np "
                           "slots"), line
    assert RESUMES not in line


# --- item 5: the advice after a failure ----------------------------------------------------------------------

def test_a_failure_before_any_checkpoint_does_not_promise_a_resume(digits_data, tmp_path):
    env = dict(venv_env(), PYTHONPATH=INJECTION + os.pathsep + venv_env()["PYTHONPATH"], RN50_INJECT_RANK="0",
               RN50_INJECT_STEP="1")
    result = runner("-n", "1", *digits_flags(digits_data), "--workspace", str(tmp_path / "ws"), env=env)
    assert result.returncode != 0
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("runner: error: rank 0 (host "), line
    assert "RuntimeError: injected fault at step 1" in line
    assert line.endswith("; fix the cause, then rerun"), line  # no checkpoint to resume from


def test_a_refused_configuration_does_not_promise_a_resume(trained):
    """A workspace another run holds, found by rank 0 at start-up (the default workspace: runner does not know
    it), with a checkpoint in it: the same command would be refused again, so no resume is advised."""
    folder, workspace, digits = trained
    with open(workspace / "run.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as a running training holds it
        result = runner("-n", "1", *digits_flags(digits), cwd=folder)
    assert result.returncode != 0
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("runner: error: rank 0 (host "), line
    assert "fix it, then rerun" in line and RESUMES not in line, line
