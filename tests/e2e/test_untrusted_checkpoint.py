"""A checkpoint from someone else cannot run code: a `.states` pickle that would create a file when unpickled,
planted with every recorded size, hash and checksum rewritten to match, is refused by a resume and never read by
scoring, --load or --pretrained; the file is never created."""
import hashlib
import json
import os
import pickle
import subprocess
import sys

import pytest

from rn50kit.weights import checkpoint
from support.processes import HANG_S, ROOT, run, venv_env
from support.runs import digits_run

pytestmark = pytest.mark.slow  # trains and scores end to end


class Plant:
    """Unpickled, it calls open(marker, "w"): the file appears."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return open, (self.marker, "w")


def train_command(digits, workspace, epochs, *extra):
    return [sys.executable, os.path.join(ROOT, "train.py"), *digits_run(digits), "--batch-size", "32",
            "--num-epochs", str(epochs), "--lr", "0.1", "--num-examples", "320", "--seed", "3",
            "--workspace", str(workspace), *extra]


def plant(workspace, marker):
    """Replace model-0001.states with the pickle, and make the state file vouch for it as a sender would."""
    states = workspace / "model-0001.states"
    states.write_bytes(pickle.dumps(Plant(str(marker))))
    state_path = workspace / "model-0001.state.json"
    state = json.loads(state_path.read_text())
    state["checks"]["states"] = {"size": states.stat().st_size,
                                 "sha256": hashlib.sha256(states.read_bytes()).hexdigest()}
    state["checksum"] = checkpoint.state_checksum(state)
    state_path.write_text(json.dumps(state))
    assert checkpoint.find_latest(str(workspace / "model"))["state_path"] == str(state_path)  # it passes as whole


def last_line(result):
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.stderr.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def planted(digits_data, tmp_path_factory):
    workspace = tmp_path_factory.mktemp("sent")
    result = run(train_command(digits_data, workspace, 1))
    assert result.returncode == 0, result.stderr[-3000:]
    marker = workspace.parent / f"{workspace.name}-created-by-the-pickle"
    plant(workspace, marker)
    return workspace, marker


def test_a_resume_refuses_the_pickle_and_names_the_converter(planted, digits_data):
    workspace, marker = planted
    result = run(train_command(digits_data, workspace, 2))
    assert result.returncode != 0
    line = last_line(result)
    assert f"{workspace}/model-0001.states holds the optimizer state as a Python pickle" in line, line
    assert f"python tools/convert_states.py {workspace}/model-0001.state.json" in line, line
    assert not marker.exists()


@pytest.mark.parametrize("extra, refused", [
    (["--mode", "val"], None),  # the latest checkpoint's parameters: an NDArray file
    (["--mode", "val", "--load", "model-0001.params"], None),
    (["--mode", "val", "--load", "model-0001.states"], "model-0001.states is a checkpoint's optimizer state, not its "
                                                       "weights"),
    (["--pretrained", "model-0001.states"], "unknown format"),
    (["--pretrained", "plant.pth"], "PyTorch"),
])
def test_scoring_load_and_pretrained_never_unpickle(planted, digits_data, extra, refused, tmp_path):
    workspace, marker = planted
    (workspace / "plant.pth").write_bytes((workspace / "model-0001.states").read_bytes())
    extra = [str(workspace / e) if e.startswith(("model-0001", "plant")) else e for e in extra]
    scoring = extra[0] == "--mode"  # scores the sent workspace; a fresh run (--pretrained) gets its own
    result = run(train_command(digits_data, workspace if scoring else tmp_path, 1, *extra))
    if refused:
        assert result.returncode != 0 and refused in last_line(result), result.stderr[-2000:]
    else:
        assert result.returncode == 0, result.stderr[-3000:]
    assert not marker.exists()


def test_the_plant_does_create_the_file_when_unpickled(planted):
    """The check above is only worth something if the pickle works: unpickled in a throwaway process, it does."""
    workspace, marker = planted
    assert not marker.exists()
    subprocess.run([sys.executable, "-c", f"import pickle; pickle.load(open({str(workspace / 'model-0001.states')!r}, "
                    "'rb'))"], env=venv_env(), check=True, timeout=HANG_S, cwd=ROOT)
    assert marker.exists()
    marker.unlink()
