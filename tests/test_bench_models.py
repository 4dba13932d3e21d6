"""tools/bench_models.py's workers: the PyTorch one starts in a Python without MXNet (PyTorch's own venv, as the
README makes it), and MXNet's get every core, as PyTorch's do. (Its timings, INT8 and bfloat16 workers and the
kernel breakdown: tests/test_bfloat16_paths.py.)"""
import os
import subprocess
import sys

import pytest

from conftest import ROOT

import bench_models

BENCH_MODELS = os.path.join(ROOT, "tools", "bench_models.py")


def test_the_pytorch_worker_starts_without_mxnet():
    """The README's PyTorch venv holds torch and numpy only. Started in a Python without site-packages (no MXNet,
    no PyTorch), the worker must get as far as importing torch: what it lacks is PyTorch, not MXNet."""
    command = [sys._base_executable, "-I", "-S", BENCH_MODELS, "--worker", "torch", "--batch-size", "2",
               "--image-size", "32"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode != 0
    assert "No module named 'torch'" in result.stderr, result.stderr[-2000:]
    assert "mxnet" not in result.stderr.lower(), result.stderr[-2000:]


def mxnet_openmp_threads(env):
    """The OpenMP team size MXNet set for itself, as its process reports it after `import mxnet`."""
    probe = "import ctypes, mxnet; print(ctypes.CDLL('libgomp.so.1').omp_get_max_threads())"
    result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return int(result.stdout.split()[-1])


def test_mxnet_workers_get_every_core(monkeypatch):
    """MXNet 1.9 without OMP_NUM_THREADS takes half the cores on x86 (two hyper-threads a core assumed); a
    bench_models worker gets every core this process may use, as the PyTorch worker does."""
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("one core: half of the cores is the same core")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    unset = dict(os.environ, PYTHONPATH=ROOT)
    assert mxnet_openmp_threads(unset) == cores // 2  # what the probe measures: MXNet's own choice
    assert mxnet_openmp_threads(dict(bench_models.worker_env(), PYTHONPATH=ROOT)) == cores
