"""The runs of a fault campaign's trial (tools/fault_campaign.py): the command a user types under each launcher (a
tiny ResNet-18 on synthetic data, two workers), started in the background, the planned faults struck at their
moments (campaign_hooks), and the run's end awaited as a user would: with a deadline, then by hand."""
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import psutil

from rn50kit.reliability import campaign_hooks
from rn50kit.reliability.campaign_plan import EPOCHS, STEPS_PER_EPOCH, Fault

HANG_S = 600  # a run that takes longer than this has hung: the campaign ends it by hand
FULL_DISK_BYTES = 4 << 20  # the file-size limit of a "full disk": above the logs, below a checkpoint's parameters
# The tiny run every trial trains: 3 steps an epoch, a checkpoint each epoch, validation each epoch.
TINY = ["-b", "8", "-e", str(EPOCHS), "-l", "0.1", "--data-backend", "synthetic", "--dtype", "float32",
        "--num-layers", "18", "--image-shape", "3,32,32", "--num-classes", "10",
        "--num-examples", str(STEPS_PER_EPOCH * 16), "--warmup-epochs", "0", "--seed", "3", "--disp-batches", "1"]
LAUNCH = {  # (in front of runner, runner's own flags)
    "horovodrun": ([], ["-n", "2"]),
    "mpirun": ([], ["-n", "2", "--launcher", "mpi"]),
    "srun": (["srun", "-n", "2", "-t", "10"], ["--launcher", "slurm"]),
    "ssh": ([], ["-n", "2", "-H", "hostA:1,hostB:1"]),
    "elastic": ([], ["-n", "2", "-H", "localhost:1,hostA:1", "--min-np", "1", "--network-interface", "lo",
                     "--commit-every", "4"]),
}
# An elastic run hands the records not read yet to the new world: it reads real records (the digits, built once
# per campaign by tools/make_demo_data.py) through DALI, not synthetic data.
RECORDS = ["--data-backend", "dali-cpu", "--dali-threads", "1", "--dali-validation-threads", "1",
           "--data-val-resize", "32", "--random-mirror", "0"]
# Under srun the launcher has the last word: its own lines on each task's end come after runner's.
LAUNCHER_LINES = ("srun: ", "slurmstepd")


@dataclasses.dataclass
class Setup:
    """Where and how the campaign runs: the kit's folder, its Python, the stall timeout given to every run and the
    margin on top of it within which a faulted run must have ended."""
    root: str
    python: str = sys.executable
    stall_timeout: int = 20
    margin: int = 60
    checkpoint_check: object = None  # workspace -> a problem line or None: the newest complete checkpoint loads
    records: str = None  # the digits' folder, for the elastic runs

    def command(self, launcher, workspace):
        front, flags = LAUNCH[launcher]
        data = [*RECORDS, "--data-root", self.digits()] if launcher == "elastic" else []
        return [*front, self.python, os.path.join(self.root, "runner"), *flags, *TINY, *data,
                "--stall-timeout", str(self.stall_timeout), "--workspace", str(workspace)]

    def digits(self):
        """The digits' records (made the first time they are asked for)."""
        if not os.path.exists(os.path.join(self.records, "val.idx")):
            subprocess.run([self.python, os.path.join(self.root, "tools", "make_demo_data.py"), self.records],
                           env=self.env(), check=True, stdout=subprocess.DEVNULL)
        return self.records

    def env(self, injection=None):
        env = dict(os.environ)
        env["PATH"] = os.path.dirname(self.python) + os.pathsep + env.get("PATH", "")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (injection, self.root, env.get("PYTHONPATH")) if p)
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        env.pop("OMP_NUM_THREADS", None)  # runner sets each worker's share
        for key in [k for k in env if k.startswith("SLURM_")]:
            env.pop(key)  # a campaign started inside a Slurm job starts its own steps
        return env


@dataclasses.dataclass
class Run:
    """One run's outcome: its status, its last line, when each planned fault struck (None: its moment never came),
    when it ended (the run's last process gone for a runner killed), and whether the campaign had to end it."""
    status: int
    last_line: str
    stderr: str
    struck: list
    ended: float
    hung: bool


def members(workspace, process=None):
    """Every process of the run on this machine (through sshd too): their command names the workspace."""
    found = {}
    mark = str(workspace)
    for member in psutil.process_iter(["cmdline"]):
        if member.pid != os.getpid() and mark in " ".join(member.info["cmdline"] or []):
            found[member.pid] = member
    if process is not None:
        try:
            root = psutil.Process(process.pid)
            for member in [root, *root.children(recursive=True)]:
                found[member.pid] = member
        except psutil.Error:
            pass
    return list(found.values())


def alive(member):
    try:
        return member.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def signal_all(workspace, process, sig):
    for member in members(workspace, process):
        try:
            member.send_signal(sig)
        except psutil.Error:
            pass


def ancestor(pid, is_it):
    """The nearest ancestor of ``pid`` for which ``is_it(process)`` holds, or None."""
    try:
        process = psutil.Process(pid).parent()
        while process is not None and not is_it(process):
            process = process.parent()
        return process
    except psutil.Error:
        return None


def is_runner(process):
    command = process.cmdline()
    return len(command) > 1 and os.path.basename(command[1]) == "runner"


def strike(fault, marker, workspace, process):
    """The campaign's part of ``fault``: its worker (``marker``: who it is) waits at the moment meanwhile."""
    worker = psutil.Process(marker["pid"])
    if fault.kind == "sigkill":
        worker.kill()
    elif fault.kind == "sigstop":
        worker.suspend()
    elif fault.kind == "full-disk":  # at the final report nothing large is left to write: no write passes then
        limit = 0 if fault.moment == "report" else FULL_DISK_BYTES
        worker.rlimit(psutil.RLIMIT_FSIZE, (limit, worker.rlimit(psutil.RLIMIT_FSIZE)[1]))
    elif fault.kind == "lost-host":  # the SSH session to the worker's host cut: the network or the host lost
        (ancestor(marker["pid"], lambda p: p.name() == "sshd") or worker).kill()
    elif fault.kind == "runner-sigkill":
        (ancestor(marker["pid"], is_runner) or psutil.Process(process.pid)).kill()
    elif fault.kind == "sigterm-all":  # a preemption, scancel, a time limit
        signal_all(workspace, process, signal.SIGTERM)


def injected_env(fault, folder):
    """Variables for the test injection: a kill inside a checkpoint write (its operations logged, so the campaign
    sees when it struck)."""
    if fault.kind != "kill-in-save":
        return {}
    return {"RN50_INJECT_KIND": "kill-in-save", "RN50_INJECT_EPOCH": str(fault.epoch),
            "RN50_INJECT_STEP": str(fault.step), "RN50_INJECT_LOG": os.path.join(folder, "save-operations.log")}


def planned(launcher, fault):
    """The faults of one run: at an elastic reset, first the loss of hostA's worker that causes the reset."""
    if fault.moment != "reset":
        return [fault]
    return [Fault("sigkill", "step", fault.epoch, min(2, STEPS_PER_EPOCH), "hostA"), fault]


def kill_in_save_struck(fault, folder):
    try:
        with open(os.path.join(folder, "save-operations.log")) as f:
            return sum(1 for _ in f) >= fault.step
    except OSError:
        return False


def strike_when_due(faults, folder, workspace, process):
    """Strike each planned fault when its worker reaches its moment; returns when each struck (None: never), once
    all have or the run has ended."""
    struck = [None] * len(faults)
    deadline = time.monotonic() + 3 * HANG_S  # a hang guard only: srun may wait its turn for the node first
    while None in struck and time.monotonic() < deadline:
        index = struck.index(None)
        fault = faults[index]
        marker = os.path.join(folder, f"fault-{index}.json")
        if fault.kind == "kill-in-save" and kill_in_save_struck(fault, folder) or \
                fault.kind in ("exception", "segfault") and os.path.exists(marker + ".struck"):
            struck[index] = time.time()
        elif os.path.exists(marker):
            with open(marker) as f:
                who = json.load(f)
            try:
                strike(fault, who, workspace, process)
            except psutil.Error:
                pass  # the worker went meanwhile (another fault ended the run)
            struck[index] = time.time()
            open(os.path.join(folder, f"fault-{index}.go"), "w").close()
        elif process.poll() is not None:
            break
        time.sleep(0.01)
    return struck


def last_line(stderr):
    lines = [line for line in stderr.strip().splitlines() if not line.startswith(LAUNCHER_LINES)]
    return lines[-1] if lines else ""


def run(setup, launcher, workspace, log_prefix, faults=(), folder=None):
    """Run the command of ``launcher`` on ``workspace`` with ``faults`` struck; returns its Run."""
    env = setup.env()
    if faults:
        own = [dataclasses.asdict(f) for f in faults]
        extra = {k: v for f in faults for k, v in injected_env(f, folder).items()}
        env = setup.env(campaign_hooks.write_injection(folder, setup.root, own, extra))
    with open(f"{log_prefix}.out", "w") as out, open(f"{log_prefix}.err", "w") as err:
        process = subprocess.Popen(setup.command(launcher, workspace), env=env, stdout=out, stderr=err,
                                   stdin=subprocess.DEVNULL, start_new_session=True, cwd=setup.root)
    struck = strike_when_due(faults, folder, workspace, process) if faults else []
    hit = [t for t in struck if t is not None]
    patience = setup.stall_timeout + setup.margin if hit and launcher != "elastic" else HANG_S
    ended, hung = wait_end(process, workspace, (max(hit) if hit else time.time()) + patience)
    stderr = open(f"{log_prefix}.err", errors="replace").read()
    return Run(process.returncode, last_line(stderr), stderr, struck, ended, hung)


def wait_end(process, workspace, deadline):
    """Wait for runner (for every process of the run, when runner was killed) until ``deadline``; then end what is
    left by hand, as a user would. Returns (when it ended, whether it had to be ended)."""
    while time.time() < deadline:
        if process.poll() is not None and (process.returncode != -signal.SIGKILL or
                                           not any(alive(m) for m in members(workspace))):
            return time.time(), False
        time.sleep(0.05)
    # SIGTERM first, as scancel: srun killed outright leaves its job holding the node until its time limit.
    signal_all(workspace, process, signal.SIGTERM)
    grace = time.time() + 10
    while process.poll() is None and time.time() < grace:
        time.sleep(0.1)
    signal_all(workspace, process, signal.SIGKILL)
    process.wait()
    return time.time(), True
