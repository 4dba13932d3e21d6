"""runner's answers to bad input: one line, non-zero exit, no traceback."""
import os
import subprocess
import sys

from conftest import ROOT, venv_env


def run_runner(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "runner"), *args], env=venv_env(),
                          capture_output=True, text=True, timeout=60)


def test_missing_data_root_is_one_clear_line(tmp_path):
    result = run_runner("-n", "1", "--data-root", str(tmp_path / "nowhere"))
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "does not exist" in lines[0] and "prepare_imagenet.sh" in lines[0] and "make demo" in lines[0]


def test_data_root_without_train_rec(tmp_path):
    (tmp_path / "val.rec").write_bytes(b"")
    result = run_runner("-n", "1", "--data-root", str(tmp_path))
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "train.rec" in result.stderr and len(result.stderr.strip().splitlines()) == 1
