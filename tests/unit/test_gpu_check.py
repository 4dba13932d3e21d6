"""tools/gpu_check.py's checks in process: the list is the issues, a check that breaks or measures wrong fails,
the verdicts and exit status."""
import json
import os
import subprocess
import sys
import types
import numpy as np
import pytest
import gpu_check
from conftest import CPU_CHECKS, GPU_CHECKS, EIGHT_GPU_MACHINE, planned_train_argv


@pytest.fixture(autouse=True)
def own_environment(monkeypatch):
    """gpu_check.main sets runner's variables in os.environ: here in a copy, not in the test process's."""
    monkeypatch.setattr(os, "environ", dict(os.environ))


def test_the_checks_listed_are_the_issues():
    assert {c.name for c in gpu_check.CHECKS} == CPU_CHECKS | GPU_CHECKS
    assert {c.name for c in gpu_check.CHECKS if c.gpu_only} == GPU_CHECKS


def test_a_check_that_breaks_or_measures_wrong_fails(tmp_path, monkeypatch):
    def broken(machine, args):
        raise RuntimeError("no such thing")

    checks = [gpu_check.Check("broken", "raises", broken),
              gpu_check.Check("gpu-only", "needs a GPU", broken, gpu_only=True)]
    machine = types.SimpleNamespace(gpu=False, num_gpus=0, workdir=str(tmp_path))
    results = gpu_check.run_checks(machine, None, checks)
    assert [(r["name"], r["verdict"]) for r in results] == [("broken", "fail"), ("gpu-only", "not run (no GPU)")]
    assert results[0]["detail"] == "RuntimeError: no such thing"
    # the data check against a reference that is off: it fails rather than passes
    args = types.SimpleNamespace(data_val=None)
    assert gpu_check.check_data_cpu(machine, args)[0] == "pass"
    monkeypatch.setattr(gpu_check, "opencv_reference", lambda rec, idx, count: np.zeros((count, 3, 224, 224)))
    verdict, detail, _ = gpu_check.check_data_cpu(machine, args)
    assert verdict == "fail" and "tolerance 4" in detail


def test_exit_status_and_json_say_fail(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "CHECKS", [gpu_check.Check("versions", "x", lambda m, a: ("fail", "bad", {}))])
    assert gpu_check.main(["--json", str(tmp_path / "r.json")]) == 1
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["verdict"] == "fail" and report["checks"][0]["detail"] == "bad"


def test_driver_and_architecture_verdicts(monkeypatch):
    machine = types.SimpleNamespace(gpu=True, num_gpus=8)
    monkeypatch.setattr(gpu_check, "nvidia_smi", lambda: [("Tesla V100-SXM2-32GB", "470.82.01")] * 8)
    verdict, detail, _ = gpu_check.check_driver(machine, None)
    assert verdict == "fail" and "older than r525" in detail and "--data-backend mxnet" in detail
    monkeypatch.setattr(gpu_check, "nvidia_smi", lambda: [("NVIDIA A100-SXM4-80GB", "535.104.05")] * 8)
    verdict, detail, _ = gpu_check.check_driver(machine, None)
    assert verdict == "pass" and detail.startswith("8 x NVIDIA A100-SXM4-80GB, driver 535.104.05")
    # V100, T4, A100, A10, L4 have cubins in the mxnet-cu112 wheel; H100 does not
    assert [gpu_check.wheel_covers(arch) for arch in (70, 75, 80, 86, 89, 90)] == [True] * 5 + [False]


def test_the_data_gpu_checks_batches_on_the_cpu(tmp_path, monkeypatch):
    """data-gpu's dali-cpu batch normalized after the hand-over (its default for a GPU), built as that check
    builds it, for the CPU here: uint8 crops handed over and normalized once, float16 NHWC 4-channel, within
    float16 rounding of the pipeline-normalized one, and a batch that is off fails the comparison."""
    import mxnet as mx
    import dali
    handed_over = []
    real_call = dali.DeviceNormalize.__call__

    def normalize(self, images):
        handed_over.append(images.dtype)
        return real_call(self, images)
    monkeypatch.setattr(dali.DeviceNormalize, "__call__", normalize)
    machine = types.SimpleNamespace(gpu=False, num_gpus=0, workdir=str(tmp_path))
    rec, idx = gpu_check.validation_records(machine, types.SimpleNamespace(data_val=None))
    reference, labels, _ = gpu_check.dali_batch(rec, idx, "cpu", mx.cpu())
    images, got_labels, where = gpu_check.dali_batch(rec, idx, "cpu", mx.cpu(), "float16", "NHWC", 4,
                                                     normalize="device")
    assert where[1] == "float16" and tuple(where[2]) == (8, 224, 224, 4)
    assert handed_over == [np.uint8]
    assert (got_labels == labels).all() and gpu_check.pixel_error(images, reference) < 0.1
    assert gpu_check.pixel_error(images * 1.02, reference) > 1  # 2 % off is seen


def test_the_checks_run_with_runners_variables_and_batch(tmp_path, monkeypatch):
    """The variables and the batch of `runner -n 8` on an 8-GPU machine (runner's plan), set before MXNet runs
    anything: CUDA graphs on and cuDNN autotune off, as training has them."""
    from rn50kit.launch import launcher
    runners_env, _ = planned_train_argv(["-n", "8", "--data-backend", "synthetic"], EIGHT_GPU_MACHINE, {})
    monkeypatch.setattr(launcher, "nvidia_gpu_count", lambda: EIGHT_GPU_MACHINE.gpus)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(EIGHT_GPU_MACHINE.cores)), raising=False)
    for key in runners_env:
        os.environ.pop(key, None)
    seen = {}

    def versions(machine, args):
        seen.update({key: os.environ.get(key) for key in runners_env}, batch=args.batch_size)
        return "pass", "ok", {}
    monkeypatch.setattr(gpu_check, "CHECKS", [gpu_check.Check("versions", "x", versions)])
    assert gpu_check.main(["--json", str(tmp_path / "r.json")]) == 0
    assert seen.pop("batch") == 192  # runner's -b on GPUs
    assert seen == runners_env and runners_env["MXNET_ENABLE_CUDA_GRAPHS"] == "1"
    assert runners_env["MXNET_CUDNN_AUTOTUNE_DEFAULT"] == "0"
    assert json.loads((tmp_path / "r.json").read_text())["environment"] == runners_env
    os.environ["MXNET_CUDNN_AUTOTUNE_DEFAULT"] = "1"  # a value the user set wins, as with runner
    assert gpu_check.main(["--json", str(tmp_path / "r.json"), "-b", "208"]) == 0
    assert seen["MXNET_CUDNN_AUTOTUNE_DEFAULT"] == "1" and seen["batch"] == 208


def test_layout_timing_and_memory_run_at_the_batch_in_fresh_processes(monkeypatch):
    """Both layouts are timed, and the memory checked, each in a new process at the user's batch: no memory left
    in MXNet's or DALI's pools by earlier checks."""
    import mxnet as mx
    commands = []

    def fake_run(command, **kwargs):
        commands.append(command)
        layout, channels, batch, steps, warmup = json.loads(command[command.index("--step-worker") + 1])
        out = {"seconds": 0.2 if layout == "NCHW" else 0.1} if batch < 300 else \
            {"error": "out of GPU memory: lower the batch"}
        return subprocess.CompletedProcess(command, 0, "STEP " + json.dumps(out) + "\n", "")
    monkeypatch.setattr(gpu_check.subprocess, "run", fake_run)
    monkeypatch.setattr(gpu_check, "step_seconds", lambda *a, **k: pytest.fail("timed in the checking process"))
    monkeypatch.setattr(mx.context, "gpu_memory_info", lambda ordinal: (1 << 30, 16 << 30))
    machine = types.SimpleNamespace(gpu=True, num_gpus=1)
    verdict, detail, found = gpu_check.check_layout_speed(machine, types.SimpleNamespace(batch_size=208))
    assert verdict == "pass" and "at batch 208" in detail and found["batch"] == 208
    verdict, detail, _ = gpu_check.check_memory(machine, types.SimpleNamespace(batch_size=208))
    assert verdict == "pass" and "fresh process" in detail
    assert len(commands) == 3 and all(c[:2] == [sys.executable, os.path.abspath(gpu_check.__file__)]
                                      for c in commands)
    assert [json.loads(c[-1])[:3] for c in commands] == [["NCHW", 3, 208], ["NHWC", 4, 208], ["NHWC", 4, 208]]
    verdict, detail, _ = gpu_check.check_memory(machine, types.SimpleNamespace(batch_size=400))
    assert verdict == "fail" and detail == "-b 400 does not fit: out of GPU memory: lower the batch"


def test_allreduce_on_one_gpu_is_not_applicable(monkeypatch):
    monkeypatch.setattr(gpu_check, "run_allreduce", lambda workers: pytest.fail("ran on one GPU"))
    verdict, _, _ = gpu_check.check_allreduce_gpu(types.SimpleNamespace(gpu=True, num_gpus=1), None)
    assert verdict == "not applicable"
    assert gpu_check.summary([{"verdict": verdict}]) == {"not applicable": 1}


class FakeCuda:
    """libcuda.so.1's three calls, answering compute capability ``arch``."""

    def __init__(self, arch):
        self.arch = arch

    def cuInit(self, flags):
        return 0

    def cuDeviceGet(self, device, ordinal):
        return 0

    def cuDeviceGetAttribute(self, value, attribute, device):
        value._obj.value = {75: self.arch // 10, 76: self.arch % 10}[attribute]
        return 0


def test_compute_capability_from_the_drivers_versioned_library(monkeypatch):
    loaded = []

    def cdll(name):
        loaded.append(name)
        if name != "libcuda.so.1":
            raise OSError(f"{name}: cannot open shared object file")
        return FakeCuda(90)
    monkeypatch.setattr(gpu_check.ctypes, "CDLL", cdll)
    assert gpu_check.compute_capability(0) == 90 and loaded == ["libcuda.so.1"]


def test_an_h100_with_a_pypi_wheel_is_named_in_one_line_before_any_kernel(tmp_path, monkeypatch, capsys):
    ran = []
    for check in gpu_check.CHECKS:
        if check.gpu_only:
            monkeypatch.setattr(check, "run", lambda machine, args, name=check.name: ran.append(name))
    monkeypatch.setattr(gpu_check, "Machine", lambda: types.SimpleNamespace(gpu=True, num_gpus=8,
                                                                            workdir=str(tmp_path / "w")))
    monkeypatch.setattr(gpu_check.ctypes, "CDLL", lambda name: FakeCuda(90))
    monkeypatch.setattr(gpu_check, "pypi_gpu_wheel", lambda: "mxnet-cu112 1.9.1")
    gpu_only = ",".join(c.name for c in gpu_check.CHECKS if c.gpu_only)
    assert gpu_check.main(["--json", str(tmp_path / "r.json"), "--only", gpu_only]) == 1
    assert ran == []
    said = [line for line in capsys.readouterr().err.splitlines() if "sm_90" in line]
    assert len(said) == 1 and said[0].startswith("gpu_check: this GPU is compute capability 9.0 (sm_90)")
    for route in ("NGC MXNet container 24.05 or 24.06", "CUDA 11.8, gcc 11, cuDNN 8.9", "5.0-8.9"):
        assert route in said[0]
    verdicts = {c["name"]: c["verdict"] for c in json.loads((tmp_path / "r.json").read_text())["checks"]}
    assert verdicts.pop("kernels") == "fail" and set(verdicts.values()) == {"not run (no MXNet kernels for this GPU)"}
    # an A100 (8.0), or an H100 with NGC's or a source build (no mxnet-cuXXX wheel installed): the checks run
    for arch, wheel in ((80, "mxnet-cu112 1.9.1"), (90, None)):
        monkeypatch.setattr(gpu_check.ctypes, "CDLL", lambda name, arch=arch: FakeCuda(arch))
        monkeypatch.setattr(gpu_check, "pypi_gpu_wheel", lambda wheel=wheel: wheel)
        assert gpu_check.unsupported_gpu(types.SimpleNamespace(gpu=True, num_gpus=1)) is None
