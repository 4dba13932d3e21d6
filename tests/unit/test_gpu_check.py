"""tools/gpu_check.py's checks in process: the list is the issues, a check that breaks or measures wrong fails,
the verdicts and exit status."""
import json
import os
import subprocess
import types

import gpu_check
import numpy as np
import pytest
from selfcheck import collectives, environment, pipelines, speed

from rn50kit.hardware import devices
from support.runs import CPU_CHECKS, EIGHT_GPU_MACHINE, GPU_CHECKS, planned_train_argv


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
    assert pipelines.check_data_cpu(machine, args)[0] == "pass"
    monkeypatch.setattr(pipelines, "opencv_reference", lambda rec, idx, count: np.zeros((count, 3, 224, 224)))
    verdict, detail, _ = pipelines.check_data_cpu(machine, args)
    assert verdict == "fail" and "tolerance 4" in detail


def test_exit_status_and_json_say_fail(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "CHECKS", [gpu_check.Check("versions", "x", lambda m, a: ("fail", "bad", {}))])
    assert gpu_check.main(["--json", str(tmp_path / "r.json")]) == 1
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["verdict"] == "fail" and report["checks"][0]["detail"] == "bad"


def test_driver_and_architecture_verdicts(monkeypatch):
    machine = types.SimpleNamespace(gpu=True, num_gpus=8)
    monkeypatch.setattr(environment, "nvidia_smi", lambda: [("Tesla V100-SXM2-32GB", "470.82.01")] * 8)
    verdict, detail, _ = environment.check_driver(machine, None)
    assert verdict == "fail" and "older than r525" in detail and "--data-backend mxnet" in detail
    monkeypatch.setattr(environment, "nvidia_smi", lambda: [("NVIDIA A100-SXM4-80GB", "535.104.05")] * 8)
    verdict, detail, _ = environment.check_driver(machine, None)
    assert verdict == "pass" and detail.startswith("8 x NVIDIA A100-SXM4-80GB, driver 535.104.05")
    # V100, T4, A100, A10, L4 have cubins in the mxnet-cu112 wheel; H100 does not
    assert [environment.wheel_covers(arch) for arch in (70, 75, 80, 86, 89, 90)] == [True] * 5 + [False]


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
    rec, idx = pipelines.validation_records(machine, types.SimpleNamespace(data_val=None))
    reference, labels, _ = pipelines.dali_batch(rec, idx, "cpu", mx.cpu())
    images, got_labels, where = pipelines.dali_batch(rec, idx, "cpu", mx.cpu(), "float16", "NHWC", 4,
                                                     normalize="device")
    assert where[1] == "float16" and tuple(where[2]) == (8, 224, 224, 4)
    assert handed_over == [np.uint8]
    assert (got_labels == labels).all() and pipelines.pixel_error(images, reference) < 0.1
    assert pipelines.pixel_error(images * 1.02, reference) > 1  # 2 % off is seen


def test_the_checks_run_with_runners_variables_and_batch(tmp_path, monkeypatch):
    """The variables and the batch of `runner -n 8` on an 8-GPU machine (runner's plan), set before MXNet runs
    anything: CUDA graphs on and cuDNN autotune off, as training has them."""
    from rn50kit.launch import machine
    runners_env, _ = planned_train_argv(["-n", "8", "--data-backend", "synthetic"], EIGHT_GPU_MACHINE, {})
    monkeypatch.setattr(machine, "nvidia_gpu_count", lambda: EIGHT_GPU_MACHINE.gpus)
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
    # runner's GPU workers get one OpenMP thread; the CPU checks here, one process alone, a thread per core
    assert runners_env["OMP_NUM_THREADS"] == "1" and seen.pop("OMP_NUM_THREADS") == str(devices.openmp_threads())
    assert int(os.environ["OMP_NUM_THREADS"]) > 1
    runners_env.pop("OMP_NUM_THREADS")
    assert seen == runners_env and runners_env["MXNET_ENABLE_CUDA_GRAPHS"] == "1"
    assert runners_env["MXNET_CUDNN_AUTOTUNE_DEFAULT"] == "0"
    assert json.loads((tmp_path / "r.json").read_text())["environment"] == dict(
        runners_env, OMP_NUM_THREADS=str(devices.openmp_threads()))
    os.environ["MXNET_CUDNN_AUTOTUNE_DEFAULT"] = "1"  # a value the user set wins, as with runner
    assert gpu_check.main(["--json", str(tmp_path / "r.json"), "-b", "208"]) == 0
    assert seen["MXNET_CUDNN_AUTOTUNE_DEFAULT"] == "1" and seen["batch"] == 208


def fake_step_processes(monkeypatch, events):
    """subprocess.run of the step workers recorded in ``events``; a batch of 300 or more does not fit."""
    def fake_run(command, **kwargs):
        spec = json.loads(command[command.index("--step-worker") + 1])
        events.append(("fresh process", spec))
        layout, channels, batch = spec[:3]
        out = {"seconds": 0.2 if layout == "NCHW" else 0.1} if batch < 300 else \
            {"error": "out of GPU memory: lower the batch"}
        return subprocess.CompletedProcess(command, 0, "STEP " + json.dumps(out) + "\n", "")
    monkeypatch.setattr(speed.subprocess, "run", fake_run)


def record_pool_releases(monkeypatch, events):
    import mxnet as mx
    from nvidia.dali import backend
    monkeypatch.setattr(mx.Context, "empty_cache", lambda ctx: events.append(("empty_cache", str(ctx))))
    monkeypatch.setattr(backend, "ReleaseUnusedMemory", lambda: events.append(("dali release", None)))
    monkeypatch.setattr(mx.context, "gpu_memory_info", lambda ordinal: (1 << 30, 16 << 30))


def test_layout_timing_and_memory_run_at_the_batch_in_fresh_processes(monkeypatch):
    """Both layouts are timed with the 4 channels the advised `--conv-layout NCHW` run keeps, and the memory
    checked with the margin held, each in a new process at the user's batch."""
    events = []
    fake_step_processes(monkeypatch, events)
    record_pool_releases(monkeypatch, events)
    monkeypatch.setattr(speed, "step_seconds", lambda *a, **k: pytest.fail("timed in the checking process"))
    machine = types.SimpleNamespace(gpu=True, num_gpus=1)
    verdict, detail, found = speed.check_layout_speed(machine, types.SimpleNamespace(batch_size=208))
    assert verdict == "pass" and "at batch 208" in detail and found["batch"] == 208
    verdict, detail, _ = speed.check_memory(machine, types.SimpleNamespace(batch_size=208))
    assert verdict == "pass" and "fresh process" in detail
    specs = [spec for kind, spec in events if kind == "fresh process"]
    reserve = specs[-1][5]
    assert [spec[:3] for spec in specs] == [["NCHW", 4, 208], ["NHWC", 4, 208], ["NHWC", 4, 208]]
    assert [spec[5] for spec in specs[:2]] == [0, 0] and reserve > 0
    verdict, detail, _ = speed.check_memory(machine, types.SimpleNamespace(batch_size=400))
    assert verdict == "fail" and detail.startswith("-b 400 does not fit with ")
    assert detail.endswith(": out of GPU memory: lower the batch")


def test_the_memory_verdict_holds_a_stated_margin_for_the_pipeline_and_the_collectives(monkeypatch):
    """The step in the fresh process runs beside the dali-gpu pipeline's, NCCL's and Horovod's fusion buffer's
    memory (runner's HOROVOD_FUSION_THRESHOLD), held on the GPU; the verdict names each part and the sum."""
    import mxnet as mx
    events = []
    fake_step_processes(monkeypatch, events)
    record_pool_releases(monkeypatch, events)
    monkeypatch.setitem(os.environ, "HOROVOD_FUSION_THRESHOLD", str(64 << 20))
    verdict, detail, found = speed.check_memory(types.SimpleNamespace(gpu=True, num_gpus=1),
                                                    types.SimpleNamespace(batch_size=192))
    parts = found["margin_bytes"]
    assert parts["Horovod's fusion buffer"] == 64 << 20 and len(parts) == 3
    assert events[-1][1][5] == sum(parts.values()) > (1 << 30)
    assert f"fits with {sum(parts.values()) / 2 ** 30:.2f} GiB held back for " in detail
    for part, size in parts.items():
        assert f"{part} ({size >> 20} MiB)" in detail
    assert "dali-gpu" in detail and "NCCL" in detail
    held = speed.hold_memory(3 << 20, mx.cpu())  # what the fresh process holds, on the CPU here
    assert held.shape == (3 << 20,) and held.dtype == np.uint8 and speed.hold_memory(0, mx.cpu()) is None


def test_emptying_the_pools_of_gpus_this_process_never_used_is_no_error():
    """MXNet refuses to empty a pool it never made (this CPU build's GPU contexts, or a GPU the self-check has not
    touched yet): the layout and memory checks, which now run first, must not fail on it."""
    import mxnet as mx
    with pytest.raises(mx.base.MXNetError, match="have not allocated"):
        mx.gpu(1).empty_cache()
    speed.release_gpu_memory(types.SimpleNamespace(gpu=True, num_gpus=2))


def test_fresh_process_checks_run_before_any_gpu_work_here_with_the_pools_emptied(tmp_path, monkeypatch):
    """MXNet's pooled allocator never gives memory back: the layout and memory processes start before any GPU
    check of this process has run, each after MXNet's pool on every GPU and DALI's were emptied."""
    events = []
    fake_step_processes(monkeypatch, events)
    record_pool_releases(monkeypatch, events)
    for check in gpu_check.CHECKS:
        if check.name not in ("layout-speed", "memory"):
            monkeypatch.setattr(check, "run", lambda machine, args, name=check.name: (
                events.append(("in this process", name)) or ("pass", name, {})))
    machine = types.SimpleNamespace(gpu=True, num_gpus=2, workdir=str(tmp_path))
    results = gpu_check.run_checks(machine, types.SimpleNamespace(batch_size=192), gpu_check.CHECKS)
    assert {r["name"]: r["verdict"] for r in results}["memory"] == "pass"
    # the driver check asks nvidia-smi and the libraries' versions: no GPU memory
    gpu_work = [i for i, (kind, name) in enumerate(events)
                if kind == "in this process" and name in GPU_CHECKS - {"driver"}]
    fresh = [i for i, (kind, _) in enumerate(events) if kind == "fresh process"]
    assert len(fresh) == 3 and max(fresh) < min(gpu_work)
    releases = [event for event in events[:fresh[0]] if event[0] != "in this process"]
    assert releases == [("empty_cache", "gpu(0)"), ("empty_cache", "gpu(1)"), ("dali release", None)]
    before_memory = [event for event in events[fresh[1] + 1:fresh[2]] if event[0] != "in this process"]
    assert before_memory == releases


def test_allreduce_on_one_gpu_is_not_applicable(monkeypatch):
    monkeypatch.setattr(collectives, "run_allreduce", lambda workers: pytest.fail("ran on one GPU"))
    verdict, _, _ = collectives.check_allreduce_gpu(types.SimpleNamespace(gpu=True, num_gpus=1), None)
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
    monkeypatch.setattr(environment.ctypes, "CDLL", cdll)
    assert devices.compute_capability(0) == 90 and loaded == ["libcuda.so.1"]


def test_an_h100_with_a_pypi_wheel_is_named_in_one_line_before_any_kernel(tmp_path, monkeypatch, capsys):
    ran = []
    for check in gpu_check.CHECKS:
        if check.gpu_only:
            monkeypatch.setattr(check, "run", lambda machine, args, name=check.name: ran.append(name))
    monkeypatch.setattr(gpu_check, "Machine", lambda: types.SimpleNamespace(gpu=True, num_gpus=8,
                                                                            workdir=str(tmp_path / "w")))
    monkeypatch.setattr(environment.ctypes, "CDLL", lambda name: FakeCuda(90))
    monkeypatch.setattr(devices, "pypi_gpu_wheel", lambda: "mxnet-cu112 1.9.1")
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
        monkeypatch.setattr(environment.ctypes, "CDLL", lambda name, arch=arch: FakeCuda(arch))
        monkeypatch.setattr(devices, "pypi_gpu_wheel", lambda wheel=wheel: wheel)
        assert gpu_check.unsupported_gpu(types.SimpleNamespace(gpu=True, num_gpus=1)) is None


def test_runner_refuses_an_h100_with_a_pypi_wheel_before_any_worker_by_the_self_checks_test(monkeypatch, capsys):
    """runner on compute capability 9.0 with mxnet-cu112: one line (gpu_check's), exit 2, nothing launched."""
    import mxnet as mx

    from rn50kit.launch import machine as this_machine
    from rn50kit.launch import plan, runner
    monkeypatch.setattr(this_machine, "nvidia_gpu_count", lambda: 8)
    monkeypatch.setattr(mx.context, "num_gpus", lambda: 8)
    monkeypatch.setattr(environment.ctypes, "CDLL", lambda name: FakeCuda(90))
    monkeypatch.setattr(devices, "pypi_gpu_wheel", lambda: "mxnet-cu112 1.9.1")
    monkeypatch.setattr(plan, "plan_launch", lambda *a, **k: pytest.fail("planned a launch"))
    with pytest.raises(SystemExit) as refused:
        runner.main(["-n", "8", "--data-backend", "synthetic"])
    err = capsys.readouterr().err.strip()
    assert refused.value.code == 2 and "\n" not in err
    assert err == "runner: error: " + gpu_check.unsupported_gpu(types.SimpleNamespace(gpu=True, num_gpus=8))
    assert "compute capability 9.0 (sm_90)" in err and "NGC MXNet container" in err
    monkeypatch.setattr(environment.ctypes, "CDLL", lambda name: FakeCuda(80))  # an A100: the GPUs are used
    machine = this_machine.detect_machine()
    assert machine.gpus == 8 and machine.nvidia_fused is False  # upstream MXNet: no fused BatchNorm on GPUs
