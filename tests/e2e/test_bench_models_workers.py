"""tools/bench_models.py's workers as processes: the PyTorch one starts in a Python without MXNet, MXNet's get a
thread per physical core, and --fuse-bn-relu reaches the oneDNN kernels of the training step."""
import os
import subprocess
import sys

import bench_models
import pytest
from model_workers import breakdown

from support.processes import HANG_S, ROOT, alone_env, mxnet_openmp_threads, physical_cores

pytestmark = pytest.mark.slow  # launches processes


BENCH_MODELS = os.path.join(ROOT, "tools", "bench_models.py")


def test_the_pytorch_worker_starts_without_mxnet():
    """The README's PyTorch venv holds torch and numpy only. Started in a Python without site-packages (no MXNet,
    no PyTorch), the worker must get as far as importing torch: what it lacks is PyTorch, not MXNet."""
    command = [sys._base_executable, "-I", "-S", BENCH_MODELS, "--worker", "torch", "--batch-size", "2",
               "--image-size", "32"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=HANG_S, stdin=subprocess.DEVNULL)
    assert result.returncode != 0
    assert "No module named 'torch'" in result.stderr, result.stderr[-2000:]
    assert "No module named 'mxnet'" not in result.stderr, result.stderr[-2000:]


def test_mxnet_workers_get_a_thread_per_core(monkeypatch):
    """MXNet 1.9 without OMP_NUM_THREADS takes half of the logical CPUs on x86 (two hyper-threads a core assumed);
    a bench_models worker gets one thread per physical core this process may use."""
    cores = physical_cores()
    env = alone_env()
    if len(os.sched_getaffinity(0)) < 2 or cores < 2:
        pytest.skip("one core: half of the cores is the same core")
    assert mxnet_openmp_threads(env) == len(os.sched_getaffinity(0)) // 2  # what the probe sees: MXNet's choice
    for name in ("OMP_NUM_THREADS", "MXNET_OMP_MAX_THREADS"):
        monkeypatch.delenv(name, raising=False)
    assert mxnet_openmp_threads(dict(env, **bench_models.worker_env())) == cores


def onednn_kernels(verbose_log, kind):
    """How many oneDNN ``kind`` kernels ran between bench_models' breakdown marks."""
    marks = breakdown.BREAKDOWN_MARKS
    inside = verbose_log[verbose_log.index(marks[0]):verbose_log.index(marks[1])]
    return sum(line.startswith(("dnnl_verbose,exec,", "onednn_verbose,exec,")) and line.split(",")[3] == kind
               for line in inside.splitlines())


def test_fuse_bn_relu_reaches_the_training_step():
    """--fuse-bn-relu builds the workers' training networks with MXNet's BatchNorm+ReLU: a ResNet-18 step then runs
    ReLU kernels only after its 8 residual additions (forward and backward), not after its 9 other BatchNorms."""
    counts = {}
    for fused in (False, True):
        command = [sys.executable, BENCH_MODELS, "--breakdown-worker", "float32", "--breakdown-steps", "1", "--model",
                   "resnet18_v1.5", "--batch-size", "2", "--image-size", "32"] + (["--fuse-bn-relu"] if fused else [])
        child = subprocess.run(command, env=bench_models.worker_env(DNNL_VERBOSE="1"), capture_output=True,
                               text=True, timeout=HANG_S)
        assert child.returncode == 0, child.stderr[-2000:]
        counts[fused] = onednn_kernels(child.stdout, "eltwise"), onednn_kernels(child.stdout, "batch_normalization")
    assert counts[False] == (2 * 17, 2 * 20)  # ReLU forward and backward; BatchNorm forward and backward
    assert counts[True] == (2 * 8, 2 * 20)
