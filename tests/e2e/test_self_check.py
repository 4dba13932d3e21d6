"""tools/gpu_check.py, the self-check users run first on a GPU machine, run whole on this CPU machine."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from support.processes import HANG_S, ROOT, venv_env
from support.runs import CPU_CHECKS, GPU_CHECKS

pytestmark = pytest.mark.slow  # launches processes, trains end to end or builds heavy data


@pytest.mark.slow
def test_self_check_on_this_cpu_machine(tmp_path):
    report_path = tmp_path / "check.json"
    result = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gpu_check.py"), "--json", str(report_path)],
                            capture_output=True, text=True, timeout=HANG_S, env=venv_env(), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(report_path.read_text())
    verdicts = {check["name"]: check["verdict"] for check in report["checks"]}
    assert verdicts == {**{name: "pass" for name in CPU_CHECKS}, **{name: "not run (no GPU)" for name in GPU_CHECKS}}
    assert report["verdict"] == "pass" and report["gpus"] == 0
    assert report["summary"] == {"pass": len(CPU_CHECKS), "not run (no GPU)": len(GPU_CHECKS)}
    by_name = {check["name"]: check for check in report["checks"]}
    assert by_name["allreduce-cpu"]["data"]["reports"][0]["size"] == 2
    losses = by_name["training-cpu"]["data"]["losses"]
    assert np.mean(losses[-5:]) < np.mean(losses[:5])
    assert by_name["numerics-cpu"]["data"]["float64_forward"] <= 1e-4
    # the table printed is the JSON's
    lines = result.stdout.splitlines()
    for check in report["checks"]:
        row = next(line for line in lines if line.startswith(check["name"] + " "))
        assert check["verdict"] in row and check["detail"] in row
    assert lines[-1].startswith("PASS: ") and str(report_path) in lines[-1]


def test_fused_batchnorm_comparison_runs_on_the_cpu_and_sees_a_wrong_op(tmp_path, monkeypatch):
    """The fused-batchnorm check's comparison (two ResNet-18s: seconds, not the fast lane), on the CPU with NVIDIA's
    ops' stand-ins: same weights, logits and every gradient within tolerance, both timed; a fused op that is off
    fails it. Upstream MXNet on a GPU: not applicable, nothing built."""
    import types

    import mxnet as mx
    from selfcheck import fused_batchnorm

    from support import fused_standins
    machine = types.SimpleNamespace(gpu=False, num_gpus=0, workdir=str(tmp_path))
    monkeypatch.setattr(fused_batchnorm, "compare_fused", lambda *a, **k: pytest.fail("compared without the ops"))
    verdict, detail, _ = fused_batchnorm.check_fused_batchnorm(machine, None)
    assert verdict == "not applicable" and "upstream" in detail
    monkeypatch.undo()
    calls = fused_standins.register(monkeypatch)
    verdict, detail, found = fused_batchnorm.compare_fused(machine, mx.cpu(), "float32", "NCHW", 3, 18, 16, 2, steps=1)
    assert verdict == "pass" and calls["BatchNormAddRelu"] and calls["BatchNorm act_type"]
    assert found["forward_relative_error"] < 1e-5 and found["gradient_relative_error"] < 1e-4
    assert found["plain_step_s"] > 0 and found["fused_step_s"] > 0 and "fused vs plain" in detail
    monkeypatch.undo()
    fused_standins.register(monkeypatch, wrong=True)
    verdict, _, found = fused_batchnorm.compare_fused(machine, mx.cpu(), "float32", "NCHW", 3, 18, 16, 2, steps=1)
    assert verdict == "fail" and found["forward_relative_error"] > 1e-2
