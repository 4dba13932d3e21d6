"""docs/extending.md, "An optimizer", done as the guide says: its module written as printed (in a folder of the
test's own rather than rn50kit/training, loaded under the name its entry gives), its entry added to
optimizer_registry.OPTIMIZERS as printed, then a tiny network trained through train.py's real path with
--optimizer plain-sgd; every weight's first update against NumPy's w - lr (rescale g + wd w)."""
import ast
import json
import os

import numpy as np
import pytest

import train
from rn50kit.config import optimizer_registry, train_flags
from support.docs import import_guide_module, section_blocks
from support.processes import ROOT
from support.runs import TINY_RUN

GUIDE = os.path.join(ROOT, "docs", "extending.md")


def the_guides_optimizer():
    """The guide's module (the first block), and its entry of OPTIMIZERS (the second): (name, Entry)."""
    module, line = section_blocks(GUIDE, "An optimizer")
    name, _, entry = line.strip().rstrip(",").partition(":")
    call = ast.parse(entry.strip(), mode="eval").body
    assert isinstance(call, ast.Call) and call.func.id == "Entry"
    return module, ast.literal_eval(name), optimizer_registry.Entry(
        *[ast.literal_eval(arg) for arg in call.args], **{kw.arg: ast.literal_eval(kw.value) for kw in call.keywords})


@pytest.fixture()
def guides_optimizer(tmp_path, monkeypatch):
    """Steps 1 and 2 of the guide; returns (the optimizer's name, its module, the first updates it made:
    {index: (weight before, gradient, lr, wd, rescale, weight after)})."""
    text, name, entry = the_guides_optimizer()
    module_name = entry.factory.partition(":")[0]
    assert module_name == "rn50kit.training.plain_sgd"
    module = import_guide_module(text, module_name, tmp_path, monkeypatch)  # step 1
    monkeypatch.setitem(optimizer_registry.OPTIMIZERS, name, entry)  # step 2
    first = {}
    update = module.PlainSGD.update

    def recorded(self, index, weight, grad, state):
        before = weight.asnumpy()
        update(self, index, weight, grad, state)
        first.setdefault(index, (before, grad.asnumpy(), self._get_lr(index), self._get_wd(index), self.rescale_grad,
                                 weight.asnumpy()))
    monkeypatch.setattr(module.PlainSGD, "update", recorded)
    return name, module, first


def test_the_guides_optimizer_trains_a_network_through_train_py(guides_optimizer, tmp_path, keep_signal_handlers):
    name, module, first = guides_optimizer
    assert name == "plain-sgd"
    argv = ["--optimizer", name, "--kv-store", "local", *TINY_RUN, "--image-shape", "3,16,16", "--mode", "train",
            "--batch-size", "4", "--num-examples", "8", "--num-epochs", "1", "--lr", "0.05", "--warmup-epochs", "0",
            "--wd", "0.001", "--seed", "1", "--memory-check", "off", "--workspace", str(tmp_path / "run")]
    outcome = train.main(train.parse_args(argv), ["train.py", *argv], train.given_flags(argv))
    losses = json.loads((tmp_path / "run" / "report.json").read_text())["metrics"]["train.loss"]
    assert losses and all(np.isfinite(losses))
    trained = [p for p in outcome.net.collect_params().values() if p.grad_req != "null"]
    assert len(first) == len(trained)  # the optimizer updated every trained weight
    for before, grad, lr, wd, rescale, after in first.values():
        np.testing.assert_allclose(after, before - lr * (grad * rescale + wd * before), rtol=1e-5, atol=1e-7)
    assert {round(lr, 12) for _b, _g, lr, *_ in first.values()} == {0.05}
    # the kit's rules reach it: BatchNorm's gamma/beta and the biases have no weight decay, the weights do
    assert {wd for _b, _g, _lr, wd, _r, _a in first.values()} == {0.0, 0.001}
    assert sum(not np.array_equal(before, after) for before, *_, after in first.values()) > len(first) // 2


def test_a_generic_flag_the_guides_optimizer_does_not_take_is_refused_in_one_line(guides_optimizer, capsys):
    with pytest.raises(SystemExit) as ended:
        train_flags.check(["--optimizer", "plain-sgd", "--opt-eps", "1e-8"])  # runner's check, in its process
    err = capsys.readouterr().err
    assert ended.value.code == 2 and err.count("\n") == 1
    assert "--opt-eps: --optimizer plain-sgd has no eps (used by lars, lamb)" in err
