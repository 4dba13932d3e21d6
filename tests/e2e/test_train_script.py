"""train.py's bootstrap runs only where train.py is the script: a process that imports train (a test, a tool)
keeps its environment, signal handlers and import machinery, whatever its argv; the script itself still refuses
a Python without MXNet in one line."""
import json
import os
import subprocess
import sys

import pytest

from support.processes import HANG_S, ROOT, venv_env

pytestmark = pytest.mark.slow  # starts Pythons that load MXNet

# A process whose argv holds "int8" (as `pytest -k int8` or a tool scoring in INT8 would) imports train; what it
# prints is what changed meanwhile (MXNet's own import done first: only train's actions count).
IMPORT_TRAIN = """
import faulthandler, json, os, signal, sys
sys.argv[1:] = ["--dtype", "int8", "int8"]
import mxnet
def snapshot():
    return {"environ": dict(os.environ), "meta_path": [repr(finder) for finder in sys.meta_path],
            "handlers": [repr(signal.getsignal(sig)) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)],
            "faulthandler": faulthandler.is_enabled()}
before = snapshot()
import train
after = snapshot()
print(json.dumps({key: [before[key], after[key]] for key in before if before[key] != after[key]}))
"""


def test_importing_train_changes_nothing_in_the_importing_process():
    env = {key: value for key, value in venv_env().items() if key != "MXNET_DISABLE_MKLDNN_FUSE_CONV_SUM"}
    result = subprocess.run([sys.executable, "-c", IMPORT_TRAIN], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=HANG_S)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.splitlines()[-1]) == {}


def test_train_py_without_mxnet_says_so_in_one_line(tmp_path):
    """An MXNet that does not load (here one that hides the installed one) is one line naming the fix."""
    (tmp_path / "mxnet").mkdir()
    (tmp_path / "mxnet" / "__init__.py").write_text("raise ImportError('No module named mxnet')\n")
    env = venv_env()
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env["PYTHONPATH"]
    result = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--help"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip() == ("train.py: error: MXNet is not installed for this Python; run `make setup`, "
                                     "then use .venv/bin/python (or `source .venv/bin/activate`)")
