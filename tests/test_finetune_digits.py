"""Fine-tuning on the demo digits, as a user would on their own images: a ResNet-18 trained on the digits 0-5 is
fine-tuned with --pretrained and a new head on the digits 6-9 (4 classes, labels 0-3, named), each split packed by
tools/prepare_folder.py from a folder of class folders. Against the same run from scratch (same flags and seed,
only --pretrained differs) it reaches the demo's accuracy band in fewer epochs; the class names of the fine-tuning
data travel into its checkpoint, so --mode pred names them with only --load."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, venv_env

pytestmark = pytest.mark.slow  # trains three small networks end to end

BAND = 0.95  # the demo's validation top-1 (README: above 0.95)
EPOCHS = 4  # each of the two compared runs
PRETRAIN = {"0": "zero", "1": "one", "2": "two", "3": "three", "4": "four", "5": "five"}
FINETUNE = {"6": "six", "7": "seven", "8": "eight", "9": "nine"}


def class_folders(digits, out, classes):
    """A folder of class folders, named by ``classes`` ({digit: name}), holding links to all the demo's images
    of those digits (its train and validation images: prepare_folder makes its own split)."""
    for digit, name in classes.items():
        os.makedirs(out / name)
        for split in ("train", "val"):
            folder = digits / "raw" / split / digit
            for image in sorted(os.listdir(folder)):
                os.symlink(folder / image, out / name / f"{split}-{image}")
    return out


def prepare(tree, out):
    result = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "prepare_folder.py"), str(tree), str(out),
                             "--val-fraction", "0.2", "--seed", "0", "--threads", "1"],
                            env=venv_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return out


def train(workspace, data_dir, classes, *extra):
    d = str(data_dir)
    command = [sys.executable, os.path.join(ROOT, "train.py"), "--data-backend", "dali-cpu", "--dali-threads", "1",
               "--dali-validation-threads", "1", "--data-train", f"{d}/train.rec", "--data-val", f"{d}/val.rec",
               "--num-layers", "18", "--num-classes", str(classes), "--image-shape", "3,32,32",
               "--data-val-resize", "32", "--random-mirror", "0", "--min-random-area", "0.5", "--batch-size", "64",
               "--lr", "0.2", "--warmup-epochs", "1", "--seed", "1", "--workspace", str(workspace), *extra]
    result = subprocess.run(command, env=venv_env(), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(workspace / "report.json") as f:
        return json.load(f), result


def first_epoch_in_band(report):
    """The first epoch (from 1) whose validation top-1 reaches BAND, or None."""
    return next((epoch for epoch, top1 in enumerate(report["metrics"]["val.top1"], 1) if top1 >= BAND), None)


def test_finetuning_reaches_the_band_in_fewer_epochs_than_from_scratch(digits_data, tmp_path):
    source = prepare(class_folders(digits_data, tmp_path / "source-tree", PRETRAIN), tmp_path / "source")
    target = prepare(class_folders(digits_data, tmp_path / "target-tree", FINETUNE), tmp_path / "target")
    pretrained, _ = train(tmp_path / "pretrain", source, len(PRETRAIN), "--num-epochs", "3")
    weights = tmp_path / "pretrain" / "model-best.params"

    scratch, _ = train(tmp_path / "scratch", target, len(FINETUNE), "--num-epochs", str(EPOCHS))
    tuned, run = train(tmp_path / "tuned", target, len(FINETUNE), "--num-epochs", str(EPOCHS),
                       "--pretrained", str(weights))
    curves = (f"pretraining {pretrained['metrics']['val.top1']}, from scratch {scratch['metrics']['val.top1']}, "
              f"fine-tuned {tuned['metrics']['val.top1']}")
    assert tuned["info"]["pretrained"]["head_reinitialized"], tuned["info"]  # 6 classes in the file, 4 in the network
    tuned_epochs, scratch_epochs = first_epoch_in_band(tuned), first_epoch_in_band(scratch)
    assert tuned_epochs is not None, curves
    assert scratch_epochs is None or tuned_epochs < scratch_epochs, curves
    assert tuned["per_class"]["classes"] == list(FINETUNE.values())
    assert os.path.isfile(tmp_path / "tuned" / "report-confusion.png")

    image = digits_data / "raw" / "val" / "8"
    image = image / sorted(os.listdir(image))[0]
    result = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--mode", "pred", "--load",
                             str(tmp_path / "tuned" / "model-best.params"), "--data-pred", str(image)],
                            env=venv_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stdout.splitlines() if "% -> " in line]
    assert len(lines) == 4 and lines[0].endswith("-> eight"), result.stdout  # names, best first, with only --load
    assert {line.rsplit("-> ", 1)[1] for line in lines} == set(FINETUNE.values())
