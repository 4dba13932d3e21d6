"""docs/extending.md, "An output", done as the guide says: its module written as printed (in a folder of the
test's own rather than rn50kit/reporting), its row added to output_table.OUTPUTS, and a tiny network trained
through train.py; the toy's lines hold the epochs, training losses and validation top-1 that report.json holds."""
import ast
import json
import os

import pytest

import train
from rn50kit.reporting import output_table
from support.docs import section_blocks
from support.processes import ROOT
from support.runs import TINY_RUN

GUIDE = os.path.join(ROOT, "docs", "extending.md")


def the_guides_output():
    """The guide's module (the first block) and its row of OUTPUTS (the second), as printed."""
    module, row = section_blocks(GUIDE, "An output")
    return module, ast.literal_eval(row.split("#")[0].strip().rstrip(","))


def test_the_guides_output_hears_every_epoch_of_a_run_through_train_py(tmp_path, monkeypatch, keep_signal_handlers):
    module, row = the_guides_output()
    package, _, name = row.partition(":")
    assert package == "rn50kit.reporting.epoch_lines" and name == "EpochLines"
    toys = tmp_path / "toys"
    toys.mkdir()
    (toys / "epoch_lines.py").write_text(module)  # step 1, outside the kit's tree
    monkeypatch.syspath_prepend(str(toys))
    monkeypatch.setattr(output_table, "OUTPUTS", output_table.OUTPUTS + (f"epoch_lines:{name}",))  # step 2
    workspace = tmp_path / "run"
    args = train.parse_args(["--kv-store", "local", *TINY_RUN, "--image-shape", "3,16,16", "--batch-size", "8",
                             "--num-examples", "8", "--num-epochs", "2", "--warmup-epochs", "0",
                             "--save-frequency", "0", "--workspace", str(workspace)])
    train.main(args)
    lines = (workspace / "epoch-lines.txt").read_text().splitlines()
    words = [line.split() for line in lines]
    got = [{key: float(value) for key, value in zip(line[::2], line[1::2])} for line in words]
    metrics = json.load(open(workspace / "report.json"))["metrics"]
    assert [line["epoch"] for line in got] == [1, 2]
    assert [line["train_loss"] for line in got] == metrics["train.loss"]
    assert [line["val_top1"] for line in got] == metrics["val.top1"]


def test_a_row_that_names_no_output_class_fails_when_the_run_opens_its_outputs(monkeypatch):
    """A mistyped row is found at the first run that opens the table, by name."""
    monkeypatch.setattr(output_table, "OUTPUTS", ("rn50kit.reporting.outputs:EpochLines",))
    with pytest.raises(AttributeError, match="EpochLines"):
        output_table.open_outputs(context=None)
