"""The container route (docs/gpu.md): the kit on Python 3.10 and 3.11, refusing other Pythons, an MXNet older than
1.9 and a Horovod without MXNet in one line; the in-container set-up's table; the Dockerfile's steps; and the
route's commands (2 workers training with a resume, scoring, prediction over a folder). CI runs this file in both
lanes: the kit's .venv (3.11) and the Python 3.10 environment that stands in for NVIDIA's container
(`make test-container`)."""
import csv
import glob
import json
import os
import re
import subprocess
import sys

import pytest

from support.processes import HANG_S, LONG_HANG_S, ROOT, venv_env

pytestmark = pytest.mark.slow  # launches processes or trains end to end

PYENV_ROOT = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
ENTRY_POINTS = [["runner", "-n", "1"], ["train.py", "--help"], ["benchmark.py", "--help"], ["tools/gpu_check.py"],
                ["tools/check_environment.py"]] + [
    [f"tools/{name}.py", "--help"] for name in ("check_dataset", "prepare_folder", "make_demo_data", "convert_states",
                                               "export_onnx", "export_weights", "plot_report")]


def other_python(major_minor):
    """An interpreter of another Python version (pyenv's), or None."""
    found = sorted(glob.glob(os.path.join(PYENV_ROOT, "versions", f"{major_minor}.*", "bin", f"python{major_minor}")))
    return found[-1] if found else None


def one_error_line(result):
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.mark.parametrize("version", ["3.8", "3.12"])
def test_every_command_refuses_a_python_it_does_not_run_on_in_one_line(version, tmp_path):
    """NVIDIA's older containers have Python 3.8; MXNet 1.9 has no release past 3.11."""
    python = other_python(version)
    if python is None:
        pytest.skip(f"no Python {version} here (pyenv's {PYENV_ROOT}/versions); CI's machines have one")
    env = {key: value for key, value in venv_env().items() if key not in ("PYTHONPATH", "RN50_PYTHON")}
    for entry in ENTRY_POINTS:
        result = subprocess.run([python, os.path.join(ROOT, entry[0]), *entry[1:]], capture_output=True, text=True,
                                env=env, cwd=tmp_path, timeout=HANG_S)
        line = one_error_line(result)
        assert "needs Python 3.10 or 3.11" in line and f"found {version}." in line, (entry, line)
        assert ("24.05 or later" in line) == (version == "3.8")  # the container that has Python 3.10
    result = subprocess.run([os.path.join(ROOT, "tools", "setup_container.sh"), python], capture_output=True,
                            text=True, env=env, timeout=HANG_S)
    assert f"found {version}." in one_error_line(result)


def shadowing(tmp_path, package, files):
    """A PYTHONPATH whose ``package`` (files: {relative path: text}) hides the installed one."""
    for relative, text in files.items():
        path = tmp_path / package / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    env = venv_env()
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env["PYTHONPATH"]
    return env


def test_a_container_with_an_old_mxnet_or_a_horovod_without_mxnet_is_refused_before_anything_is_installed(
        tmp_path):
    setup = os.path.join(ROOT, "tools", "setup_container.sh")
    old_mxnet = shadowing(tmp_path / "old", "mxnet", {"__init__.py": "__version__ = '1.8.0'\n"})
    line = one_error_line(subprocess.run([setup, sys.executable], capture_output=True, text=True, env=old_mxnet,
                                         timeout=HANG_S))
    assert "needs MXNet 1.9" in line and "found 1.8.0" in line
    result = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--help"], capture_output=True,
                            text=True, env=old_mxnet, timeout=HANG_S)
    assert "found 1.8.0" in one_error_line(result)

    no_binding = shadowing(tmp_path / "bare", "horovod", {"__init__.py": "", "mxnet/__init__.py": ""})
    for command in ([setup, sys.executable],
                    [sys.executable, os.path.join(ROOT, "runner"), "-n", "2", "--data-backend", "synthetic",
                     "--dtype", "float32", "--dry-run"]):
        line = one_error_line(subprocess.run(command, capture_output=True, text=True, env=no_binding,
                                             timeout=HANG_S))
        assert "Horovod with MXNet support is not installed" in line, line


def test_the_environment_table_agrees_with_horovods_own_check():
    """tools/check_environment.py (the set-up's last step) against horovodrun --check-build and MXNet's features."""
    import mxnet as mx
    result = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "check_environment.py"), "--json"],
                            capture_output=True, text=True, env=venv_env(), timeout=HANG_S)
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    assert facts["python"] == sys.version.split()[0] and facts["mxnet"]["version"] == mx.__version__
    own = subprocess.run(["horovodrun", "--check-build"], capture_output=True, text=True, env=venv_env(),
                         timeout=HANG_S).stdout
    ticked = {m.group(2): m.group(1) == "X" for m in re.finditer(r"\[(X| )\] (\S+)", own)}
    build = facts["horovod"]["build"]
    assert (ticked["Gloo"], ticked["MPI"], ticked["NCCL"]) == (build["gloo"], build["mpi"], build["nccl"])
    assert ticked["MXNet"] and "MXNet" in facts["horovod"]["frameworks"]
    features = mx.runtime.Features()
    assert facts["mxnet"]["features"] == {name: features.is_enabled(name) for name in facts["mxnet"]["features"]}
    table = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "check_environment.py")],
                           capture_output=True, text=True, env=venv_env(), timeout=HANG_S).stdout
    assert re.search(rf"^MXNet +{re.escape(mx.__version__)} ", table, re.M)
    assert re.search(r"^  NVIDIA fused ops +BatchNorm\+ReLU no, BatchNormAddRelu no$", table, re.M)  # upstream


def test_the_dockerfile_runs_the_container_setup_and_then_the_self_check():
    with open(os.path.join(ROOT, "Dockerfile")) as f:
        lines = [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
    assert lines[0] == "ARG TAG=24.06" and lines[1] == "FROM nvcr.io/nvidia/mxnet:${TAG}-py3"
    runs = [line for line in lines if line.startswith("RUN ")]
    assert runs == ["RUN tools/setup_container.sh python"]
    assert lines[-1] == 'CMD ["python", "tools/gpu_check.py"]'
    with open(os.path.join(ROOT, ".dockerignore")) as f:
        ignored = f.read().split()
    assert {".venv*", ".git", "runs", "data"} <= set(ignored)


def test_the_route_trains_on_two_workers_resumes_scores_and_predicts_a_folder(digits_data, tmp_path):
    """The container route's commands after the self-check, on the demo data."""
    runner = [sys.executable, os.path.join(ROOT, "runner"), "-n", "2", "-b", "16", "-l", "0.4", "--dtype", "float32",
              "--data-backend", "dali-cpu", "--data-root", str(digits_data), "--num-layers", "18",
              "--num-classes", "10", "--image-shape", "3,32,32", "--data-val-resize", "32", "--num-examples", "256",
              "--warmup-epochs", "0", "--seed", "1", "--workspace", "ws"]

    def ok(command):
        result = subprocess.run(command, capture_output=True, text=True, env=venv_env(), cwd=tmp_path,
                                timeout=LONG_HANG_S)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return result

    ok(runner + ["-e", "1"])
    resumed = ok(runner + ["-e", "2"])
    assert "Resuming" in resumed.stderr + resumed.stdout
    with open(tmp_path / "ws" / "report.json") as f:
        assert len(json.load(f)["metrics"]["val.top1"]) == 2
    best = str(tmp_path / "ws" / "model-best.params")
    scored = ok([sys.executable, os.path.join(ROOT, "train.py"), "--mode", "val", "--load", best,
                 "--data-root", str(digits_data)])
    assert "top1" in scored.stdout + scored.stderr
    folder = digits_data / "raw" / "val" / "3"
    ok([sys.executable, os.path.join(ROOT, "train.py"), "--mode", "pred", "--load", best, "--data-pred", str(folder),
        "--pred-out", str(tmp_path / "predictions.csv")])
    with open(tmp_path / "predictions.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(os.path.basename(row["path"]) for row in rows) == sorted(os.listdir(folder))
