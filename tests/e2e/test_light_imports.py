"""Every flag train.py registers is read by the kit's code (not only declared), and the modules that must stay
light stay light: runner's launch logic imports no MXNet, and DALI is imported only for a DALI backend."""
import ast
import glob
import os
import subprocess
import sys

import pytest

import train
from conftest import HANG_S, ROOT, venv_env


def kit_sources():
    """The kit's Python files (tests and tools' own parsers aside), without their add_*_args functions."""
    paths = (glob.glob(os.path.join(ROOT, "*.py")) + glob.glob(os.path.join(ROOT, "rn50kit", "**", "*.py"), recursive=True)
             + glob.glob(os.path.join(ROOT, "tools", "*.py")))
    code = []
    for path in paths:
        tree = ast.parse(open(path).read())
        tree.body = [node for node in tree.body if not (isinstance(node, ast.FunctionDef) and
                                                        node.name.startswith("add_") and node.name.endswith("_args"))]
        code.append(tree)
    return code


def names_read(trees):
    """Attribute names read anywhere (args.x), and string constants (getattr(args, "x"), f"data_{split}" aside)."""
    attributes, strings = set(), set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                attributes.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                strings.add(node.value)
    return attributes, strings


def test_every_registered_flag_is_read_somewhere():
    attributes, strings = names_read(kit_sources())
    dests = {action.dest for action in train.get_args_parser()._actions if action.dest != "help"}
    unread = sorted(d for d in dests if d not in attributes and d not in strings)
    assert not unread, f"flags registered but never read: {unread}"


def modules_after(code):
    result = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted(sys.modules)))"],
                            cwd=ROOT, env=venv_env(), capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stderr[-2000:]
    return set(result.stdout.split())


@pytest.mark.slow  # a heavier in-process test (the fast lane stays under a minute)
def test_runner_logic_and_benchmark_import_no_mxnet():
    loaded = modules_after("from rn50kit.launch import launcher; import benchmark")
    assert not {"mxnet", "horovod", "nvidia"} & loaded


@pytest.mark.slow  # a heavier in-process test (the fast lane stays under a minute)
def test_dali_is_imported_only_for_a_dali_backend():
    build = ("import mxnet as mx, train\nfrom rn50kit.data import loaders\nfrom rn50kit.config import train_config\n"
             "args = train.parse_args(['--data-backend', 'synthetic', '--batch-size', '4', '--image-shape', '3,8,8'])\n"
             "args.dtype = 'float32'\n"
             "loaders.get_data_iterators(train_config.from_args(args), 0, 1, 0, 1, mx.cpu())")
    assert "nvidia.dali" not in modules_after(build)
    assert "nvidia.dali" in modules_after("import dali")  # the check can see DALI when it is imported
