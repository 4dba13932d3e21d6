"""runner, benchmark.py and the tools run under the Python they were started with (or the one $RN50_PYTHON
names), never silently under the kit's .venv: a second environment, like a .venv-gpu, is honoured."""
import glob
import json
import os
import subprocess
import sys

import pytest

from support.datasets import labelled_records
from support.processes import HANG_S, ROOT, venv_env
from support.runs import TINY_RUN as TINY

pytestmark = pytest.mark.slow  # launches processes or trains end to end


@pytest.fixture(scope="module")
def second_env(tmp_path_factory):
    """(python of a second venv that has MXNet, folder where its processes leave their command lines)."""
    root = tmp_path_factory.mktemp("venv-gpu")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "env")], check=True, timeout=HANG_S)
    site_dirs = glob.glob(str(root / "env" / "lib" / "python3*" / "site-packages"))
    ours = [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(os.path.join(p, "mxnet"))]
    assert len(site_dirs) == 1 and ours
    markers = root / "markers"
    markers.mkdir()
    with open(os.path.join(site_dirs[0], "kit_packages.pth"), "w") as f:
        f.write(f"import site; site.addsitedir({ours[0]!r})\n")
        f.write(f"import os, sys; open(os.path.join({str(markers)!r}, str(os.getpid())), 'w')"
                ".write(sys.executable + ' ' + ' '.join(sys.orig_argv))\n")
    return str(root / "env" / "bin" / "python"), markers


def dry_run_command(python, environ=None):
    env = venv_env()
    env.pop("RN50_PYTHON", None)
    env.update(environ or {})
    result = subprocess.run([python, os.path.join(ROOT, "runner"), "-n", "1", *TINY, "--dry-run"], env=env,
                            capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1].split(), result.stderr


def interpreter_of_train(command):
    return command[next(i for i, word in enumerate(command) if word.endswith("train.py")) - 1]


def test_choice_rules():
    from rn50kit.config import cli as runner  # what runner and benchmark.py choose with
    kit = "/kit/.venv/bin/python"
    assert runner.python_to_use("/x/.venv-gpu/bin/python", None, True, kit) is None
    assert runner.python_to_use("/usr/bin/python3", None, False, kit) == kit
    assert runner.python_to_use("/usr/bin/python3", None, False, None) is None  # nothing better: stay
    assert runner.python_to_use(kit, "/x/.venv-gpu/bin/python", True, kit) == "/x/.venv-gpu/bin/python"
    assert runner.python_to_use("/x/.venv-gpu/bin/python", "/x/.venv-gpu/bin/python", True, kit) is None


def test_runner_keeps_the_python_it_was_started_with(second_env):
    python, _ = second_env
    command, stderr = dry_run_command(python)
    assert interpreter_of_train(command) == python
    assert "note" not in stderr


def test_the_python_named_in_the_environment_wins(second_env):
    python, _ = second_env
    command, _ = dry_run_command(sys.executable, {"RN50_PYTHON": python})
    assert interpreter_of_train(command) == python


def test_a_python_without_mxnet_falls_back_to_the_kits_venv_and_says_so():
    kit_python = os.path.join(ROOT, ".venv", "bin", "python")
    base = getattr(sys, "_base_executable", None)
    if not os.path.isfile(kit_python) or not base or base == sys.executable:
        pytest.skip("needs the kit's .venv and a base Python outside it")
    has_mxnet = subprocess.run([base, "-c", "import importlib.util as u; print(u.find_spec('mxnet') is not None)"],
                               capture_output=True, text=True, timeout=HANG_S).stdout.strip()
    if has_mxnet != "False":
        pytest.skip(f"{base} has MXNet itself")
    command, stderr = dry_run_command(base)
    assert interpreter_of_train(command) == kit_python
    assert f"{base} has no MXNet; running under {kit_python}" in stderr


def test_benchmark_runs_every_configuration_under_its_python(second_env, tmp_path):
    python, markers = second_env
    env = venv_env()
    env.pop("RN50_PYTHON", None)
    out = tmp_path / "bench.json"
    result = subprocess.run([python, os.path.join(ROOT, "benchmark.py"), "-n", "1", "-b", "2", "-i", "2", "-e", "1",
                             "--mode", "train", "-o", str(out), *TINY], env=env, capture_output=True, text=True,
                            timeout=HANG_S)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(out.read_text())["metrics"]["1"]["2"]["train.total_ips"] > 0
    seen = [path.read_text() for path in markers.iterdir()]
    trainers = [line for line in seen if "train.py" in line and "--help" not in line]
    assert trainers and all(line.startswith(python + " ") for line in trainers), seen
    assert any(os.path.join(ROOT, "runner") in line for line in seen)  # runner itself ran under it too


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["check_dataset.py", "plot_report.py"])
def test_the_tools_hand_over_to_the_kits_python_as_runner_does(tmp_path, tool):
    """Found by the second newcomer walk (issue 26)."""
    import json
    import shutil
    import subprocess
    import sys

    from support.processes import HANG_S, ROOT
    bare = shutil.which("python3") or pytest.skip("no system python3")
    if tool == "check_dataset.py":
        files = labelled_records(tmp_path, [i % 10 for i in range(20)])
        argv = [files["train"][0], "--num-classes", "10", "--jobs", "1"]
    else:
        report = tmp_path / "report.json"
        report.write_text(json.dumps({"metrics": {"train.loss": [2.0, 1.0], "val.top1": [0.5, 0.7]}}))
        argv = [str(report)]
    env = {"PATH": os.environ["PATH"], "RN50_PYTHON": sys.executable, "HOME": os.environ.get("HOME", "/tmp")}
    # -S: a Python without the kit's packages (no site-packages at all)
    result = subprocess.run([bare, "-S", os.path.join(ROOT, "tools", tool), *argv], env=env, capture_output=True,
                            text=True, timeout=HANG_S)
    assert result.returncode == 0 and "ModuleNotFoundError" not in result.stderr, result.stderr[-2000:]
