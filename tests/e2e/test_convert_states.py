"""tools/convert_states.py, the command a refused pickle checkpoint names, run as the user runs it: the
checkpoint written before the optimizer state left pickle converts once and resumes with the same momentum (moved
from tests/unit/test_checkpoint.py: it starts a process that imports MXNet)."""
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

from support.checkpoints import save_tiny
from support.processes import HANG_S, ROOT, venv_env

pytestmark = pytest.mark.slow  # starts tools/convert_states.py


def make_old(state_path, trainer):
    """Turn a checkpoint into one written before the optimizer state left pickle: MXNet's save_states output, no
    plain values, the recorded size, SHA-256 and checksum as that version wrote them."""
    import json

    from rn50kit.weights import checkpoint
    state = json.loads(open(state_path).read())
    states = os.path.join(os.path.dirname(state_path), state["files"]["states"])
    trainer.save_states(states)
    del state["optimizer_state"]
    state["checks"]["states"] = {"size": os.path.getsize(states), "sha256": checkpoint.sha256(states)}
    state["checksum"] = checkpoint.state_checksum(state)
    open(state_path, "w").write(json.dumps(state))
    return states


def test_an_old_pickle_checkpoint_is_refused_naming_the_command_that_converts_it(tmp_path):
    from rn50kit.weights import checkpoint, optimizer_state
    net, trainer = save_tiny(tmp_path / "model", [])
    with mx.autograd.record():
        loss = net(mx.nd.ones((2, 256))).sum()
    loss.backward()
    trainer.step(2)
    checkpoint.save(str(tmp_path / "model"), net, trainer, {"epoch": 1, "step": 0})
    state_path = str(tmp_path / "model-0001.state.json")
    states = make_old(state_path, trainer)
    old = checkpoint.read_state(state_path, verify=True)
    with pytest.raises(optimizer_state.StateError) as refused:
        optimizer_state.restore(trainer, states, old.get("optimizer_state"), state_path)
    message = str(refused.value)
    assert "\n" not in message and f"{states} holds the optimizer state as a Python pickle" in message
    command = message.split("convert it once with: ")[1]
    assert command == f"python tools/convert_states.py {state_path}"
    converted = subprocess.run([sys.executable, *command.split()[1:]], cwd=ROOT, env=venv_env(), capture_output=True,
                               text=True, timeout=HANG_S)
    assert converted.returncode == 0, converted.stderr
    assert converted.stdout == f"{state_path}: converted (optimizer sgd, 2 weights' states)\n"
    new = checkpoint.read_state(state_path, verify=True)  # sizes, hashes and checksum updated
    assert optimizer_state.file_kind(states) == "ndarray"
    _, fresh = save_tiny(tmp_path / "unused", [])
    optimizer_state.restore(fresh, states, new["optimizer_state"], state_path)
    for index, momentum in trainer._updaters[0].states.items():
        np.testing.assert_array_equal(fresh._updaters[0].states[index].asnumpy(), momentum.asnumpy())
    assert fresh._optimizer.num_update == trainer._optimizer.num_update == 1
