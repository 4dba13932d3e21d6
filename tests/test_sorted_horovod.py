"""Two Horovod workers (Gloo) train on a copy of the digits training set stored in class order and reach the
validation accuracy of one worker on the same file and recipe.

With DALI's own reader each worker read a contiguous half of such a file (about five classes) and its BatchNorm
learned per-worker statistics; the training order now gives each worker a shard of a global shuffle per epoch.
"""
import json
import os
import subprocess
import sys

import cv2
import numpy as np
import pytest

from rn50kit.data import records
from conftest import ROOT, venv_env, write_record_file

pytestmark = pytest.mark.slow  # launches processes or trains end to end

EPOCHS = 4
# Measured with this recipe (deterministic with --seed): one worker 0.947, two workers 0.964; two workers reading
# DALI's contiguous shards (the old reader) reached 0.911, which this margin fails. About 100 s of CPU in all.
MARGIN = 0.03
IMAGE = "16"


@pytest.fixture(scope="module")
def sorted_digits(digits_data, tmp_path_factory):
    digits = records.RecordFile(str(digits_data / "train.rec"), str(digits_data / "train.idx"))
    order = np.argsort(digits.labels, kind="stable")
    out = tmp_path_factory.mktemp("sorted_digits")
    images = [cv2.imdecode(digits.image(i), cv2.IMREAD_COLOR) for i in order]
    rec, idx = write_record_file(str(out / "train"), images, digits.labels[order])
    assert records.label_runs(records.RecordFile(rec, idx).labels)["ordered"]
    return rec, idx


def top1(workers, rec, idx, digits, workspace):
    command = [sys.executable, os.path.join(ROOT, "train.py"), "--data-backend", "dali-cpu", "--dali-threads", "1",
               "--dali-validation-threads", "1", "--data-train", rec, "--data-train-idx", idx,
               "--data-val", str(digits / "val.rec"), "--data-val-idx", str(digits / "val.idx"),
               "--num-layers", "18", "--num-classes", "10", "--image-shape", f"3,{IMAGE},{IMAGE}",
               "--data-val-resize", IMAGE, "--batch-size", "64", "--num-epochs", str(EPOCHS), "--lr", "0.2",
               "--warmup-epochs", "1", "--random-mirror", "0", "--min-random-area", "0.5", "--seed", "3",
               "--workspace", str(workspace)]
    if workers > 1:
        command = ["horovodrun", "-np", str(workers), "-H", f"localhost:{workers}", "--gloo", *command]
    result = subprocess.run(command, env=venv_env(), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with open(workspace / "report.json") as f:
        return json.load(f)["metrics"]["val.top1"][-1]


def test_two_workers_reach_one_worker_accuracy_on_a_class_sorted_file(sorted_digits, digits_data, tmp_path):
    one = top1(1, *sorted_digits, digits_data, tmp_path / "one")
    two = top1(2, *sorted_digits, digits_data, tmp_path / "two")
    assert one >= 0.8, one  # the recipe learns (chance is 0.1)
    assert two >= one - MARGIN, (one, two)
