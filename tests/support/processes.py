"""The kit's commands run as a user runs them, runs in the background, and waits that poll a condition with a hang
guard (never a speed limit). MXNet-free: a test file that only starts processes collects without it."""
import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKERS = os.path.join(ROOT, "tests", "support", "workers")  # scripts the tests start as processes

# How long a test waits for another process before it calls that a hang: a guard, never a speed limit (a slow or
# busy machine only makes the wait longer).
HANG_S = 600
# The runs that train several epochs on the digits (INT8's checkpoint, the fine-tuning, two Horovod workers, the
# per-class scoring run) take minutes of their own on a 2-core machine: their guard is half as long again.
LONG_HANG_S = HANG_S * 3 // 2


def venv_env():
    """Environment for subprocesses: this Python's bin first (horovodrun), one thread per process."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run(command, env=None, timeout=HANG_S, **kwargs):
    """Run ``command`` to its end as a user would (this venv first, one thread per process, ``env`` instead if
    given), its output captured as text; HANG_S calls it a hang."""
    return subprocess.run(command, env=env or venv_env(), capture_output=True, text=True, timeout=timeout, **kwargs)


def run_command(*command, env=None):
    """One of the kit's scripts (``command[0]``, relative to the repository) run by this Python outside any Slurm
    job, with no input, and ``env`` on top of venv_env()."""
    environ = {k: v for k, v in venv_env().items() if not k.startswith("SLURM_")}
    environ.update(env or {})
    return subprocess.run([sys.executable, os.path.join(ROOT, command[0]), *command[1:]], env=environ,
                          capture_output=True, text=True, timeout=HANG_S, stdin=subprocess.DEVNULL)


def run_benchmark(*args, timeout=HANG_S):
    return subprocess.run([sys.executable, os.path.join(ROOT, "benchmark.py"), *args], env=venv_env(),
                          capture_output=True, text=True, timeout=timeout)


def start(command, log_prefix, env=None, **kwargs):
    """The run in the background, its output in files (a full pipe would stall it): <log_prefix>.out and .err."""
    out, err = open(f"{log_prefix}.out", "w"), open(f"{log_prefix}.err", "w")
    return subprocess.Popen(command, env=env or venv_env(), stdout=out, stderr=err, text=True,
                            start_new_session=True, **kwargs)


def wait_until(condition, what, timeout=HANG_S, process=None, interval=0.05):
    """Poll ``condition()`` until it returns something true, and return that. Fails saying ``what`` it waited
    for after ``timeout`` seconds, or as soon as ``process`` (a Popen) has ended first."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if process is not None and process.poll() is not None:
            pytest.fail(f"the process ended (status {process.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout:.0f} s for {what}")
        time.sleep(interval)


def pid_gone(pid):
    """Whether process ``pid`` has finished dying: gone, or a zombie left for its parent to reap. A SIGKILLed
    process is neither for a moment after the signal (its threads are still exiting)."""
    import psutil
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def catches_signal(pid, signum):
    """Whether ``pid`` has installed a handler for ``signum`` (the SigCgt mask in /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(mask & (1 << (signum - 1)))


def run_processes(process):
    """``process`` (a Popen: runner) and everything under it: the launcher's processes, their shells, the workers."""
    import psutil
    root = psutil.Process(process.pid)
    return [root] + root.children(recursive=True)


def run_members(workspace):
    """Every process of a run on this machine, launched here or through sshd: their command names the workspace."""
    import psutil
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if process.pid != os.getpid() and str(workspace) in " ".join(process.info["cmdline"] or []):
            found.append(process)
    return found


# --- threads: what a process started by hand gets (e2e/test_runner, test_bench_models_workers) ------------------

def physical_cores():
    """This process's physical cores, as util-linux's lscpu counts them (CPU, core, socket rows) over its affinity
    mask: a reference independent of the kit's own count (devices.openmp_threads)."""
    rows = subprocess.run(["lscpu", "-p=CPU,CORE,SOCKET"], capture_output=True, text=True, check=True).stdout
    mask = os.sched_getaffinity(0)
    return len({tuple(row.split(",")[1:]) for row in rows.splitlines()
                if row and not row.startswith("#") and int(row.split(",")[0]) in mask})


def mxnet_openmp_threads(env, start="import mxnet"):
    """The OpenMP team size MXNet set for itself in a fresh process with ``env``, read from libgomp after ``start``
    (Python code that loads MXNet; MXNet links the system's libgomp.so.1)."""
    probe = f"{start}\nimport ctypes\nprint(ctypes.CDLL('libgomp.so.1').omp_get_max_threads())"
    result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stderr[-2000:]
    return int(result.stdout.split()[-1])


def alone_env():
    """venv_env() without OMP_NUM_THREADS, MXNet's own thread cap or any launcher's variables: a process started
    by hand."""
    from rn50kit.reliability import world
    env = venv_env()
    launcher_variables = [variable for launcher in world.LAUNCHERS for variable in launcher[1:]]
    for name in ["OMP_NUM_THREADS", "MXNET_OMP_MAX_THREADS"] + launcher_variables:
        env.pop(name, None)
    return env
