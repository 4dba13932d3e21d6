"""The package's layers: the folders runner, benchmark.py and tools/ use before choosing a Python import without
MXNet, Horovod or DALI, every module of them (a new module there that imports MXNet fails here)."""
import json
import os
import pkgutil
import subprocess
import sys

import pytest

from support.processes import HANG_S, ROOT, venv_env

MXNET_FREE = ["benchmarking", "common", "config", "hardware", "launch", "reliability", "reporting"]


def modules_of(folder):
    path = os.path.join(ROOT, "rn50kit", folder)
    return [f"rn50kit.{folder}.{info.name}" for info in pkgutil.iter_modules([path])]


@pytest.mark.parametrize("folder", MXNET_FREE)
def test_an_mxnet_free_folder_imports_without_mxnet(folder):
    modules = modules_of(folder)
    assert modules, f"rn50kit/{folder} holds no module"
    code = "import importlib, sys\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules) + \
        "print(' '.join(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=venv_env(), capture_output=True, text=True,
                            timeout=HANG_S)
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = set(result.stdout.split())
    heavy = {name for name in loaded if name.split(".")[0] in ("mxnet", "horovod", "nvidia", "cv2")}
    assert not heavy, f"rn50kit/{folder} imports {sorted(heavy)[:5]}"


def test_setup_installs_the_package_and_the_card_modules_only():
    """No generic top-level name (config, settings, report ...) goes into a user's environment."""
    result = subprocess.run([sys.executable, "-c", "import runpy, setuptools\n"
                             "captured = {}\nsetuptools.setup = lambda **kw: captured.update(kw)\n"
                             "runpy.run_path('setup.py')\nimport json\n"
                             "print(json.dumps(sorted(captured['py_modules'])))\n"
                             "print(json.dumps(sorted(p.split('.')[0] for p in captured['packages'])))"],
                            cwd=ROOT, env=venv_env(), capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stderr[-2000:]
    modules, packages = result.stdout.splitlines()
    assert json.loads(modules) == ["benchmark", "dali", "fit", "models", "train"]
    assert set(json.loads(packages)) == {"rn50kit"}
    on_top = sorted(name[:-3] for name in os.listdir(ROOT) if name.endswith(".py") and name != "setup.py")
    assert on_top == json.loads(modules), "a module on top that setup.py does not install, or the reverse"
