"""The modules that must stay light stay light, in fresh processes: runner's launch logic imports no MXNet, and
DALI is imported only for a DALI backend."""
import subprocess
import sys

import pytest

from support.processes import HANG_S, ROOT, venv_env

pytestmark = pytest.mark.slow  # launches processes, trains end to end or builds heavy data


def modules_after(code):
    result = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted(sys.modules)))"],
                            cwd=ROOT, env=venv_env(), capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stderr[-2000:]
    return set(result.stdout.split())


@pytest.mark.slow  # a heavier in-process test (the fast lane stays under a minute)
def test_runner_logic_and_benchmark_import_no_mxnet():
    loaded = modules_after("from rn50kit.launch import runner; import benchmark")
    assert not {"mxnet", "horovod", "nvidia"} & loaded


@pytest.mark.slow  # a heavier in-process test (the fast lane stays under a minute)
def test_dali_is_imported_only_for_a_dali_backend():
    build = ("import mxnet as mx, train\nfrom rn50kit.data import loaders\nfrom rn50kit.config import train_config\n"
             "args = train.parse_args(['--data-backend', 'synthetic', '--batch-size', '4', '--image-shape', '3,8,8'])\n"
             "args.dtype = 'float32'\n"
             "loaders.get_data_iterators(train_config.from_args(args), 0, 1, 0, 1, mx.cpu())")
    assert "nvidia.dali" not in modules_after(build)
    assert "nvidia.dali" in modules_after("import dali")  # the check can see DALI when it is imported
