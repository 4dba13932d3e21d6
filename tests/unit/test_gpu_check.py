"""tools/gpu_check.py's checks in process: the list is the issues, a check that breaks or measures wrong fails,
the verdicts and exit status."""
import json
import types
import numpy as np
import gpu_check
from conftest import CPU_CHECKS, GPU_CHECKS


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
