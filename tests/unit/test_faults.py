"""faults: runner names the first real fault of a run, not its teardown."""
import json
import os
import tempfile
import time

import pytest

# --- runner's reading of the workers' records (no processes) -------------------------------------------------

def test_runner_names_the_first_real_fault_not_the_teardown(tmp_path):
    from rn50kit.reliability import faults

    def write(rank, **fields):
        (tmp_path / f"rank-{rank}.json").write_text(json.dumps(dict(rank=rank, host=f"node{rank}", pid=100 + rank,
                                                                    **fields)))
    write(0, kind="teardown", failure="MXNetError: Horovod has been shut down", failed=10.0, alive=9.0)
    write(1, alive=9.5)
    # rank 1 died of SIGKILL: no failure of its own; the launcher saw it end first
    assert faults.summarize(str(tmp_path), (1, 137)).startswith(
        "rank 1 (host node1, pid 101) was killed by SIGKILL (exit status 137): ")
    # an error recorded by any rank wins over the launcher's order and over teardown
    write(1, kind="error", failure="RuntimeError: boom", failed=11.0)
    assert faults.summarize(str(tmp_path), (0, 1)).startswith(
        "rank 1 (host node1, pid 101) failed: RuntimeError: boom (its message is above)")
    # a teardown whose worker saw a silent peer (Gloo's timeout came before the watchdog)
    write(1, alive=1.0)
    write(0, kind="teardown", failure="MXNetError: Horovod has been shut down", failed=40.0,
          silent=[dict(rank=1, host="node1", pid=101, alive=1.0, silent_for=39.0)])
    assert faults.summarize(str(tmp_path), (0, 1)).startswith(
        "rank 1 (host node1, pid 101) stalled: no heartbeat for 39 s")
    assert faults.summarize(str(tmp_path / "none"), None) is None
    assert faults.signal_name(137) == "SIGKILL" and faults.signal_name(-15) == "SIGTERM"
    assert faults.signal_name(1) is None


def test_the_launchers_name_for_a_host_wins_and_stands_in_for_a_missing_record(tmp_path):
    from rn50kit.reliability import faults
    (tmp_path / "rank-1.json").write_text(json.dumps(dict(rank=1, host="vm", pid=101, alive=9.5)))
    # mpirun names the host as -H did (the worker's own name may be another)
    assert faults.summarize(str(tmp_path), (1, 137), {"rank": 1, "host": "hostB"}).startswith(
        "rank 1 (host hostB, pid 101) was killed by SIGKILL (exit status 137): ")
    # a worker that died before writing its record: what its srun task knows of it
    line = faults.summarize(str(tmp_path), (0, 137), {"rank": 0, "host": "vm", "pid": 7}, ended="srun ends it")
    assert line.startswith("rank 0 (host vm, pid 7) was killed by SIGKILL") and "; srun ends it; " in line


def test_an_elastic_reset_renumbers_the_record_and_drops_those_beyond_the_world(tmp_path, monkeypatch):
    """Rank 1 of 3 becomes rank 0 of 2 (the fault campaign, seed 100043: a disk full after the reset was blamed on
    'rank 1'): its record moves, the record of the rank gone beyond the new world is removed, and a later fault names
    the rank it has now."""
    import time

    from rn50kit.reliability import faults
    old = time.time() - 60
    for rank in (0, 2):  # rank 0 was lost (its record stale); rank 2 became rank 1
        (tmp_path / f"rank-{rank}.json").write_text(json.dumps(dict(rank=rank, host=f"node{rank}", pid=100 + rank,
                                                                    alive=old)))
    import sys
    for name in ("_record", "_path"):  # install sets them: put back as they were after the test
        monkeypatch.setattr(faults, name, None)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    faults.install(1, {faults.FAULTS_ENV: str(tmp_path), "HOROVOD_HOSTNAME": "node1"})
    faults.renumber(0, 2)
    assert not (tmp_path / "rank-2.json").exists()  # beyond the new world
    # the worker that was rank 2 takes rank 1 (its renumber writes the file this worker left)
    (tmp_path / "rank-1.json").write_text(json.dumps(dict(rank=1, host="node2", pid=102, alive=time.time())))
    records = faults.read_all(str(tmp_path))
    assert sorted(records) == [0, 1] and records[0]["pid"] == os.getpid() and records[0]["host"] == "node1"
    assert records[1]["pid"] == 102 and faults.silent_ranks(folder=str(tmp_path)) == []
    faults.record_failure("the disk is full", "error")
    line = faults.summarize(str(tmp_path), (0, 2))
    assert line.startswith(f"rank 0 (host node1, pid {os.getpid()}) failed: the disk is full"), line


def forwarded_by_horovod(lines, rank):
    """``lines`` as Horovod's own forwarding (safe_shell_exec.prefix_connection) writes a worker's stderr to
    runner's sys.stderr, here a horovodrun.CrashWatch: the watch."""
    import io
    import multiprocessing

    from horovod.runner.common.util import safe_shell_exec

    from rn50kit.launch.launchers import horovodrun
    watch = horovodrun.CrashWatch(io.StringIO())
    reader, writer = multiprocessing.Pipe(duplex=False)
    os.write(writer.fileno(), "".join(line + "\n" for line in lines).encode())
    writer.close()
    safe_shell_exec.prefix_connection(reader, watch, "stderr", rank, False)
    assert watch.stream.getvalue().splitlines() == [f"[{rank}]<stderr>:{line}" for line in lines]  # passed on
    return watch


HOROVOD_FAILED = ("Horovod detected that one or more processes exited with non-zero status, thus causing the job "
                  "to be terminated. The first process to do so was:\nProcess name: {rank}\nExit code: 255\n")


@pytest.mark.parametrize("crashed", [True, False])
def test_over_ssh_a_crash_is_told_from_a_lost_connection_by_the_workers_own_output(crashed, tmp_path):
    """ssh's status is 255 whether the worker crashed or the connection was lost: faulthandler's first line in the
    worker's forwarded output (train.py enables it) names the crash."""
    from rn50kit.launch import supervision
    from rn50kit.launch.launchers import horovodrun
    from rn50kit.reliability import faults
    (tmp_path / "rank-0.json").write_text(json.dumps(dict(rank=0, host="hostA", pid=7, alive=9.5)))
    output = ["Fatal Python error: Segmentation fault", "", "Current thread 0x00007f (most recent call first):"]
    watch = forwarded_by_horovod(output if crashed else ["Connection to hosta closed by remote host."], 0)
    forwarded_by_horovod(["Fatal Python error: Aborted"], 1)  # another rank's crash is its own
    ended = horovodrun.failed_run(RuntimeError(HOROVOD_FAILED.format(rank=0)), supervision.StopRelay(), watch.seen)
    line = faults.summarize(str(tmp_path), ended.first_failed, ended.known, resumable=False)
    if crashed:
        assert line.startswith("rank 0 (host hostA, pid 7) crashed (SIGSEGV, a segmentation fault; exit status "
                               "255): its Python stack is above"), line
    else:
        assert line.startswith("rank 0 (host hostA, pid 7) exited with status 255 (ssh's: the connection to its "
                               "host ended"), line


def test_a_run_that_rank_0_finished_after_its_launcher_failed_ends_well_with_a_note(tmp_path, capsys):
    """A worker cut off from runner (its SSH session lost) lives on and may finish the run: runner ends with status
    0 and one note naming the failure, not an error and advice to rerun."""
    from rn50kit.launch import supervision
    (tmp_path / "rank-0.json").write_text(json.dumps(dict(rank=0, host="hostA", pid=7, alive=9.5)))
    ended = supervision.Ended(255, "worker 0 exited with status 255; its message is above", (0, 255))
    summary = supervision.failure_summary(ended, str(tmp_path), None, finished=True)
    assert supervision.conclude(ended.status, ended.failure, "done", summary) == 0
    line = capsys.readouterr().err.strip()
    assert line.startswith("runner: note: rank 0 (host hostA, pid 7) exited with status 255 (ssh's") and \
        line.endswith(supervision.FINISHED_ALL_THE_SAME) and "rerun" not in line, line
    summary = supervision.failure_summary(ended, str(tmp_path), None, finished=False)
    assert supervision.conclude(ended.status, ended.failure, None, summary) == 255  # not finished: the error
    assert capsys.readouterr().err.startswith("runner: error: rank 0 (host hostA, pid 7) exited with status 255")


WORKER_ENV = {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"}  # as horovodrun starts a worker (world.launched_world)
HOLDS_THE_WORKSPACE = """import sys, time
sys.path.insert(0, sys.argv[1])
from rn50kit.reliability import run_lock
run_lock.WorkspaceLock(sys.argv[2]).acquire()
print("held", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("case", ["stopped", "running", "stopped, not of this run", "stopped, not holding it"])
def test_a_stopped_worker_of_the_run_is_ended_at_once(case, tmp_path, capsys):
    """A worker reached over SSH (to a name of this machine) is outside the Reaper's reach; stopped (SIGSTOP), it
    would never end (holding the workspace, or left behind: the fault campaign, seeds 100015 and 100074): runner
    ends it at once when it is this run's (its environment names the run's records' folder), and waits for any
    other holder."""
    import signal
    import subprocess
    import sys

    import psutil

    from rn50kit.launch import supervision
    from rn50kit.reliability import faults, run_lock
    from support.processes import ROOT, wait_until
    fault_dir, workspace = tmp_path / "faults", tmp_path / "ws"
    fault_dir.mkdir()
    workspace.mkdir()
    held = str(workspace if case != "stopped, not holding it" else tmp_path / "elsewhere")
    os.makedirs(held, exist_ok=True)
    ours = str(fault_dir) if case != "stopped, not of this run" else str(tmp_path / "another run's")
    worker = subprocess.Popen([sys.executable, "-c", HOLDS_THE_WORKSPACE, ROOT, held], stdout=subprocess.PIPE,
                              text=True, env=dict(os.environ, **WORKER_ENV, **{faults.FAULTS_ENV: ours}))
    (fault_dir / "rank-1.json").write_text(json.dumps(dict(rank=1, host="hostB", pid=worker.pid)))
    try:
        assert worker.stdout.readline() == "held\n"
        if case != "running":
            os.kill(worker.pid, signal.SIGSTOP)  # delivered when the kernel next runs it (later on a busy machine)
            wait_until(lambda: psutil.Process(worker.pid).status() == psutil.STATUS_STOPPED, "the worker stopped")
        supervision.wait_for_workspace(str(workspace), str(fault_dir), patience_s=1.0)
        err = capsys.readouterr().err
        if case.startswith("stopped") and case != "stopped, not of this run":
            assert worker.poll() is not None and run_lock.holder(str(workspace)) is None
            assert f"runner: note: ended rank 1 (host hostB, pid {worker.pid}), a worker of this run that was " \
                   "stopped (SIGSTOP" in err
            assert "waiting for" not in err
        else:
            assert worker.poll() is None and run_lock.holder(str(workspace))["pid"] == worker.pid
            assert f"runner: note: pid {worker.pid} on host " in err and "still holds" in err and "ended" not in err
    finally:
        worker.kill()
        worker.wait()


def test_the_reaper_ends_a_stopped_worker_once_another_found_it_stalled(tmp_path, capsys):
    """An elastic run whose worker is stopped: the other's watchdog names it and ends itself, and Horovod's elastic
    driver would wait for the stopped one's state for ever (the fault campaign, seeds 100024, 100026): once a
    "stall" record is written, runner ends the stopped worker, and the driver counts it failed."""
    import signal
    import subprocess
    import sys

    import psutil

    from rn50kit.launch import supervision
    from rn50kit.reliability import faults
    from support.processes import wait_until
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                              env=dict(os.environ, **WORKER_ENV, **{faults.FAULTS_ENV: str(tmp_path)}))
    reaper = supervision.Reaper(str(tmp_path))
    try:
        os.kill(worker.pid, signal.SIGSTOP)
        wait_until(lambda: psutil.Process(worker.pid).status() == psutil.STATUS_STOPPED, "the worker stopped")
        time.sleep(1.5)  # three of the Reaper's looks: a stopped worker alone is left (a debugger's, a Ctrl-Z)
        assert worker.poll() is None
        (tmp_path / "rank-0.json").write_text(json.dumps(dict(rank=0, host="vm", pid=1, kind="stall", failed=1.0,
                                                              failure="rank 1 stalled")))
        wait_until(lambda: worker.poll() is not None, "the stopped worker ended")
        assert f"runner: note: ended pid {worker.pid}, a worker of this run that was stopped" in \
            capsys.readouterr().err
    finally:
        reaper.finish(patience_s=1.0)
        worker.kill()
        worker.wait()


# --- under srun: the step's shared folder, one report -----------------------------------------------------------

def test_one_task_of_an_srun_step_reports_and_stale_steps_are_removed(tmp_path):
    from rn50kit.reliability import faults
    environ = {"SLURM_JOB_ID": "66", "SLURM_STEP_ID": "0"}
    folder = faults.step_directory(str(tmp_path), environ)
    assert folder == str(tmp_path / ".rn50-faults-66.0.0")  # a requeued job's step: SLURM_RESTART_COUNT
    assert faults.step_directory(str(tmp_path), dict(environ, SLURM_RESTART_COUNT="1")).endswith("-66.0.1")
    assert faults.step_directory(None, environ) == os.path.join(tempfile.gettempdir(), ".rn50-faults-66.0.0")
    os.makedirs(folder)
    assert not faults.reported(folder)
    assert faults.claim_report(folder) and not faults.claim_report(folder) and faults.reported(folder)
    assert faults.reported(str(tmp_path / "gone")) and not faults.claim_report(str(tmp_path / "gone"))
    old, recent, failed = (tmp_path / f".rn50-faults-{job}.0.0" for job in (65, 64, 63))
    for earlier in (old, recent, failed):
        earlier.mkdir()
    (failed / faults.REPORTED).touch()
    os.utime(old, (1000.0, 1000.0))
    os.utime(recent, (1000.0 + faults.STALE_S, 1000.0 + faults.STALE_S))
    os.utime(folder, (1000.0, 1000.0))
    faults.remove_stale_steps(folder, now=1001.0 + faults.STALE_S)
    # the old one and the reported one go; a recent one (another step's) and this step's own (however old) stay
    assert sorted(p.name for p in tmp_path.iterdir()) == [".rn50-faults-64.0.0", ".rn50-faults-66.0.0"]


def test_a_step_folder_whose_removal_was_cut_short_is_removed_by_the_next_step(tmp_path, monkeypatch):
    """srun ends a failed step's tasks at once: the task that reported may die part-way through removing the
    step's records (its REPORTED mark gone, a record left); the next step's rank 0 still removes what is left."""
    from rn50kit.reliability import faults
    failed = str(tmp_path / ".rn50-faults-70.0.0")
    os.makedirs(failed)
    for name in ("rank-0.json", "rank-1.json"):
        open(os.path.join(failed, name), "w").close()
    assert faults.claim_report(failed)

    def killed_part_way(path, ignore_errors=False):
        os.remove(os.path.join(path, faults.REPORTED))
        raise SystemExit("SIGKILL")
    monkeypatch.setattr(faults.shutil, "rmtree", killed_part_way)
    with pytest.raises(SystemExit):
        faults.remove_step(failed)
    monkeypatch.undo()
    assert not faults.claim_report(failed)  # the step's name is free: its other tasks do not report again
    assert len(list(tmp_path.iterdir())) == 1  # what the killed task left
    following = str(tmp_path / ".rn50-faults-71.0.0")
    os.makedirs(following)
    faults.remove_stale_steps(following)
    assert [p.name for p in tmp_path.iterdir()] == [".rn50-faults-71.0.0"]


def test_tasks_whose_workers_ended_well_leave_nothing_of_the_step(tmp_path):
    """Each task removes its worker's record, and a temporary one its worker was writing as it exited; the last
    task out removes the folder."""
    from rn50kit.reliability import faults
    folder = tmp_path / ".rn50-faults-72.0.0"
    folder.mkdir()
    for name in ("rank-0.json", "rank-0.json.4242.tmp", "rank-1.json", "rank-10.json"):
        (folder / name).touch()
    faults.leave_step(str(folder), 0)
    assert sorted(p.name for p in folder.iterdir()) == ["rank-1.json", "rank-10.json"]
    faults.leave_step(str(folder), 1)
    faults.leave_step(str(folder), 10)
    assert not folder.exists()
    faults.leave_step(str(folder), 2)  # a task whose folder is already gone


def test_the_elastic_drivers_host_and_slot_name_the_rank_by_its_record(tmp_path, monkeypatch):
    """Horovod's elastic driver names a failed worker "localhost[0]" (the fault campaign, seeds 100047-100085: the
    last worker SIGKILLed during a save was told as a bare "worker localhost[0] exited with status 137"): the
    records' host and local rank name its rank, and the signal is named."""
    import socket
    import sys

    from rn50kit.launch import supervision
    from rn50kit.launch.launchers import horovodrun
    from rn50kit.reliability import faults
    for name in ("_record", "_path"):  # install sets them: put back as they were after the test
        monkeypatch.setattr(faults, name, None)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    # as Horovod's elastic driver starts workers (gloo_run.create_slot_env_vars): rank 1 now, slot 0 of localhost
    faults.install(1, {faults.FAULTS_ENV: str(tmp_path), "HOROVOD_HOSTNAME": "localhost", "HOROVOD_RANK": "1",
                       "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "0"})
    faults.renumber(0, 1)  # an elastic reset made it rank 0 of 1
    (tmp_path / "rank-1.json").write_text(json.dumps(dict(rank=1, host="hostA", pid=9, local_rank=0)))  # another host
    ended = horovodrun.failed_run(RuntimeError(HOROVOD_FAILED.replace("255", "137").format(rank="localhost[0]")),
                                  supervision.StopRelay())
    assert ended.slot == ("localhost", 0) and ended.first_failed is None
    line = supervision.failure_summary(ended, str(tmp_path), None)
    assert line.startswith(f"rank 0 (host {socket.gethostname()}, pid {os.getpid()}) was killed by SIGKILL (exit "
                           "status 137)"), line
    assert line.endswith(faults.RESTART)  # no checkpoint prefix given: nothing to resume from
    # over SSH: ssh's 255, and the worker's shell said "Killed" (seed 100047)
    ended = horovodrun.failed_run(RuntimeError(HOROVOD_FAILED.format(rank="localhost[0]")), supervision.StopRelay(),
                                  forwarded_by_horovod(["Killed"], 0).seen)
    assert supervision.failure_summary(ended, str(tmp_path), None).startswith(
        f"rank 0 (host {socket.gethostname()}, pid {os.getpid()}) was killed by SIGKILL (exit status 255)")
    # a slot no record holds: the launcher's own line, as before
    ended = horovodrun.failed_run(RuntimeError(HOROVOD_FAILED.format(rank="hostB[3]")), supervision.StopRelay())
    assert supervision.failure_summary(ended, str(tmp_path), None) is None


@pytest.mark.parametrize("shell_line", ["Killed", "bash: line 1:  4242 Killed                  python train.py"])
def test_a_peer_whose_plain_exit_horovod_timed_first_does_not_hide_the_killed_rank(shell_line, tmp_path):
    """Rank 1 SIGKILLed; rank 0's collectives fail at once and it exits 1, which Horovod may time first (seen in
    tests/e2e/test_fault_recovery.py on a quiet machine: `rank 0 ... exited with status 1`). The shell rank 1 ran
    in said "Killed" (dash's line, or bash's over SSH): rank 1 and SIGKILL are named."""
    from rn50kit.launch import supervision
    from rn50kit.launch.launchers import horovodrun
    from rn50kit.reliability import faults
    (tmp_path / "rank-0.json").write_text(json.dumps(dict(rank=0, host="vm", pid=6, kind="teardown", failed=2.0,
                                                          failure="MXNetError: Horovod has been shut down")))
    (tmp_path / "rank-1.json").write_text(json.dumps(dict(rank=1, host="vm", pid=7, alive=1.0)))
    watch = forwarded_by_horovod(["Epoch[2/2] Batch[2/6]", shell_line], 1)
    ended = horovodrun.failed_run(RuntimeError(HOROVOD_FAILED.replace("255", "1").format(rank=0)),
                                  supervision.StopRelay(), watch.seen)
    line = faults.summarize(str(tmp_path), ended.first_failed, ended.known)
    assert line.startswith("rank 1 (host vm, pid 7) was killed by SIGKILL (exit status 137)"), line
    # without the shell's word, Horovod's order stands
    ended = horovodrun.failed_run(RuntimeError(HOROVOD_FAILED.replace("255", "1").format(rank=0)),
                                  supervision.StopRelay(), forwarded_by_horovod(["Epoch[2/2] Batch[2/6]"], 1).seen)
    assert ended.first_failed == (0, 1)


def test_an_srun_task_names_its_workers_error_line_when_the_record_could_not_be_written(tmp_path, capsys,
                                                                                       monkeypatch):
    """A full disk at the final report under srun (the fault campaign, seeds 100054 and 100081): the worker's record
    could not be written either, and srun ended the task while it waited for another's line. The task keeps its
    worker's own error line (relayed from its stderr) and reports at once."""
    import io

    from rn50kit.launch.launchers import srun
    said = []
    lines = ["17:19:32 INFO Saved checkpoint ws/model-0002.params\n",
             "train.py: error: the disk is full: cannot write ws/report.json (File too large); rerun\n"]
    srun.relay_stderr(io.StringIO("".join(lines)), said)
    assert capsys.readouterr().err == "".join(lines)  # passed on as it came
    assert said == ["the disk is full: cannot write ws/report.json (File too large); rerun"]
    def no_wait(seconds):
        raise AssertionError("the task waited for another task's line")
    monkeypatch.setattr(srun.time, "sleep", no_wait)
    srun.report_step_failure(str(tmp_path), 0, 2, 4242, said[-1])
    line = capsys.readouterr().err.strip()
    assert line.startswith("runner: error: rank 0 (host ") and ", pid 4242) failed: the disk is full: cannot " \
        "write ws/report.json" in line, line


def test_horovodrun_names_a_workers_error_line_when_its_record_could_not_be_written(tmp_path):
    """The fault campaign, seed 100089: a full disk at the final report under horovodrun; the worker's record could
    not be written, so runner said only `rank 0 ... exited with status 2`. Its forwarded error line names the cause."""
    from rn50kit.launch import supervision
    from rn50kit.launch.launchers import horovodrun
    from rn50kit.reliability import faults
    (tmp_path / "rank-0.json").write_text(json.dumps(dict(rank=0, host="vm", pid=6, alive=1.0)))
    watch = forwarded_by_horovod(["train.py: error: the disk is full: cannot write ws/report.json (File too large)"], 0)
    ended = horovodrun.failed_run(RuntimeError(HOROVOD_FAILED.replace("255", "2").format(rank=0)),
                                  supervision.StopRelay(), watch.seen, watch.said)
    line = faults.summarize(str(tmp_path), ended.first_failed, ended.known)
    assert line.startswith("rank 0 (host vm, pid 6) failed: the disk is full: cannot write ws/report.json (File "
                           "too large) (its message is above)"), line


# Open MPI 4.1.4's own lines when a worker exits with a non-zero status (rank 0 here, after its one-line error)
MPIRUN_EXITED = """train.py: error: the disk is full: cannot write ws/report.json (File too large); rerun
--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
--------------------------------------------------------------------------
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[13296,1],0]
  Exit code:    2
--------------------------------------------------------------------------
"""


def test_mpirun_names_the_first_rank_to_exit_and_its_error_line(tmp_path, capsys):
    """The fault campaign, seed 200033: a full disk at the final report under mpirun; the worker's record could not
    be written, and runner said only `mpirun exited with status 2`. mpirun names the first rank to exit non-zero,
    and that worker's own line says why."""
    import io

    from rn50kit.launch.launchers import mpirun
    from rn50kit.reliability import faults
    found, seen = [], {}
    mpirun.relay_stderr(io.StringIO(MPIRUN_EXITED), found, seen)
    assert capsys.readouterr().err == MPIRUN_EXITED and found == []
    ended = mpirun.exited_run(2, "mpirun exited with status 2", seen)
    assert ended.first_failed == (0, 2)
    (tmp_path / "rank-0.json").write_text(json.dumps(dict(rank=0, host="vm", pid=6, alive=1.0)))
    line = faults.summarize(str(tmp_path), ended.first_failed, ended.known)
    assert line.startswith("rank 0 (host vm, pid 6) failed: the disk is full: cannot write ws/report.json"), line
    # two workers' error lines: whose is whose is not told, so neither is taken for the first's
    mpirun.relay_stderr(io.StringIO("train.py: error: another\n"), found, seen)
    assert mpirun.exited_run(2, "mpirun exited with status 2", seen).known is None


def test_a_launchers_error_line_never_replaces_the_workers_own_record(tmp_path, capsys):
    """Under mpirun a watchdog's stall line is a `train.py: error:` line too: the worker's own record (kind
    "stall", naming the stalled rank) stays what runner says, not "rank 0 failed: rank 1 stalled"."""
    import io

    from rn50kit.launch.launchers import mpirun
    stall = "rank 1 (host vm, pid 7) stalled: no sign of life for 17 s"
    (tmp_path / "rank-0.json").write_text(json.dumps(dict(rank=0, host="vm", pid=6, kind="stall", failed=5.0,
                                                          failure=stall)))
    found, seen = [], {}
    mpirun.relay_stderr(io.StringIO(MPIRUN_EXITED.replace("the disk is full: cannot write ws/report.json (File too "
                                                          "large); rerun", stall)), found, seen)
    ended = mpirun.exited_run(124, "mpirun exited with status 124", seen)
    from rn50kit.reliability import faults
    assert faults.summarize(str(tmp_path), ended.first_failed, ended.known).startswith(stall + "; ")


def test_runner_sees_a_checkpoint_to_resume_only_when_a_whole_one_is_there(tmp_path):
    """The failed run's advice ("rerun the same command: it resumes from ...") rests on has_checkpoint: checked in
    runner's own process as a resume reads the workspace (complete, its files' sizes), with no MXNet."""
    from rn50kit.launch import supervision
    from support.checkpoints import fake_checkpoint
    prefix = str(tmp_path / "model")
    assert not supervision.has_checkpoint(prefix) and not supervision.has_checkpoint(None)
    params = fake_checkpoint(tmp_path, 2)
    assert supervision.has_checkpoint(prefix)
    params.unlink()  # a state file naming a lost file is no checkpoint
    assert not supervision.has_checkpoint(prefix)
