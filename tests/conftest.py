"""Shared fixtures: small real RecordIO datasets made once per test session."""
import contextlib
import fcntl
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import cv2
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))


# A tiny ResNet on synthetic data: the flags every quick end-to-end run of the tests shares.
TINY_RUN = ["--data-backend", "synthetic", "--dtype", "float32", "--num-layers", "18", "--image-shape", "3,32,32",
            "--num-classes", "10"]


def digits_run(digits):
    """train.py's flags for a tiny ResNet-18 on the digits dataset (``digits``: its folder, from the digits_data
    fixture): both record files, the DALI CPU backend on one thread, 32-pixel images, light augmentation."""
    d = str(digits)
    return ["--data-backend", "dali-cpu", "--dali-threads", "1", "--dali-validation-threads", "1",
            "--data-train", f"{d}/train.rec", "--data-train-idx", f"{d}/train.idx",
            "--data-val", f"{d}/val.rec", "--data-val-idx", f"{d}/val.idx",
            "--num-layers", "18", "--num-classes", "10", "--image-shape", "3,32,32", "--data-val-resize", "32",
            "--random-mirror", "0", "--min-random-area", "0.5"]


# How long a test waits for another process before it calls that a hang: a guard, never a speed limit (a slow or
# busy machine only makes the wait longer).
HANG_S = 600


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
    from rn50kit.launch import world
    env = venv_env()
    for name in ["OMP_NUM_THREADS", "MXNET_OMP_MAX_THREADS"] + [v for launcher in world.LAUNCHERS for v in launcher[1:]]:
        env.pop(name, None)
    return env


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


@pytest.fixture(autouse=True)
def same_random_state():
    """Each test starts from the same random state of Python, numpy and MXNet, whatever ran before it in its process
    (pytest-xdist's workers take the files in any order): its random weights and data do not depend on that."""
    import mxnet as mx
    random.seed(0)
    np.random.seed(0)
    mx.random.seed(0)


def pytest_configure(config):
    """Ctrl-C reaches what the tests start, as from a terminal. A shell without job control (a CI job's
    ``.ci/run &``) starts its background commands with SIGINT ignored, and that is inherited down to every process
    the tests start: benchmark.py, which relies on Python's KeyboardInterrupt, would ignore the SIGINT a test sends
    it (a 600 s hang in one CI trial). Python's own handler here becomes the default again in each child."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


# The file that takes longest (about a third of the suite), started first: pytest-xdist hands out whole files in
# the order collected, the first few to each worker at once, and a file that long started late would leave the
# other worker idle at the end.
LONGEST_FIRST = ("test_faults.py",)


def pytest_collection_modifyitems(items):
    """Tests on the digits dataset are slow: it is built through im2rec (tens of seconds, once per session)."""
    for item in items:
        if "digits_data" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    first = {name: rank for rank, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # stable: the others keep their order


def venv_env():
    """Environment for subprocesses: this Python's bin first (horovodrun), one thread per process."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def write_record_file(prefix, images, labels, quality=95):
    """Pack BGR uint8 images with float labels into prefix.rec/.idx with MXNet's recordio."""
    from mxnet import recordio
    record = recordio.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "w")
    for i, (image, label) in enumerate(zip(images, labels)):
        ok, jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
        assert ok
        header = recordio.IRHeader(0, float(label), i, 0)
        record.write_idx(i, recordio.pack(header, jpeg.tobytes()))
    record.close()
    return prefix + ".rec", prefix + ".idx"


@contextlib.contextmanager
def made_once(tmp_path_factory, name):
    """A folder for data made once per test run and only read after. Yields (folder, whether it still has to be
    made); under pytest-xdist every worker gets the same folder (beside their own base folders), the first makes
    it while the others wait on a lock."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # pytest-N/: the run's folder, shared by its workers (popen-gw0, popen-gw1, ...)
    out, done = base / name, base / f"{name}.done"
    with open(base / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)  # a worker that failed halfway left it
            out.mkdir()
            yield out, True
            done.touch()
        else:
            yield out, False


@pytest.fixture(scope="session")
def digits_data(tmp_path_factory):
    """The demo dataset (real digit scans), built through tools/make_demo_data.py and im2rec."""
    with made_once(tmp_path_factory, "digits") as (out, to_make):
        if to_make:
            subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_demo_data.py"), str(out)],
                           check=True, env=venv_env(), stdout=subprocess.DEVNULL)
    return out


@pytest.fixture(scope="session")
def unique_label_rec(tmp_path_factory):
    """A RecordIO whose labels are the record numbers, so each sample can be told apart."""
    out = tmp_path_factory.mktemp("unique")
    rng = np.random.RandomState(0)
    count = 53  # prime: never a multiple of the batch or of the number of shards
    images = [rng.randint(0, 255, size=(20 + i % 7, 24, 3), dtype=np.uint8) for i in range(count)]
    rec, idx = write_record_file(str(out / "val"), images, range(count))
    return rec, idx, count
