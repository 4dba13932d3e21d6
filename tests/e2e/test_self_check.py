"""tools/gpu_check.py, the self-check users run first on a GPU machine, run whole on this CPU machine."""
import json
import os
import subprocess
import sys
import numpy as np
import pytest
from conftest import HANG_S, ROOT, venv_env, CPU_CHECKS, GPU_CHECKS

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
