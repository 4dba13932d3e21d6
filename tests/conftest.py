"""Shared fixtures and helpers: small real RecordIO datasets made once per test session, the subprocess helpers
and the hang guard every test uses, and the helpers and fixtures tests of more than one file share (tests/unit: the
in-process tests, by module; tests/e2e: launches and trainings, by journey)."""
import argparse
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

import safetensors.numpy as safetensors_numpy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the support modules (loop_harness, resnet_reference)

# The kit's modules, found through the paths above.
import json  # noqa: E402
import socket  # noqa: E402

import mxnet as mx  # noqa: E402
from mxnet import gluon, recordio  # noqa: E402

import models  # noqa: E402
import train  # noqa: E402
from rn50kit.common import cli  # noqa: E402
from rn50kit.config import settings, train_config  # noqa: E402
from rn50kit.launch import launcher as runner  # noqa: E402
from rn50kit.training import checkpoint  # noqa: E402
from rn50kit.weights import pretrained  # noqa: E402
from loop_harness import CPU  # noqa: E402
import resnet_reference as ref  # noqa: E402


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
# The runs that train several epochs on the digits (INT8's checkpoint, the fine-tuning, two Horovod workers, the
# per-class scoring run) take minutes of their own on a 2-core machine: their guard is half as long again.
LONG_HANG_S = HANG_S * 3 // 2


def run(command, env=None, timeout=HANG_S, **kwargs):
    """Run ``command`` to its end as a user would (this venv first, one thread per process, ``env`` instead if
    given), its output captured as text; HANG_S calls it a hang."""
    return subprocess.run(command, env=env or venv_env(), capture_output=True, text=True, timeout=timeout, **kwargs)


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
    launcher_variables = [variable for launcher in world.LAUNCHERS for variable in launcher[1:]]
    for name in ["OMP_NUM_THREADS", "MXNET_OMP_MAX_THREADS"] + launcher_variables:
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
    random.seed(0)
    np.random.seed(0)
    mx.random.seed(0)


@pytest.fixture()
def keep_signal_handlers():
    """stop_signals.StopFlag installs handlers for SIGTERM, SIGUSR1 and SIGINT: put pytest's back after the test."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def pytest_configure(config):
    """Ctrl-C reaches what the tests start, as from a terminal. A shell without job control (a CI job's
    ``.ci/run &``) starts its background commands with SIGINT ignored, and that is inherited down to every process
    the tests start: benchmark.py, which relies on Python's KeyboardInterrupt, would ignore the SIGINT a test sends
    it (a 600 s hang in one CI trial). Python's own handler here becomes the default again in each child."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


# The file that takes longest (about a third of the suite), started first: pytest-xdist hands out whole files in
# the order collected, the first few to each worker at once, and a file that long started late would leave the
# other worker idle at the end.
LONGEST_FIRST = ("test_fault_recovery.py",)


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


# --- bfloat16 and GPU plans (unit/test_precision, test_bench_models, test_benchmark, e2e/test_reduced_precision)

NO_BFLOAT16 = settings.bfloat16_unsupported()  # None where this CPU has oneDNN's bfloat16 kernels


# --- tools/check_dataset.py on planted faults (unit/test_check_dataset, e2e/test_dataset_check) -------------------

TOOL = os.path.join(ROOT, "tools", "check_dataset.py")


def photo(seed, shape=(60, 80)):
    rng = np.random.RandomState(seed)
    small = rng.randint(0, 255, size=(6, 8, 3), dtype=np.uint8)
    return cv2.resize(small, shape[::-1], interpolation=cv2.INTER_CUBIC)


def jpeg(image, quality=90):
    return cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])[1].tobytes()


def write_payloads(prefix, payloads):
    """payloads: list of (label, image bytes); returns the .rec/.idx paths."""
    writer = recordio.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "w")
    for i, (label, data) in enumerate(payloads):
        writer.write_idx(i, recordio.pack(recordio.IRHeader(0, label, i, 0), data))
    writer.close()
    return prefix + ".rec", prefix + ".idx"


def run_tool(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, env=venv_env())


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    out = tmp_path_factory.mktemp("planted")
    good = jpeg(photo(0))
    payloads = [
        (0, good),                                             # 0 healthy
        (1, jpeg(photo(1))),                                   # 1 healthy
        (2, good[:len(good) // 2]),                            # 2 truncated
        (3, np.random.RandomState(3).bytes(500)),              # 3 garbage
        (4, b""),                                              # 4 empty payload
        (5, cv2.imencode(".png", photo(5))[1].tobytes()),      # 5 PNG (warning, re-encoded by --fix)
        (3.5, jpeg(photo(6))),                                 # 6 label not an integer
        (42, jpeg(photo(7))),                                  # 7 label out of range for 10 classes
        (8, jpeg(cv2.cvtColor(photo(8), cv2.COLOR_BGR2GRAY))),  # 8 grayscale JPEG (warning)
        (9, jpeg(photo(9, (20, 400)))),                        # 9 unusual size (warning)
    ]
    rec, idx = write_payloads(str(out / "planted"), payloads)
    size = os.path.getsize(rec)
    with open(idx) as f:
        first_offset = int(f.readline().split()[1])
    with open(idx, "a") as f:
        f.write(f"10\t{size + 1000}\n")          # 10 dangling: past the end of the file
        f.write(f"11\t{first_offset + 4}\n")     # 11 into the middle of record 0: does not parse
    return rec, idx


EXPECTED_ERRORS = {2: "truncated image", 3: "undecodable image", 4: "empty payload", 6: "bad label",
                   7: "bad label", 10: "dangling index entry", 11: "unreadable record"}


# --- train.py's parser (unit/test_loaders, e2e/test_data_pipelines) -----------------------------------------------

def parse_train(*argv):
    return train.parse_args([str(a) for a in argv])


# --- tools/gpu_check.py's checks (unit/test_gpu_check, e2e/test_self_check) ---------------------------------------

CPU_CHECKS = {"versions", "horovod-build", "numerics-cpu", "training-cpu", "data-cpu", "allreduce-cpu"}


GPU_CHECKS = {"driver", "kernels", "numerics-gpu", "training-gpu", "data-gpu", "allreduce-gpu", "layout-speed",
              "memory", "fused-batchnorm"}


# --- runner's plan for a described 8-GPU machine (unit/test_launcher, test_devices, test_benchmark) ---------------

EIGHT_GPU_MACHINE = runner.Machine(8, 64)


def planned_train_argv(argv, machine=EIGHT_GPU_MACHINE, environ=None):
    _, env, command = runner.plan_launch([str(a) for a in argv], machine, environ or {})
    start = next(i for i, word in enumerate(command) if word.endswith("train.py")) + 1
    return env, command[start:]


@pytest.fixture()
def data_folder(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    for name in ("train.rec", "train.idx", "val.rec", "val.idx"):
        (root / name).write_bytes(b"")
    return root


# --- gradient accumulation on a tiny network (unit/test_fit, e2e/test_mlperf, hvd_accum_worker.py) ----------------

TINY_CLASSES, MICRO, ACCUM = 4, 4, 3


class ListedBatches:
    """An epoch's training iterator over fixed (images, labels) numpy pairs, the same every epoch; ``on_draw(i)`` is
    called as batch i is drawn (a test stops or checks the loop there)."""

    def __init__(self, batches, on_draw=None):
        self.batches, self.on_draw = batches, on_draw

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        for i, (data, label) in enumerate(self.batches):
            if self.on_draw:
                self.on_draw(i)
            yield mx.io.DataBatch(data=[mx.nd.array(data)], label=[mx.nd.array(label)], pad=0)


class AccumBatches(ListedBatches):
    """``count`` batches of ``size`` cut from the same images (so 3 of 4 hold what 1 of 12 holds, in order)."""

    def __init__(self, size, count, on_draw=None, seed=0):
        rng = np.random.RandomState(seed)
        images = rng.uniform(-1, 1, (size * count, 3, 8, 8)).astype("float32")
        labels = rng.randint(0, TINY_CLASSES, size * count).astype("float32")
        super().__init__([(images[i * size:(i + 1) * size], labels[i * size:(i + 1) * size]) for i in range(count)],
                         on_draw)


def tiny_accum_net(init_file, batchnorm="none"):
    """Conv, optional BatchNorm ("live", or "frozen": normalising with its running statistics), pool, dense."""
    net = gluon.nn.HybridSequential(prefix="tiny_")
    with net.name_scope():
        net.add(gluon.nn.Conv2D(8, 3, padding=1))
        if batchnorm != "none":
            net.add(gluon.nn.BatchNorm(use_global_stats=batchnorm == "frozen"))
        net.add(gluon.nn.Activation("relu"), gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(TINY_CLASSES))
    net.initialize(mx.init.Xavier(), ctx=CPU)
    net.infer_shape(mx.nd.zeros((1, 3, 8, 8)))
    for param in net.collect_params().values():
        param._finish_deferred_init()
    if not init_file.exists():
        net.save_parameters(str(init_file))
    net.load_parameters(str(init_file), ctx=CPU)
    net.hybridize(static_alloc=True, static_shape=True)
    return net


def fit_config(tmp_path, batch, accum, *extra):
    parsed = train.parse_args(["--kv-store", "local", "--dtype", "float32", "--batch-size", str(batch),
                               "--grad-accum-steps", str(accum), "--num-epochs", "2", "--lr", "0.4",
                               "--warmup-epochs", "0.5", "--mixup", "0", "--num-classes", str(TINY_CLASSES),
                               "--seed", "3", "--ema-decay", "0.9", "--workspace", str(tmp_path),
                               "--disp-batches", "0", "--keep-last", "0", *extra])
    train.fill_hyper_parameters(parsed)
    return train_config.from_args(parsed).fit


def learned_accum(net):
    return {name: p.data().asnumpy() for name, p in net.collect_params().items()
            if not name.endswith(("running_mean", "running_var"))}


# --- launchers' services: skipped for users, a failure in CI (e2e/test_launchers, test_fault_recovery) ------------

SERVICES_HINT = "run `sudo tools/ci_services.sh --install` (see docs/multi-node.md)"


TEST_HOSTS = ("hostA", "hostB")


def require(ok, missing):
    """Skip for a user's `make test` when a service is missing; in CI (CI set) that is a failure."""
    if ok:
        return
    message = f"needs {missing}; {SERVICES_HINT}"
    if os.environ.get("CI"):
        pytest.fail(f"CI: {message}")
    pytest.skip(message)


def quiet(command, timeout=HANG_S):
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None


def loopback_address(host):
    try:
        address = socket.gethostbyname(host)
    except socket.gaierror:
        return None
    return address if address.startswith("127.") else None


def need_ssh_hosts():
    for host in TEST_HOSTS:
        require(loopback_address(host) is not None, f"{host} in /etc/hosts on a loopback address")
        result = quiet(["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", host, "true"])
        require(result is not None and result.returncode == 0, f"key-based ssh to {host}")
    require(len({loopback_address(host) for host in TEST_HOSTS}) == 2, "hostA and hostB on different addresses")


# --- CutMix's constant images (unit/test_fit, e2e/test_modern_recipes) --------------------------------------------

def constant_batch(n, layout, size=(16, 20)):
    """Image i is filled with the value i + 1, so every pixel tells which image it came from."""
    h, w = size
    values = np.arange(1, n + 1, dtype="float32")
    shape = (n, 3, h, w) if layout == "NCHW" else (n, h, w, 3)
    return mx.nd.array(np.broadcast_to(values.reshape(-1, 1, 1, 1), shape))


# --- models.py's flags, small random networks (unit/test_models, e2e/test_models_cli, test_reduced_precision) ---------

def parse_model_args(argv):
    parser = argparse.ArgumentParser()
    models.add_model_args(parser)
    return parser.parse_args(argv)


def randomise(net, seed=0):
    """Random values for every parameter, BatchNorm statistics included (gamma zero-init would hide bugs)."""
    rng = np.random.RandomState(seed)
    for name, param in sorted(net.collect_params().items()):
        shape = param.shape
        if name.endswith("running_var"):
            value = rng.uniform(0.5, 2.0, shape)
        elif name.endswith("gamma"):
            value = rng.uniform(0.5, 1.5, shape)
        elif name.endswith(("beta", "running_mean", "bias")):
            value = rng.uniform(-0.2, 0.2, shape)
        else:
            value = rng.normal(0, np.sqrt(2.0 / np.prod(shape[1:])), shape)
        param.set_data(mx.nd.array(value, dtype=param.dtype))


def small_net(name="resnet18_v1.5", seed=0, **kwargs):
    net = models.get_model(name, num_classes=10, **kwargs)
    net.initialize()
    randomise(net, seed)
    return net


# --- published weights against the reference forward pass (unit/test_pretrained, e2e/test_published_weights,
# interop_pretrained.py); the weights are session fixtures: each is a ResNet's worth of numpy arrays and its
# reference logits, built once for both files

X = np.random.RandomState(1).normal(size=(2, 3, 32, 32)).astype(np.float32)


def assert_logits(actual, expected):
    """float32 precision: the kit computes in float32, the reference in float64."""
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def kit_net(name, num_classes, **kwargs):
    net = models.get_model(name, num_classes=num_classes, **kwargs)
    net.initialize()
    return net


def load(name, path, num_classes, **kwargs):
    net = kit_net(name, num_classes, **kwargs)
    info = pretrained.load_pretrained(net, str(path), [mx.cpu()], num_classes)
    return net, info


def logits(net, x=X):
    return net(mx.nd.array(x)).asnumpy()


def save_safetensors(sd, path):
    safetensors_numpy.save_file(sd, str(path))
    return path


class Weights:
    """One random state dict in torchvision's names, its reference logits and its files."""

    def __init__(self, folder, name, depth, num_classes, seed, **kwargs):
        self.sd = ref.torchvision_state_dict(depth, num_classes, seed=seed, **kwargs)
        self.stride_in_1x1 = kwargs.get("conv_bias_1x1", False)  # GluonCV's resnet_v1
        self.expected = ref.forward(self.sd, X, stride_in_1x1=self.stride_in_1x1)
        self.folder, self.name, self.num_classes = folder, name, num_classes

    def path(self, suffix):
        return self.folder / f"{self.name}{suffix}"


@pytest.fixture(scope="session")
def tv18(tmp_path_factory):
    weights = Weights(tmp_path_factory.mktemp("tv18"), "resnet18", 18, 7, seed=0)
    save_safetensors(weights.sd, weights.path(".safetensors"))
    return weights


@pytest.fixture(scope="session")
def tv50(tmp_path_factory):
    weights = Weights(tmp_path_factory.mktemp("tv50"), "resnet50", 50, 7, seed=1)
    save_safetensors(weights.sd, weights.path(".safetensors"))
    return weights


@pytest.fixture(scope="session")
def resnext50(tmp_path_factory):
    return Weights(tmp_path_factory.mktemp("rx50"), "resnext50_32x4d", 50, 5, seed=3, groups=32, width_per_group=4)


def refusal(name, path, num_classes=7, **kwargs):
    with pytest.raises(pretrained.PretrainedError) as caught:
        load(name, path, num_classes, **kwargs)
    message = str(caught.value)
    assert "\n" not in message
    return message


# --- a record file stored in label order (unit/test_records, e2e/test_data_pipelines) -----------------------------

NUM_RECORDS, NUM_CLASSES = 64, 4


GLOBAL_BATCH = 16  # 2 ranks x 8: each shard of 32 records is exactly 4 batches


@pytest.fixture(scope="module")
def sorted_rec(tmp_path_factory):
    """64 small JPEGs stored in label order; each record's label is its own number (so records can be told
    apart after the pipeline), its class is label // 16."""
    out = tmp_path_factory.mktemp("sorted")
    rng = np.random.RandomState(0)
    images = [rng.randint(0, 255, size=(20 + i % 5, 24, 3), dtype=np.uint8) for i in range(NUM_RECORDS)]
    return write_record_file(str(out / "train"), images, range(NUM_RECORDS))


def parse_ordered(rec, idx, *extra):
    return train.parse_args(
        ["--data-backend", "dali-cpu", "--data-train", rec, "--data-train-idx", idx, "--batch-size",
         str(GLOBAL_BATCH), "--image-shape", "3,16,16", "--dali-threads", "1", *extra])


# --- records, networks and refusals the second newcomer walk needed (unit and e2e) --------------------------------

def labelled_records(folder, labels):
    """train.rec/.idx and val.rec/.idx with the given labels and no .lst (as check_dataset.py --fix writes)."""
    rng = np.random.RandomState(0)
    images = [rng.randint(0, 255, size=(8, 8, 3), dtype=np.uint8) for _ in labels]
    files = {}
    for split in ("train", "val"):
        files[split] = write_record_file(str(folder / split), images, labels)
    assert not list(folder.glob("*.lst"))
    return files


def record_config(files, backend, num_classes):
    return train_config.RunConfig().replace(
        data__data_backend=backend, data__data_train=files["train"][0], data__data_train_idx=files["train"][1],
        data__data_val=files["val"][0], data__data_val_idx=files["val"][1], model__num_classes=num_classes,
        fit__num_epochs=1, fit__warmup_epochs=0)


def built(num_layers, image, dtype="float32"):
    import mxnet as mx
    import models
    net = models.build_network(models.ModelConfig(num_layers=num_layers), 3, "NCHW", dtype)
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    net.hybridize()
    net.infer_shape(mx.nd.zeros((1, 3, image, image), dtype="float16" if dtype == "float16" else "float32"))
    return net


def train_refusal(*argv):
    args = train.parse_args(["--kv-store", "local", *TINY_RUN, *argv])
    with pytest.raises(cli.UsageError) as error:
        train.main(args)
    return str(error.value)


def plan_refusal(*argv, gpus=0):
    from rn50kit.launch import launcher
    with pytest.raises(cli.UsageError) as error:
        launcher.plan_launch(["--data-backend", "synthetic", "--dtype", "float32", *argv], launcher.Machine(gpus, 2),
                             {})
    return str(error.value)


def steps_logged(workspace):
    log = workspace / "log.jsonl"
    return log.exists() and sum(1 for line in open(log) if '"type": "iter"' in line)


def run_command(*command, env=None):
    import subprocess
    import sys
    environ = {k: v for k, v in venv_env().items() if not k.startswith("SLURM_")}
    environ.update(env or {})
    return subprocess.run([sys.executable, os.path.join(ROOT, command[0]), *command[1:]], env=environ,
                          capture_output=True, text=True, timeout=HANG_S, stdin=subprocess.DEVNULL)


# --- checkpoint files as checkpoint.save names them (unit/test_settings, test_checkpoint, test_launcher) ----------

def touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    return path


def save_tiny(prefix, epochs):
    """Real checkpoints of a small network (one per epoch, their files' sizes and SHA-256 recorded); returns
    (net, trainer)."""
    import mxnet as mx
    from rn50kit.training import checkpoint
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(64, in_units=256))
    net.initialize()
    net.hybridize()
    net(mx.nd.zeros((1, 256)))
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    for epoch in epochs:
        checkpoint.save(str(prefix), net, trainer, {"epoch": epoch, "step": 0})
    return net, trainer


def fake_checkpoint(workspace, epoch, step=0, **args):
    """The files of a complete checkpoint (contents do not matter here) and its state, as checkpoint.save names
    them."""
    tag = checkpoint.tag_for(epoch, step)
    files = {"symbol": "model-symbol.json", "params": f"model-{tag}.params", "states": f"model-{tag}.states"}
    for name in files.values():
        touch(workspace / name)
    state = {"epoch": epoch, "step": step, "model": args.pop("model", "resnet18_v1.5"), "files": files,
             "args": args}
    (workspace / f"model-{tag}{checkpoint.STATE_SUFFIX}").write_text(json.dumps(state))
    return workspace / files["params"]


# --- kit checkpoints exported to torchvision's names (unit/test_export_weights, e2e/test_weights_to_pytorch) -------

EXPORT_CLASSES = 7


def trained_like(name, seed=0):
    """A kit network whose every parameter (BatchNorm statistics too) is random, as after training."""
    net = kit_net(name, EXPORT_CLASSES)
    net(mx.nd.array(X))
    rng = np.random.RandomState(seed)
    for key, param in net.collect_params().items():
        shape = param.shape
        if key.endswith(("running_var", "gamma")):
            value = rng.uniform(0.5, 1.5, shape)
        elif len(shape) == 4:
            value = rng.normal(0, np.sqrt(2.0 / np.prod(shape[1:])), shape)
        else:
            value = rng.normal(0, 0.1, shape)
        param.set_data(mx.nd.array(value.astype(np.float32)))
    return net


def exported_checkpoint(net, folder):
    """The files of a checkpoint, as checkpoint.py writes them with net.export: <prefix>-symbol.json and
    <prefix>-0001.params; returns the .params path."""
    net.hybridize()
    net(mx.nd.array(X))
    net.export(str(folder / "model"), epoch=1)
    return folder / "model-0001.params"


def parameter_arrays(net):
    return {key: param.data().asnumpy() for key, param in net.collect_params().items()}


def export_and_check_round_trip(name, other, folder):
    """Export a random ``name`` checkpoint, import the file back into a new ``name`` network: every array equal
    bit for bit; ``other`` (the same network with the other stride placement, or None) refuses it."""
    import export_weights
    net = trained_like(name, seed=1)
    out = folder / "out.safetensors"
    export_weights.main([str(exported_checkpoint(net, folder)), str(out)])
    back, info = load(name, out, EXPORT_CLASSES)
    assert info.source == "torchvision/timm" and not info.head_reinitialized
    original, loaded = parameter_arrays(net), parameter_arrays(back)
    assert set(loaded) == set(original)
    for key, value in loaded.items():
        assert np.array_equal(value, original[key]), key
    if other:  # the file says where its network strides: the other placement is refused
        with pytest.raises(pretrained.PretrainedError, match=f"give --model {name}"):
            load(other, out, EXPORT_CLASSES)


def export_and_check_logits(name, folder):
    """Export a random ``name`` checkpoint: the file through the reference ResNet (the v1 stride moved, as the
    tool prints) gives the kit's logits."""
    import io
    import export_weights
    net = trained_like(name)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        export_weights.main([str(exported_checkpoint(net, folder)), str(folder / "out.safetensors")])
    state = safetensors_numpy.load_file(str(folder / "out.safetensors"))
    v1 = name.endswith("_v1")
    assert ("move the stride" in printed.getvalue()) == v1
    assert all(state[key].dtype == np.int64 for key in state if key.endswith("num_batches_tracked"))
    assert_logits(logits(net), ref.forward(state, X, stride_in_1x1=v1))


# --- MPI and Slurm launchers (e2e/test_launchers, test_fault_recovery) -------------------------------------------

def horovod_has_mpi():
    code = "import horovod.mxnet as hvd; print(hvd.mpi_built())"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S)
    return result.stdout.strip() == "True"


def need_mpi():
    require(shutil.which("mpirun") is not None, "Open MPI's mpirun (apt-get install openmpi-bin libopenmpi-dev)")
    require(horovod_has_mpi(), "Horovod built with MPI (install Open MPI, then rerun `make setup`)")


def need_slurm():
    need_mpi()
    ping = quiet(["scontrol", "ping"]) if shutil.which("scontrol") else None
    require(ping is not None and "UP" in ping.stdout, "a running Slurm controller (scontrol ping)")
    # A node that is up: idle, or busy with another test's job (the two test workers share it; srun waits its turn)
    cpus = quiet(["sinfo", "-h", "-t", "idle,mix,alloc,comp", "-o", "%c"])
    require(cpus is not None and any(c.isdigit() and int(c) >= 2 for c in cpus.stdout.split()),
            "a Slurm node that is up, with 2 CPUs (sinfo)")


def mpirun_root_env():
    env = venv_env()
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    return env


# --- the docs' command blocks (tests/unit/test_docs_links.py, tests/e2e/test_docs.py) ----------------------------

# README.md first, then the pages in the order of the README's guide table: the order the blocks run in (a later
# block may use a run an earlier one made).
DOC_PAGES = ("data", "own-images", "training", "time-to-train", "multi-node", "checkpoints", "benchmarking",
             "scoring", "gpu", "performance", "design")
SHELL_FENCES = ("bash", "sh", "shell", "console")


def doc_files():
    """README.md and docs/*.md in running order (pages not in DOC_PAGES last, so none is missed)."""
    pages = [os.path.join(ROOT, "docs", f"{name}.md") for name in DOC_PAGES]
    others = sorted(os.path.join(ROOT, "docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
                    if f.endswith(".md") and os.path.join(ROOT, "docs", f) not in pages)
    return [os.path.join(ROOT, "README.md"), *pages, *others]


def doc_blocks(path):
    """Every fenced block of a Markdown file: dicts of file (relative to ROOT), line (of the opening fence),
    lang, marker (the HTML comment on the line before: 'run: demo', 'skip: why'..., or None), text."""
    lines = open(path).read().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        opening = lines[i].strip()
        if opening.startswith("```"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```"))
            before = lines[i - 1].strip() if i else ""
            marker = before[4:-3].strip() if before.startswith("<!--") and before.endswith("-->") else None
            indent = len(lines[i]) - len(lines[i].lstrip())
            blocks.append({"file": os.path.relpath(path, ROOT), "line": i + 1, "lang": opening[3:].strip(),
                           "marker": marker, "text": "\n".join(line[indent:] for line in lines[i + 1:end])})
            i = end
        i += 1
    return blocks


def photo_folder(root):
    """7 images in nested folders (mixed sizes, a grayscale JPEG, PNGs), a corrupt .jpg and a text file."""
    rng = np.random.RandomState(0)
    (root / "a" / "deep").mkdir(parents=True)
    (root / "b").mkdir()
    for i, (name, shape) in enumerate([("a/1.jpg", (40, 60, 3)), ("a/deep/2.png", (90, 33, 3)),
                                       ("b/3.jpg", (32, 32, 3)), ("b/4.jpeg", (120, 80, 3)), ("5.png", (50, 50, 3)),
                                       ("a/6.JPG", (35, 70, 3))]):
        cv2.imwrite(str(root / name), rng.randint(0, 255, shape, dtype=np.uint8))
    cv2.imwrite(str(root / "b" / "gray.jpg"), rng.randint(0, 255, (45, 64), dtype=np.uint8))
    (root / "a" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (root / "notes.txt").write_text("not an image\n")
    return root


def run_members(workspace):
    """Every process of a run on this machine, launched here or through sshd: their command names the workspace."""
    found = []
    import psutil
    for process in psutil.process_iter(["cmdline"]):
        if process.pid != os.getpid() and str(workspace) in " ".join(process.info["cmdline"] or []):
            found.append(process)
    return found
