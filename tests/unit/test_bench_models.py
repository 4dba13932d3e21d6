"""tools/bench_models.py's workers: the PyTorch one starts in a Python without MXNet (PyTorch's own venv, as the
README makes it), and MXNet's get a thread per physical core, as PyTorch's do. (Its timings, INT8 and bfloat16
workers and the kernel breakdown: tests/test_bfloat16_paths.py.)"""
import os
import subprocess
import sys

import pytest

from conftest import ROOT, alone_env, mxnet_openmp_threads, physical_cores

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
    marks = bench_models.BREAKDOWN_MARKS
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
                               text=True, timeout=600)
        assert child.returncode == 0, child.stderr[-2000:]
        counts[fused] = onednn_kernels(child.stdout, "eltwise"), onednn_kernels(child.stdout, "batch_normalization")
    assert counts[False] == (2 * 17, 2 * 20)  # ReLU forward and backward; BatchNorm forward and backward
    assert counts[True] == (2 * 8, 2 * 20)


def test_a_share_above_the_ceiling_is_explained():
    # a ResNet-50 at 224 px: 8.2 GFLOP an image forward (4.1 G multiply-adds), about three times that a step
    ceilings = {"float32": 100.0, "bfloat16": 400.0}
    rates = {"ours float32 training step": 5.0, "ours bfloat16 inference": 40.0}  # 1.23 and 0.82 of 100 / 400
    results = {key: {"ceiling_fraction": bench_models.fraction(key, ips, ceilings, "resnet50_v1.5", 224)}
               for key, ips in rates.items()}
    assert results["ours float32 training step"]["ceiling_fraction"] > 1 > results["ours bfloat16 inference"][
        "ceiling_fraction"]
    note = bench_models.above_ceiling_note(results)
    assert note.startswith("note: ours float32 training step above 100 %") and "bfloat16" not in note
    del results["ours float32 training step"]
    assert bench_models.above_ceiling_note(results) is None
