"""Faults that are not a polite signal (issue 25), each with real processes: a damaged checkpoint, a full disk
while saving, a rank that dies (SIGKILL, an exception on one rank), a rank that stalls (SIGSTOP). Each must end
the same way: in bounded time, with a non-zero status and one line from runner naming the rank, the cause and
what to do, no process of the run left, the workspace lock free, the last complete checkpoint intact, and the
same command resuming from it. The waits below are hang guards only: each says what it waited for."""
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time

import psutil
import pytest

from support.processes import HANG_S, ROOT, run, run_members, run_processes, start, venv_env, wait_until
from support.runs import digits_runner
from support.runs import steps_logged as steps_done

pytestmark = pytest.mark.slow  # launches processes, trains end to end or builds heavy data


INJECTION = os.path.join(ROOT, "tests", "fault_injection")  # its sitecustomize raises on one rank, on request


EXAMPLES = 384


STEPS = EXAMPLES // 64  # steps per epoch: 2 workers x 32


STALL_TIMEOUT = 15  # longer than a loaded machine's slowest legitimate wait for the other rank (a checkpoint save)


def runner_command(digits, workspace, epochs=2, examples=EXAMPLES, extra=()):
    return digits_runner(digits, workspace, 2, 32, epochs, examples, "--warmup-epochs", "0", *extra)


# How runner is started under each launcher: (in front of runner, runner's own flags). Under Slurm runner runs
# once per task of the srun step and takes the world's size from it.
LAUNCHERS = {"horovodrun": ([], []), "mpi": ([], ["--launcher", "mpi"]),
             "slurm": (["srun", "-n", "2", "-t", "10"], ["--launcher", "slurm"])}
RANK_MARKS = {"horovodrun": "HOROVOD_RANK", "mpi": "OMPI_COMM_WORLD_RANK", "slurm": "SLURM_PROCID"}


# Under Slurm srun has the last word: its own lines on each task's end ("srun: error: vm: task 1: Killed") and
# slurmstepd's come after every task's output, runner's line among it.
LAUNCHER_LINES = {"slurm": ("srun: ", "slurmstepd")}


def launched(command, launcher):
    """``command`` (runner_command's) under ``launcher``, and the environment it needs; skips without it."""
    from support.cluster import mpirun_root_env, need_mpi, need_slurm
    if launcher == "horovodrun":
        return command, venv_env()
    if launcher == "mpi":
        need_mpi()
    else:
        need_slurm()
    front, flags = LAUNCHERS[launcher]
    if launcher == "slurm":
        at = command.index("-n")
        command = command[:at] + command[at + 2:]  # the step's size
    return [*front, *command, *flags], mpirun_root_env()


def worker(process, rank, launcher="horovodrun", workspace=None):
    """The training process of ``rank``: the launcher marks it (horovodrun: HOROVOD_RANK, not on its shell;
    mpirun: OMPI_COMM_WORLD_RANK; srun: SLURM_PROCID, on runner too), and it runs train.py. Under Slurm the
    workers are slurmstepd's children, found by their command line naming the ``workspace``."""
    mark = RANK_MARKS[launcher]
    members = run_processes(process) if launcher != "slurm" else run_members(workspace)
    for member in members:
        try:
            if member.environ().get(mark) != str(rank):
                continue
            if launcher == "horovodrun" and member.parent().environ().get(mark) is None or \
                    launcher != "horovodrun" and runs_train_py(member) and not runs_train_py(member.parent()):
                return member
        except psutil.Error:
            pass
    return None


def runs_train_py(member):
    """Whether ``member`` is Python running train.py (not a launcher whose command line names it)."""
    command = member.cmdline()
    return len(command) > 1 and os.path.basename(command[1]) == "train.py"


def members_of(process, launcher, workspace):
    return run_processes(process) + (run_members(workspace) if launcher == "slurm" else [])


def is_dead(member):
    try:
        return member.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def last_line(log_prefix, launcher="horovodrun"):
    """The run's last line on stderr; under srun the last one not srun's own (LAUNCHER_LINES)."""
    lines = [line for line in open(f"{log_prefix}.err").read().strip().splitlines()
             if not line.startswith(LAUNCHER_LINES.get(launcher, ()))]
    return lines[-1] if lines else ""


def assert_ended_cleanly(process, members, workspace):
    """After runner's exit: none of the run's processes left (the workers, the launcher's), the lock free."""
    from rn50kit.reliability import run_lock
    assert process.returncode != 0
    wait_until(lambda: all(is_dead(m) for m in members), "every process of the run to be gone (runner waited for them)",
             5)
    assert run_lock.holder(str(workspace)) is None, "the workspace lock is still held"


def assert_intact(workspace, tag):
    """The newest complete checkpoint is ``tag``, its files whole, and nothing half-written lies about."""
    from rn50kit.weights import checkpoint
    problems = []
    latest = checkpoint.find_latest(str(workspace / "model"), problems=problems)
    assert latest is not None and latest["state_path"] == str(workspace / f"model-{tag}.state.json"), latest
    assert problems == [] and checkpoint.orphans(str(workspace / "model")) == []
    assert not list(workspace.glob(".tmp-*")), sorted(os.listdir(workspace))


def assert_resumes(command, workspace, tag, env=None):
    result = run(command, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"Resuming from {workspace / f'model-{tag}.state.json'}" in result.stderr
    assert not list(workspace.glob(".rn50-faults-*")), "the srun step's records are left in the workspace"
    return result


# --- 4. a damaged checkpoint ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_damaged_checkpoints_are_skipped_with_a_warning_and_refused_for_load(digits_data, tmp_path):
    workspace = tmp_path / "ws"
    examples = 128  # two steps an epoch: four checkpoints quickly
    first = run(runner_command(digits_data, workspace, epochs=4, examples=examples, extra=["--keep-last", "0"]))
    assert first.returncode == 0, first.stderr[-3000:]
    params = {e: workspace / f"model-000{e}.params" for e in range(1, 5)}
    # 4: truncated parameters; 3: its state file edited (still valid JSON); 2: the parameters of the pair lost;
    # 5: parameters without a state file (a save cut short)
    size = params[4].stat().st_size
    with open(params[4], "r+b") as f:
        f.truncate(size // 2)
    state3 = workspace / "model-0003.state.json"
    state3.write_text(state3.read_text().replace('"epoch": 3', '"epoch": 3, "note": 1', 1))
    json.loads(state3.read_text())
    params[2].unlink()
    (workspace / "model-0005.params").write_bytes(params[1].read_bytes())

    # --load of a damaged file: refused before any worker starts, in one line
    for damaged, why in ((params[4], f"is damaged ({size // 2} bytes, {size} when saved)"),
                         (workspace / "model-0005.params", None)):
        if why is None:  # no state beside it: read and found short
            with open(damaged, "r+b") as f:
                f.truncate(1000)
            why = "is damaged or not a parameter file"
        result = run(runner_command(digits_data, workspace, extra=["--mode", "val", "--load", str(damaged)]))
        assert result.returncode == 2, result.stderr[-3000:]
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"train.py: error: {damaged} {why}"), result.stderr[-3000:]
        # train.py alone, no model flags: refused before it takes the state's (or its default) settings
        result = run([sys.executable, os.path.join(ROOT, "train.py"), "--mode", "val", "--load", str(damaged),
                      "--data-root", str(digits_data)])
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
        assert lines[0].startswith(f"train.py: error: {damaged} {why}"), result.stderr[-3000:]

    # --resume auto: back to the newest whole checkpoint, each bad file named once (by rank 0)
    command = runner_command(digits_data, workspace, epochs=5, examples=examples, extra=["--keep-last", "0"])
    result = assert_resumes(command, workspace, "0001")
    warnings = [line for line in result.stderr.splitlines() if "skipping checkpoint" in line]
    expected = {"0002": f"{params[2]} is missing", "0003": f"{state3} is damaged",
                "0004": f"{params[4]} is damaged", "0005": f"{workspace / 'model-0005.params'} has no"}
    assert len(warnings) == len(expected), "\n".join(warnings)
    for tag, named in expected.items():
        assert any(f"skipping checkpoint model-{tag}: {named}" in w and "falling back to " in w for w in warnings)
    assert_intact(workspace, "0005")


# --- 3. a full disk while saving -----------------------------------------------------------------------------

def file_size_limit(limit):
    """For preexec_fn: the run's processes cannot write files beyond ``limit`` bytes (a disk that fills up at
    the next checkpoint). Python ignores SIGXFSZ, so the write fails with EFBIG instead of killing the worker."""
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return apply


@pytest.mark.slow
def test_a_full_disk_while_saving_ends_the_run_keeping_the_last_checkpoint(digits_data, tmp_path):
    workspace = tmp_path / "ws"
    command = runner_command(digits_data, workspace)
    first = run(command + ["--run-epochs", "1"])
    assert first.returncode == 0, first.stderr[-3000:]
    assert_intact(workspace, "0001")
    limit = (workspace / "model-0001.params").stat().st_size // 4  # the logs and reports stay far below it

    process = start(command, tmp_path / "full", preexec_fn=file_size_limit(limit))
    members = wait_until(lambda: worker(process, 1) and run_processes(process), "the workers to start", HANG_S, process)
    try:
        process.wait(timeout=HANG_S)  # hang guard
    finally:
        if process.poll() is None:
            for member in run_processes(process):
                member.kill()
    line = last_line(tmp_path / "full")
    assert line.startswith("runner: error: rank 0 (host "), line
    assert (f"failed: the disk is full: cannot save checkpoint model-0002 in {workspace} (File too large); the "
            f"last complete checkpoint, {workspace / 'model-0001.state.json'}, is intact") in line
    assert "rerun the same command" in line
    assert_ended_cleanly(process, members, workspace)
    assert_intact(workspace, "0001")
    assert not list(workspace.glob("model-0002*"))
    assert_resumes(command, workspace, "0001")
    assert_intact(workspace, "0002")


# --- 2. a rank that dies -------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("fault, launcher", [("SIGKILL", "horovodrun"), ("exception", "horovodrun"),
                                             ("segfault", "horovodrun"), ("SIGKILL", "mpi"), ("SIGKILL", "slurm"),
                                             ("exception", "slurm")])
def test_a_dead_rank_ends_every_rank_with_one_line_naming_it(fault, launcher, digits_data, tmp_path):
    workspace = tmp_path / "ws"
    command, env = launched(runner_command(digits_data, workspace), launcher)
    if fault != "SIGKILL":  # rank 1 raises (or crashes) in its 3rd step of epoch 2
        env = dict(env, PYTHONPATH=INJECTION + os.pathsep + venv_env()["PYTHONPATH"], RN50_INJECT_RANK="1",
                   RN50_INJECT_STEP=str(STEPS + 3), RN50_INJECT_KIND=fault)
    process = start(command, tmp_path / "dead", env=env)
    try:
        victim = wait_until(lambda: worker(process, 0, launcher, workspace) and worker(process, 1, launcher, workspace),
                            "the workers to start", HANG_S, process)
        members = members_of(process, launcher, workspace)
        wait_until(lambda: steps_done(workspace) >= STEPS + 2, f"step {STEPS + 2} (inside epoch 2)", HANG_S, process)
        if fault == "SIGKILL":
            victim.kill()
        ended = time.monotonic()
        process.wait(timeout=HANG_S)  # hang guard
        ended = time.monotonic() - ended
    finally:
        if process.poll() is None:
            for member in run_processes(process):
                member.kill()
    line = last_line(tmp_path / "dead", launcher)
    assert line.startswith("runner: error: rank 1 (host "), line
    assert f", pid {victim.pid}) " in line
    if fault == "SIGKILL":
        assert "was killed by SIGKILL (exit status 137)" in line
    elif fault == "segfault":  # train.py's faulthandler, not MXNet's handler (exit status 255, or a hang in exit())
        assert "crashed (SIGSEGV, a segmentation fault; exit status 139): its Python stack is above" in line
        assert "Fatal Python error: Segmentation fault" in open(tmp_path / "dead.err").read()
    else:
        assert f"failed: RuntimeError: injected fault at step {STEPS + 3}" in line
    assert "the same command resumes" in line or "rerun the same command to resume" in line
    # the other rank's end is one line ("train.py: rank 0: stopped, as the collectives failed ..."), not a Python
    # traceback (Horovod's C++ teardown may still print its own error, or abort)
    assert "[0]<stderr>:Traceback" not in open(tmp_path / "dead.err").read()
    assert_ended_cleanly(process, members, workspace)
    print(f"{fault} under {launcher}: the run ended {ended:.1f} s after the fault, status {process.returncode}")
    assert_intact(workspace, "0001")
    assert_resumes(command, workspace, "0001", env)


# --- 1. a rank that stalls -----------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("stalled, how, launcher", [(1, "SIGSTOP", "horovodrun"), (0, "SIGSTOP", "horovodrun"),
                                                    (1, "hang", "horovodrun"), (1, "SIGSTOP", "mpi"),
                                                    (1, "SIGSTOP", "slurm")])
def test_a_stalled_rank_ends_the_run_after_the_stall_timeout(stalled, how, launcher, digits_data, tmp_path):
    """Inside epoch 2 one worker stops (SIGSTOP: frozen, as a lost machine) or hangs alive (sleeps in its step,
    as on a hung file system): the other waits in its next allreduce, and the watchdogs end the run after
    --stall-timeout, naming the stalled rank (rank 0 also holds the workspace lock)."""
    workspace = tmp_path / "ws"
    command, env = launched(runner_command(digits_data, workspace, extra=["--stall-timeout", str(STALL_TIMEOUT)]),
                            launcher)
    if how == "hang":
        env = dict(env, PYTHONPATH=INJECTION + os.pathsep + venv_env()["PYTHONPATH"], RN50_INJECT_KIND="hang",
                   RN50_INJECT_RANK=str(stalled), RN50_INJECT_STEP=str(STEPS + 3))
    process = start(command, tmp_path / "stall", env=env)
    try:
        victim = wait_until(lambda: worker(process, 1 - stalled, launcher, workspace) and
                            worker(process, stalled, launcher, workspace), "the workers to start", HANG_S, process)
        members = members_of(process, launcher, workspace)
        wait_until(lambda: steps_done(workspace) >= STEPS + 2, f"step {STEPS + 2} (inside epoch 2)", HANG_S, process)
        if how == "SIGSTOP":
            victim.suspend()
        ended = time.monotonic()
        process.wait(timeout=HANG_S)  # hang guard
        ended = time.monotonic() - ended
    finally:
        if process.poll() is None:
            for member in run_processes(process):
                member.kill()
    line = last_line(tmp_path / "stall", launcher)
    assert line.startswith(f"runner: error: rank {stalled} (host "), line
    if how == "SIGSTOP":
        assert f", pid {victim.pid}) stalled: no sign of life for " in line
        assert f"seen by rank {1 - stalled} after " in line
    else:
        assert f", pid {victim.pid}) stalled: stuck in fit.py:" in line and " train_one_epoch" in line
    assert f"without progress (--stall-timeout {STALL_TIMEOUT})" in line
    assert "rerun the same command to resume" in line
    assert_ended_cleanly(process, members, workspace)
    print(f"rank {stalled} {how} under {launcher}: the run ended {ended:.1f} s after")
    assert_intact(workspace, "0001")
    assert_resumes(command, workspace, "0001", env)


# --- 6. a host lost under SSH ---------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("how, launcher", [("worker killed", "horovodrun"), ("connection lost", "horovodrun"),
                                           ("worker killed", "mpi")])
def test_a_lost_host_under_ssh_ends_the_run(how, launcher, digits_data, tmp_path):
    """Two "hosts" (hostA, hostB: loopback addresses, a real sshd) under horovodrun or mpirun (which starts its
    daemons over the same ssh): hostB's worker is killed, or hostB's SSH session is cut (the worker lives on,
    orphaned, as on a network partition). runner names rank 1 on hostB; the orphaned workers save and stop (their
    launcher is gone), none is left; the rerun resumes."""
    from support.cluster import need_mpi, need_ssh_hosts
    need_ssh_hosts()
    if launcher == "mpi":
        need_mpi()
    workspace = tmp_path / "ws"
    # Far more epochs than the test lets run: cut in epoch 2, orphaned workers notice within the watchdog's period
    # (5 s) and stop at a step boundary; with the 2 epochs of the other tests they could finish the run first
    # (and rightly exit 0). The rerun trains one more epoch (--run-epochs), enough to show it resumes.
    flags = ["--launcher", "mpi", "--network-interface", "lo"] if launcher == "mpi" else []
    command = runner_command(digits_data, workspace, epochs=50, extra=["-H", "hostA:1,hostB:1", *flags])
    env = venv_env()
    env.pop("OMP_NUM_THREADS")  # runner sets each worker's share
    process = start(command, tmp_path / "lost", env=env, stdin=subprocess.DEVNULL)

    def rank1():
        for member in run_members(workspace):
            try:
                if member.environ().get(RANK_MARKS[launcher]) == "1" and member.name().startswith("python"):
                    return member
            except psutil.Error:
                pass
    try:
        victim = wait_until(rank1, "rank 1's worker on hostB", HANG_S, process)
        wait_until(lambda: steps_done(workspace) >= STEPS + 2, f"step {STEPS + 2} (inside epoch 2)", HANG_S, process)
        if how == "worker killed":
            victim.kill()
        else:  # the sshd process of hostB's session
            session = victim.parent()
            while session is not None and session.name() != "sshd":
                session = session.parent()
            session.kill()
        ended = time.monotonic()
        process.wait(timeout=HANG_S)  # hang guard
        ended = time.monotonic() - ended
    finally:
        if process.poll() is None:
            for member in run_processes(process) + run_members(workspace):
                member.kill()
    line = last_line(tmp_path / "lost")
    assert process.returncode != 0
    assert line.startswith(f"runner: error: rank 1 (host hostB, pid {victim.pid}) "), line
    assert "rerun the same command to resume" in line
    wait_until(lambda: not run_members(workspace), "no process of the run left on either host")
    from rn50kit.reliability import run_lock
    from rn50kit.weights import checkpoint
    assert run_lock.holder(str(workspace)) is None
    latest = checkpoint.find_latest(str(workspace / "model"))
    print(f"{how} under {launcher}: the run ended {ended:.1f} s after; last checkpoint {latest['state_path']}")
    assert_intact(workspace, os.path.basename(latest["state_path"])[len("model-"):-len(".state.json")])
    result = subprocess.run(command + ["--run-epochs", "1"], env=env, capture_output=True, text=True,
                            timeout=HANG_S, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"Resuming from {latest['state_path']}" in result.stderr


# --- 5. a slow leak over a long run ----------------------------------------------------------------------------

LONG_EPOCHS = 100


def epochs_done(workspace):
    log = workspace / "log.jsonl"
    return sum(1 for line in open(log) if '"type": "epoch"' in line) if log.exists() else 0


@pytest.mark.slow
def test_no_slow_leak_over_100_epochs(digits_data, tmp_path):
    """100 short epochs, 2 workers: the training pipeline rebuilt each epoch (--seed), validation, a checkpoint
    saved (and verified) and the oldest removed each epoch, the log appended. Over the last ten epochs, each
    worker's least resident memory and its median open files and threads stay within a few percent of those over
    epochs 5-14."""
    workspace = tmp_path / "ws"
    command = [sys.executable, os.path.join(ROOT, "runner"), "-n", "2", "-b", "8", "-e", str(LONG_EPOCHS),
               "-l", "0.1", "--dtype", "float32", "--data-backend", "dali-cpu", "--data-root", str(digits_data),
               "--dali-threads", "1", "--dali-validation-threads", "1", "--num-layers", "18", "--num-classes", "10",
               "--image-shape", "3,32,32", "--data-val-resize", "32", "--warmup-epochs", "0", "--num-examples", "32",
               "--seed", "3", "--benchmark-iters", "2", "--workspace", str(workspace)]
    process = start(command, tmp_path / "long")
    samples = {}  # epochs done: [(rss, fds, threads) of rank 0, of rank 1] at every poll
    try:
        workers = wait_until(lambda: [worker(process, r) for r in (0, 1)] if worker(process, 0) and
                           worker(process, 1) else None, "the workers to start", HANG_S, process)
        deadline = time.monotonic() + 1800  # hang guard
        while process.poll() is None and time.monotonic() < deadline:
            done = epochs_done(workspace)
            try:
                sample = [(w.memory_info().rss, w.num_fds(), w.num_threads()) for w in workers]
            except psutil.NoSuchProcess:  # the last epoch: the workers are ending
                sample = None
            if sample and done:
                samples.setdefault(done, []).append(sample)
            time.sleep(0.2)
        process.wait(timeout=HANG_S)
    finally:
        if process.poll() is None:
            for member in run_processes(process):
                member.kill()
    assert process.returncode == 0, open(tmp_path / "long.err").read()[-3000:]
    assert epochs_done(workspace) == LONG_EPOCHS
    # Each epoch's saving and validation add passing allocations (rank 0 serializes the parameters and the optimizer
    # state), so a sample's memory depends on its moment, by up to 10 % here. What a leak raises is the floor: the
    # least of every sample taken over ten epochs, after the first five (MXNet's and DALI's pools fill up) and at the
    # end. Threads and open files go down and up as each epoch's pipelines are rebuilt (15 to 22 threads), so theirs
    # is the median: a pipeline, a reader or a file kept each epoch would add 85 to it.
    early = [s for e in range(5, 15) for s in samples.get(e, [])]
    late = [s for e in range(LONG_EPOCHS - 11, LONG_EPOCHS) for s in samples.get(e, [])]
    assert sum(e in samples for e in range(5, 15)) >= 5 and \
        sum(e in samples for e in range(LONG_EPOCHS - 11, LONG_EPOCHS)) >= 5, sorted(samples)
    for rank in (0, 1):
        (rss_early, fds_early, threads_early), (rss_late, fds_late, threads_late) = (
            (min(s[rank][0] for s in part), statistics.median(s[rank][1] for s in part),
             statistics.median(s[rank][2] for s in part)) for part in (early, late))
        floors = [min((s[rank][0] for e in range(first, first + 10) for s in samples.get(e, [])), default=0)
                  for first in range(0, LONG_EPOCHS, 10)]
        print(f"rank {rank}, least MiB per ten epochs: {[round(f / 2**20) for f in floors]}")
        print(f"rank {rank}, epochs 5-14: least {rss_early / 2**20:.0f} MiB, median {fds_early} fds and "
              f"{threads_early} threads; epochs {LONG_EPOCHS - 11}-{LONG_EPOCHS - 1}: {rss_late / 2**20:.0f} MiB, "
              f"{fds_late} fds, {threads_late} threads")
        assert rss_late <= rss_early * 1.05, f"rank {rank}: resident memory grew from {rss_early} to {rss_late}"
        assert fds_late <= fds_early + 4, f"rank {rank}: open file descriptors grew from {fds_early} to {fds_late}"
        assert threads_late <= threads_early + 4, f"rank {rank}: threads grew from {threads_early} to {threads_late}"
    assert len(list(workspace.glob("*.state.json"))) == 3  # --keep-last
