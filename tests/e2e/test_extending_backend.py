"""docs/extending.md, "A data backend", done as the guide says: its module written as printed (in a folder of the
test's own rather than rn50kit/data, loaded under the name its row gives), its row added to the backends table as
printed (backends.register: what the line does in the table), then a tiny network trained through train.py's real
path with --data-backend numpy; every batch the network trained on is one the backend served, in its order, as
many as the run's steps."""
import ast
import json
import os

import numpy as np
import pytest

import train
from rn50kit.common import backends
from rn50kit.training import network
from support.docs import import_guide_module, section_blocks
from support.processes import ROOT
from support.runs import TINY_RUN

GUIDE = os.path.join(ROOT, "docs", "extending.md")
STEPS, EPOCHS = 3, 2


def the_guides_backend():
    """The guide's module (the first block) and its row of BACKENDS (the second), as a Backend."""
    module, line = section_blocks(GUIDE, "A data backend")
    call = ast.parse(line.strip().rstrip(","), mode="eval").body
    assert isinstance(call, ast.Call) and call.func.id == "Backend"
    names = {"NO_FILES": backends.NO_FILES, "RECORDS": backends.RECORDS}  # the table's own names

    def value(node):
        return names[node.id] if isinstance(node, ast.Name) else ast.literal_eval(node)
    return module, backends.Backend(*map(value, call.args), **{kw.arg: value(kw.value) for kw in call.keywords})


@pytest.fixture()
def guides_backend(tmp_path, monkeypatch):
    """Steps 1 and 2 of the guide; returns (its row, the iterators it built, in order)."""
    text, row = the_guides_backend()
    module_name = row.builder.partition(":")[0]
    assert module_name == "rn50kit.data.backend_numpy"
    module = import_guide_module(text, module_name, tmp_path, monkeypatch)  # step 1
    built = []
    get_iterators = module.get_iterators

    def recorded(*args):
        built.append(get_iterators(*args))
        return built[-1]
    monkeypatch.setattr(module, "get_iterators", recorded)
    backends.register(row)  # step 2
    yield row, built
    backends.unregister(row.name)


@pytest.fixture()
def trained_inputs(monkeypatch):
    """The images of every forward pass in training mode of the network train.py builds, as NumPy arrays."""
    import mxnet as mx
    seen = []
    build = network.build_network

    def hooked(*args, **kwargs):
        net = build(*args, **kwargs)
        net.register_forward_pre_hook(lambda block, inputs: seen.append(inputs[0].asnumpy())
                                      if mx.autograd.is_training() else None)
        return net
    monkeypatch.setattr(network, "build_network", hooked)
    return seen


def test_the_guides_backend_trains_a_network_through_train_py(guides_backend, trained_inputs, tmp_path,
                                                               keep_signal_handlers):
    row, built = guides_backend
    assert row.name == "numpy" and not row.reads_records
    assert "numpy" in train.get_args_parser()._option_string_actions["--data-backend"].choices
    argv = ["--kv-store", "local", *TINY_RUN, "--data-backend", "numpy", "--image-shape", "3,16,16", "--mode",
            "train", "--batch-size", "4", "--num-examples", str(4 * STEPS), "--num-epochs", str(EPOCHS),
            "--warmup-epochs", "0", "--seed", "1", "--memory-check", "off", "--workspace", str(tmp_path / "run")]
    train.main(train.parse_args(argv), ["train.py", *argv], train.given_flags(argv))
    losses = json.loads((tmp_path / "run" / "report.json").read_text())["metrics"]["train.loss"]
    assert len(losses) == EPOCHS and all(np.isfinite(losses))
    # (iterator, batch number) of every batch served, whichever epoch's iterators served it (a run may build them
    # again for an epoch)
    served = [(train_iter, number) for train_iter, _ in built for number in train_iter.served]
    assert len(served) == STEPS * EPOCHS == len(trained_inputs)
    assert [number for _, number in served] == list(range(STEPS)) * EPOCHS  # each epoch: the batches in turn
    for images, (train_iter, number) in zip(trained_inputs, served):
        np.testing.assert_array_equal(images, train_iter.batches[number][0])


def test_the_guides_backend_is_refused_where_its_row_says_it_cannot_go(guides_backend):
    from rn50kit.common import rules
    assert "not with --data-backend numpy" in rules.augment_problem("numpy", "randaugment")
    assert rules.augment_problem("dali-cpu", "randaugment") is None
