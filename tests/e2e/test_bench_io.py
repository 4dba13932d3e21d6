"""tools/bench_io.py as the README runs it, on a small photo set: every backend row, the automatic-augmentation
rows against the plain pipeline, and the decode-only ceiling with the pipeline's share of it, its scaling over
threads and the cores a GPU needs, each recomputed here from the rates it printed."""
import json
import math
import os
import subprocess
import sys

import pytest

from support.processes import HANG_S, ROOT, venv_env

pytestmark = pytest.mark.slow  # builds a photo set and starts a process per backend and round


TOOL = os.path.join(ROOT, "tools", "bench_io.py")


def bench(workdir, *args):
    result = subprocess.run([sys.executable, TOOL, "--workdir", str(workdir), "--count", "48", "--repeats", "1",
                             "--epochs", "1", "--batch-size", "8", "--image-shape", "3,64,64", *args],
                            env=venv_env(), capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stdout


def test_the_ceiling_and_every_row(tmp_path):
    report, out = bench(tmp_path, "--threads", "2", "--backends", "dali-cpu,mxnet", "--auto-augment",
                        "none,trivialaugment")
    results = report["results"]
    assert set(results) == {"dali-cpu", "dali-cpu+trivialaugment", "mxnet"}
    assert all(row["images_per_sec"] > 0 for row in results.values())
    assert results["dali-cpu"]["ratio"] == pytest.approx(1.0)  # augmentation's cost is against the plain pipeline
    ceiling = report["ceiling"]
    assert ceiling["share_of_decode"] == pytest.approx(ceiling["pipeline_1_thread"] / ceiling["decode_only"])
    assert ceiling["dali_decode_only"] > 0 and ceiling["after_decode_ms"] == pytest.approx(
        1000 / ceiling["pipeline_1_thread"] - 1000 / ceiling["dali_decode_only"])
    assert ceiling["pipeline_all_threads"] == pytest.approx(results["dali-cpu"]["images_per_sec"])
    assert ceiling["scaling"] == pytest.approx(ceiling["pipeline_all_threads"] / (2 * ceiling["pipeline_1_thread"]))
    # the pipeline as it feeds a GPU (uint8 crops, normalized on the GPU): its own rows, and the cores a GPU needs
    for_gpu = ceiling["for_gpu"]
    assert for_gpu["share_of_decode"] == pytest.approx(for_gpu["pipeline_1_thread"] / ceiling["decode_only"])
    assert for_gpu["scaling"] == pytest.approx(for_gpu["pipeline_all_threads"] / (2 * for_gpu["pipeline_1_thread"]))
    assert for_gpu["pipeline_all_threads"] != ceiling["pipeline_all_threads"]  # a run of its own
    per_core = for_gpu["pipeline_all_threads"] / min(2, len(os.sched_getaffinity(0)))
    assert ceiling["cores_per_gpu"] == {"V100": math.ceil(1442 / per_core), "A100": math.ceil(3410 / per_core)}
    assert "of decoding alone (target 0.85)" in out and "of linear (target 0.9)" in out
    assert "for a GPU (uint8 crops, normalized on the GPU), 2 threads" in out
    assert "DALI's crop-window decoder alone, 1 core" in out


def test_one_thread_and_no_ceiling(tmp_path):
    report, out = bench(tmp_path, "--threads", "1", "--backends", "dali-cpu")
    assert report["ceiling"]["pipeline_1_thread"] == pytest.approx(report["results"]["dali-cpu"]["images_per_sec"])
    assert "scaling" not in report["ceiling"] and "scaling over threads not measured" in out
    per_core = report["ceiling"]["for_gpu"]["pipeline_1_thread"]
    assert report["ceiling"]["cores_per_gpu"]["V100"] == math.ceil(1442 / per_core)
    report, out = bench(tmp_path, "--threads", "1", "--backends", "dali-cpu", "--no-ceiling")
    assert "ceiling" not in report and "decoding alone" not in out


def test_step_thread_rows(tmp_path):
    report, out = bench(tmp_path, "--step-thread", "--read-ahead", "1", "--steps", "3", "--step-ms", "1")
    assert set(report["step_thread_ms"]) == {"read in the call", "read ahead 1"}
    assert len(report["rounds"]) == 1 and report["rounds"][0] == report["step_thread_ms"]  # one round: its median
    assert all(ms > 0 for ms in report["step_thread_ms"].values())
    assert "warm page cache" in out and not report["cold"]


def test_per_device_pipelines(tmp_path):
    report, out = bench(tmp_path, "--threads", "2", "--devices", "2", "--backends", "dali-cpu", "--no-ceiling")
    devices = report["devices"]
    assert (devices["devices"], devices["threads_each"]) == (2, 1) and "ceiling" not in report
    assert devices["speedup"] == pytest.approx(devices["images_per_sec"] / devices["one_pipeline"])
    assert devices["of_one_pipeline_all_threads"] == pytest.approx(
        devices["images_per_sec"] / report["results"]["dali-cpu"]["images_per_sec"])
    assert "2 per-device pipelines (--kv-store device), 1 thread each" in out
    refused = subprocess.run([sys.executable, TOOL, "--workdir", str(tmp_path), "--count", "48", "--threads", "2",
                              "--devices", "3"], env=venv_env(), capture_output=True, text=True, timeout=HANG_S)
    assert refused.returncode == 2 and "--devices 3: give a divisor of --threads 2" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_handover_rows(tmp_path):
    report, out = bench(tmp_path, "--handover", "--steps", "3", "--step-ms", "1", "--batch-size", "4", "--threads", "1")
    assert set(report["handover_ms"]) == {"shared", "copied", "uint8 copied, for a GPU"}
    assert len(report["rounds"]) == 1 and report["rounds"][0] == report["handover_ms"]
    assert all(ms > 0 for ms in report["handover_ms"].values())
    assert "batch shared" in out and "batch copied" in out
    assert report["image_shape"] == [3, 64, 64] and "(3x64x64)" in out  # bench()'s --image-shape
