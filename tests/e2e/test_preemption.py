"""Preemption and interruption: SIGTERM to every process of a two-worker run mid-epoch, SIGKILL of everything, a
busy workspace, Ctrl-C on train.py and runner, a run lock whose holder died. A stopped run and its rerun report
exactly what one uninterrupted run reports."""
import json
import os
import shutil
import signal
import subprocess
import sys

import psutil
import pytest

from support.cluster import need_ssh_hosts
from support.processes import HANG_S, ROOT, catches_signal, pid_gone, run, run_processes, start, wait_until
from support.runs import digits_runner, metrics, steps_logged
from support.runs import steps_logged as steps_done

pytestmark = pytest.mark.slow  # launches processes or trains end to end


EPOCHS = 2


EXAMPLES = 384


STEPS = EXAMPLES // 64  # steps per epoch: 2 workers x 32


COMPARED = ("train.loss", "train.top1", "train.top5", "val.top1", "val.top5", "val.loss")


def runner_command(digits, workspace, examples=EXAMPLES):
    return digits_runner(digits, workspace, 2, 32, EPOCHS, examples, "--warmup-epochs", "1", "--min-random-area",
                         "0.5")


def wait_for_steps(process, workspace, count):
    wait_until(lambda: steps_done(workspace) >= count, f"step {count} in {workspace / 'log.jsonl'}", process=process)


def signal_every_process(process, sig):
    for member in run_processes(process):
        try:
            member.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def rank0_worker(process):
    for member in run_processes(process):
        try:
            if member.environ().get("HOROVOD_RANK") == "0" and member.parent().environ().get("HOROVOD_RANK") is None:
                return member
        except psutil.Error:
            pass
    return None


def assert_same_report(resumed, reference):
    for key in COMPARED:
        assert len(resumed[key]) == EPOCHS, key
    # Same seed, same batches, each rank's own partial sums restored: the same numbers. Only the validation
    # loss may differ in the last digits: the BatchNorm statistics are averaged over the ranks at the stop as
    # well as at the epoch's end, which reorders additions (the predictions, hence top-1/top-5, stay the same).
    for key in ("train.loss", "train.top1", "train.top5", "val.top1", "val.top5"):
        assert resumed[key] == reference[key], key
    assert resumed["val.loss"] == pytest.approx(reference["val.loss"], rel=1e-6), "val.loss"


@pytest.fixture(scope="module")
def reference(digits_data, tmp_path_factory):
    workspace = tmp_path_factory.mktemp("uninterrupted")
    result = run(runner_command(digits_data, workspace))
    assert result.returncode == 0, result.stderr[-3000:]
    return metrics(workspace)


@pytest.mark.parametrize("target", ["every process", "runner alone", "every process under mpirun",
                                    "runner alone, workers over SSH"])
def test_sigterm_mid_epoch_exits_0_and_rerun_reports_the_same(target, reference, digits_data, tmp_path):
    """Under mpirun, mpirun signalled itself kills the workers after Open MPI's grace: runner sets one long enough
    for the save (the fault campaign, seed 100032: with Open MPI's 1 s the save was lost). With every worker on
    another host (horovodrun over SSH, which passes no signal on), runner sends the stop over SSH: before, the run
    went on to its end."""
    workspace = tmp_path / "ws"
    steps = STEPS * (4 if target.endswith("over SSH") else 1)  # the stop goes over SSH: room for its way there
    command = runner_command(digits_data, workspace, steps * 64)
    if target.endswith("mpirun"):
        if shutil.which("mpirun") is None:
            pytest.skip("needs Open MPI's mpirun (tools/ci_services.sh installs it)")
        command += ["--launcher", "mpi"]
    if target.endswith("over SSH"):
        need_ssh_hosts()
        command += ["-H", "hostA:1,hostB:1"]
    process = start(command, tmp_path / "stopped")
    try:
        wait_for_steps(process, workspace, steps + 2)  # inside the second epoch
        if target.startswith("every process"):  # Slurm's scancel, a preemption, a time limit
            signal_every_process(process, signal.SIGTERM)
        else:  # a user's kill: runner passes it on to the workers
            process.send_signal(signal.SIGTERM)
        status = process.wait(timeout=HANG_S)
    finally:
        if process.poll() is None:
            signal_every_process(process, signal.SIGKILL)
    err = (tmp_path / "stopped.err").read_text()
    assert status == 0, err[-3000:]
    assert err.strip().splitlines()[-1] == \
        "runner: stopped by signal after saving a checkpoint; rerun the same command to resume"
    states = sorted(workspace.glob("model-0001-step*.state.json"))
    assert len(states) == 1, sorted(os.listdir(workspace))
    state = json.loads(states[0].read_text())
    assert 2 <= state["step"] < steps
    assert len(state["partial_ranks"]) == 2 and state["partial_ranks"][0] != state["partial_ranks"][1]
    assert json.loads((workspace / "run.lock").read_text())["state"] == "stopped"
    if target != "every process":
        return  # the checkpoint is the same kind: one rerun (below) is enough to check resuming from it

    result = run(command)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"Resuming from {states[0]}" in result.stderr
    assert_same_report(metrics(workspace), reference)


@pytest.fixture(scope="module")
def killed_run(digits_data, tmp_path_factory):
    """A run killed outright (SIGKILL to every process) in its second epoch; before that, while it trained, a
    second run on its workspace was tried through runner and through train.py directly."""
    base = tmp_path_factory.mktemp("killed")
    workspace = base / "ws"
    command = runner_command(digits_data, workspace)
    process = start(command, base / "first")
    try:
        wait_for_steps(process, workspace, 2)
        holder = rank0_worker(process)
        # The run is paused while the second ones start (several seconds each), or it would finish meanwhile;
        # a paused rank 0 still holds the workspace's lock.
        paused = run_processes(process)
        for each in paused:
            each.suspend()
        try:
            through_runner = run(command, timeout=HANG_S)
            through_train = run([sys.executable, os.path.join(ROOT, "train.py"), "--data-backend", "dali-cpu",
                                 "--data-train", str(digits_data / "train.rec"),
                                 "--data-train-idx", str(digits_data / "train.idx"),
                                 "--num-layers", "18", "--num-classes", "10", "--image-shape", "3,32,32",
                                 "--batch-size", "32", "--num-epochs", "1", "--workspace", str(workspace)],
                                timeout=HANG_S)
        finally:
            for each in paused:
                each.resume()
        wait_for_steps(process, workspace, STEPS + 2)
        signal_every_process(process, signal.SIGKILL)
        process.wait(timeout=HANG_S)
    finally:
        if process.poll() is None:
            signal_every_process(process, signal.SIGKILL)
    return {"workspace": workspace, "command": command, "holder": holder, "through_runner": through_runner,
            "through_train": through_train}


def test_a_second_run_on_a_busy_workspace_is_refused_naming_the_holder(killed_run):
    holder = killed_run["holder"]
    assert holder is not None
    for result in (killed_run["through_runner"], killed_run["through_train"]):
        assert result.returncode == 2, result.stderr[-3000:]
        assert "Traceback" not in result.stderr
        refusal = [line for line in result.stderr.splitlines() if "is in use by" in line]
        assert len(refusal) == 1, result.stderr[-3000:]
        assert f"pid {holder.pid} on host " in refusal[0] and "run.lock" in refusal[0]
    # runner refuses before it starts any worker: its one line is all there is
    runner_lines = killed_run["through_runner"].stderr.strip().splitlines()
    assert len(runner_lines) == 1 and runner_lines[0].startswith("runner: error: workspace ")


def test_sigkill_of_everything_then_rerun_reports_the_same(killed_run, reference):
    workspace = killed_run["workspace"]
    record = json.loads((workspace / "run.lock").read_text())
    assert record["state"] == "running" and record["pid"] == killed_run["holder"].pid  # left by the dead run
    # The kernel finishes killing a process after the signal (and after runner, its ancestor, is reaped): its
    # threads exit, then its files (and so the lock) are released. The lock must come free by itself.
    wait_until(lambda: pid_gone(record["pid"]), f"the SIGKILLed rank-0 worker (pid {record['pid']}) to die")
    from rn50kit.reliability import run_lock
    wait_until(lambda: run_lock.holder(workspace) is None, f"the dead run's lock on {workspace} to come free")
    result = run(killed_run["command"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Resuming from" in result.stderr
    assert_same_report(metrics(workspace), reference)


# --- the parts on their own ---------------------------------------------------------------------------------

HOLD = """
import sys, time
sys.path.insert(0, sys.argv[2])
from rn50kit.reliability import run_lock
run_lock.WorkspaceLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(600)
"""


def test_lock_names_its_live_holder_and_is_taken_over_once_the_holder_is_killed(tmp_path):
    from rn50kit.reliability import run_lock
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path), ROOT], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert run_lock.holder(str(tmp_path))["pid"] == holder.pid
        with pytest.raises(run_lock.WorkspaceBusy, match=f"in use by pid {holder.pid} on host "):
            run_lock.WorkspaceLock(str(tmp_path)).acquire(patience_s=0.2)
    finally:
        holder.kill()  # as the OOM killer would: no clean-up
        holder.wait()
    assert run_lock.holder(str(tmp_path)) is None
    lock = run_lock.WorkspaceLock(str(tmp_path))
    assert lock.acquire(patience_s=0)
    record = run_lock.read_record(run_lock.lock_path(str(tmp_path)))
    assert record["pid"] == os.getpid() and record["state"] == "running"
    lock.finish("done")
    assert run_lock.read_record(run_lock.lock_path(str(tmp_path)))["state"] == "done"
    lock.release()


def test_partial_sums_go_back_to_their_ranks_or_to_rank_0_with_another_worker_count():
    from types import SimpleNamespace

    from rn50kit.training.state import PARTIAL_KEYS, resumed_partial, sum_partial

    def rank(r, size):
        return SimpleNamespace(rank=r, size=size, is_primary=r == 0)

    sums = [dict(zip(PARTIAL_KEYS, [1.5, 2, 40, 60, 64])), dict(zip(PARTIAL_KEYS, [2.25, 2, 30, 58, 64]))]
    state = {"partial": sum_partial(sums), "partial_ranks": sums}
    assert [resumed_partial(state, rank(r, 2)) for r in (0, 1)] == sums
    # Four workers now: rank 0 carries both ranks' sums, so each sample still counts once in the epoch.
    assert resumed_partial(state, rank(0, 4)) == dict(zip(PARTIAL_KEYS, [3.75, 4, 70, 118, 128]))
    assert [resumed_partial(state, rank(r, 4)) for r in (1, 2, 3)] == [None] * 3
    # A checkpoint from before per-rank sums: only rank 0 starts from them (they used to be given to every rank).
    old = {"partial": sums[0]}
    assert resumed_partial(old, rank(0, 2)) == sums[0] and resumed_partial(old, rank(1, 2)) is None
    assert resumed_partial({"partial": None}, rank(0, 2)) is None


def test_a_stop_signal_during_start_up_saves_at_the_first_step(digits_data, tmp_path):
    """A SIGTERM while the worker starts (importing MXNet, building the model and data pipelines) is kept, not
    fatal: as Slurm's --signal early warning can come at any time."""
    workspace = tmp_path / "ws"
    command = [sys.executable, os.path.join(ROOT, "train.py"), "--data-backend", "dali-cpu", "--dali-threads", "1",
               "--data-train", str(digits_data / "train.rec"), "--data-train-idx", str(digits_data / "train.idx"),
               "--num-layers", "18", "--num-classes", "10", "--image-shape", "3,32,32", "--batch-size", "32",
               "--num-epochs", "1", "--num-examples", "320", "--seed", "3", "--workspace", str(workspace)]
    process = start(command, tmp_path / "run")
    try:
        # As soon as train.py keeps stop signals (its first lines, before it imports MXNet): signalled earlier,
        # Python's default action would end it, as it ends any program that has not started yet.
        wait_until(lambda: catches_signal(process.pid, signal.SIGTERM), "train.py to catch SIGTERM",
                   process=process, interval=0.005)
        process.send_signal(signal.SIGTERM)
        status = process.wait(timeout=HANG_S)
    finally:
        if process.poll() is None:
            process.kill()
    assert status == 0, (tmp_path / "run.err").read_text()[-3000:]
    assert "Stopped by signal after saving a checkpoint" in (tmp_path / "run.out").read_text()
    assert [p.name for p in workspace.glob("*.state.json")] == ["model-0000-step000001.state.json"]


def start_train(tmp_path, *flags):
    import subprocess
    import sys

    from support.processes import ROOT, venv_env
    from support.runs import TINY_RUN
    out, err = open(tmp_path / "run.out", "w"), open(tmp_path / "run.err", "w")
    command = [sys.executable, os.path.join(ROOT, "train.py"), *TINY_RUN, "--batch-size", "8", "--disp-batches", "1",
               "--workspace", str(tmp_path / "ws"), "--warmup-epochs", "0", *flags]
    return subprocess.Popen(command, env=venv_env(), stdout=out, stderr=err, text=True, start_new_session=True)


@pytest.mark.slow
def test_ctrl_c_on_train_py_saves_a_step_checkpoint_and_exits_130(tmp_path):
    """Found by the second newcomer walk (issue 26)."""
    import signal

    from rn50kit.reliability import run_lock
    from support.processes import HANG_S, wait_until
    process = start_train(tmp_path, "--num-epochs", "2", "--num-examples", "100000")
    try:
        wait_until(lambda: steps_logged(tmp_path / "ws") >= 2, "two training steps", process=process)
        process.send_signal(signal.SIGINT)
        status = process.wait(timeout=HANG_S)
    finally:
        if process.poll() is None:
            process.kill()
    err = (tmp_path / "run.err").read_text()
    assert status == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert "Stopped by Ctrl-C (SIGINT) after saving a checkpoint" in (tmp_path / "run.out").read_text()
    assert [p.name.split("-step")[0] for p in (tmp_path / "ws").glob("model-*-step*.state.json")] == ["model-0000"]
    assert run_lock.run_state(str(tmp_path / "ws"))["state"] == "stopped"


@pytest.mark.slow
def test_ctrl_c_during_start_up_is_one_line_and_130(tmp_path):
    """Found by the second newcomer walk (issue 26)."""
    import signal

    from support.processes import HANG_S, catches_signal, wait_until
    process = start_train(tmp_path, "--num-epochs", "1")
    try:
        wait_until(lambda: catches_signal(process.pid, signal.SIGTERM), "train.py to catch SIGTERM",
                   process=process, interval=0.005)  # its first lines, where SIGINT gets its handler too
        process.send_signal(signal.SIGINT)
        status = process.wait(timeout=HANG_S)
    finally:
        if process.poll() is None:
            process.kill()
    err = (tmp_path / "run.err").read_text()
    assert status == 130 and err.strip().splitlines()[-1].startswith("train.py: interrupted (Ctrl-C)"), err[-3000:]
    assert "Traceback" not in err


HOLD_THEN = """
import sys, time
sys.path.insert(0, sys.argv[2])
from rn50kit.reliability import run_lock
run_lock.WorkspaceLock(sys.argv[1]).acquire()
print("held", flush=True)
if sys.argv[3] == "fail":
    raise RuntimeError("a crash")
time.sleep(600)
"""


@pytest.mark.slow
def test_a_lock_whose_holder_crashed_or_was_killed_does_not_read_running(tmp_path):
    """Found by the second newcomer walk (issue 26)."""
    import subprocess
    import sys

    from rn50kit.reliability import run_lock
    from support.processes import HANG_S, ROOT, pid_gone, wait_until
    failed, killed = tmp_path / "failed", tmp_path / "killed"
    failed.mkdir(), killed.mkdir()
    result = subprocess.run([sys.executable, "-c", HOLD_THEN, str(failed), ROOT, "fail"], capture_output=True,
                            text=True, timeout=HANG_S)
    assert result.returncode == 1 and run_lock.run_state(str(failed))["state"] == "failed"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THEN, str(killed), ROOT, "sleep"], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert run_lock.run_state(str(killed))["state"] == "running"  # alive: it is
    finally:
        holder.kill()  # SIGKILL: nothing of it runs again
        holder.wait()
    wait_until(lambda: pid_gone(holder.pid), "the killed holder to be gone")
    assert run_lock.read_record(run_lock.lock_path(str(killed)))["state"] == "running"  # what it last wrote
    assert run_lock.run_state(str(killed))["state"] == "crashed"
    shown = subprocess.run([sys.executable, "-m", "rn50kit.reliability.run_lock", str(killed)], cwd=ROOT,
                           capture_output=True, text=True, timeout=HANG_S)
    assert '"state": "crashed"' in shown.stdout


@pytest.mark.slow
def test_runner_exits_130_on_ctrl_c_after_the_workers_saved(tmp_path):
    """Found by the second newcomer walk (issue 26)."""
    import signal
    import subprocess
    import sys

    from support.processes import HANG_S, ROOT, venv_env, wait_until
    from support.runs import TINY_RUN
    workspace = tmp_path / "ws"
    out, err = open(tmp_path / "run.out", "w"), open(tmp_path / "run.err", "w")
    process = subprocess.Popen([sys.executable, os.path.join(ROOT, "runner"), "-n", "1", "-b", "8", "-e", "2",
                                *TINY_RUN, "--num-examples", "100000", "--warmup-epochs", "0", "--disp-batches", "1",
                                "--workspace", str(workspace)], env=venv_env(), stdout=out, stderr=err, text=True,
                               start_new_session=True)
    try:
        wait_until(lambda: steps_logged(workspace) >= 2, "two training steps", process=process)
        process.send_signal(signal.SIGINT)  # runner alone: what a terminal's Ctrl-C sends it
        status = process.wait(timeout=HANG_S)
    finally:
        if process.poll() is None:
            process.kill()
    err = (tmp_path / "run.err").read_text()
    assert status == 130, err[-3000:]
    assert "runner: stopped by Ctrl-C after saving a checkpoint" in err and "Traceback" not in err
    assert list(workspace.glob("model-0000-step*.state.json"))
