"""One process, several devices (--kv-store device/local): two CPU contexts stand for two GPUs.

Each device gets its own data pipeline reading its own shard; training, resuming and scoring go through
train.py's real code, and parameters are loaded on every context (MXNet asserts the context set)."""
import json
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

from rn50kit.data import loaders
import train
from conftest import ROOT, venv_env
from rn50kit.config import train_config
from rn50kit.training import distributed
from rn50kit.scoring import scoring

TWO = [mx.cpu(0), mx.cpu(1)]


def test_one_pipeline_and_shard_per_device(unique_label_rec):
    rec, idx, count = unique_label_rec
    args = train.parse_args(
        ["--data-backend", "dali-cpu", "--data-train", rec, "--data-train-idx", idx, "--data-val", rec,
         "--data-val-idx", idx, "--batch-size", "4", "--image-shape", "3,16,16", "--data-val-resize", "16",
         "--dali-threads", "1", "--dali-validation-threads", "1", "--seed", "1"])
    train_iter, val_iter = loaders.get_data_iterators_per_device(train_config.from_args(args), 0, 1, 0, 1, TWO)
    # DALI's shards: device d of 2 reads records [count*d//2, count*(d+1)//2); labels are the record numbers.
    shards = [set(range(count * d // 2, count * (d + 1) // 2)) for d in range(2)]
    seen = [[], []]
    for batch in val_iter:
        assert len(batch.data) == 2 and len(batch.pads) == 2
        for d, (images, labels, pad) in enumerate(zip(batch.data, batch.label, batch.pads)):
            assert images.context == TWO[d] and images.shape == (2, 3, 16, 16)
            seen[d] += labels.asnumpy()[:2 - pad].astype(int).tolist()
    for d in range(2):
        assert sorted(seen[d]) == sorted(shards[d])  # every sample of the shard once, padding left out
    # 26 and 27 records in batches of 2: the first shard ends a batch early and is all padding in the last one.
    assert len(val_iter) == 14 and batch.pads[0] == 2
    net = mx.gluon.nn.Dense(count, in_units=3 * 16 * 16, flatten=True)
    net.initialize(ctx=TWO)
    metrics = scoring.evaluate(net, val_iter, TWO, distributed.Distributed(None), "float32")
    assert metrics["samples"] == count and 0 <= metrics["correct1"] <= metrics["correct5"] <= count
    trained = [set(), set()]
    for step, batch in enumerate(train_iter):
        if (step + 1) * 2 > count // 2:  # past its shard's end the reader moves on to the next shard (DALI)
            break
        for d, labels in enumerate(batch.label):
            trained[d] |= set(labels.asnumpy().astype(int).tolist())
    # One permutation of the whole file per epoch, cut into a shard per device (loaders.ShuffledShardSource): disjoint,
    # and each drawn from the whole file rather than from a contiguous range of records.
    assert not trained[0] & trained[1]
    for d in range(2):
        assert len(trained[d]) > len(shards[d]) // 2 and trained[d] - shards[d]


def run_train(*args):
    command = [sys.executable, os.path.join(ROOT, "train.py"), "--kv-store", "device", "--cpu-contexts", "2", *args]
    result = subprocess.run(command, env=venv_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_train_resume_and_score_on_two_contexts(digits_data, tmp_path):
    common = ["--data-backend", "dali-cpu", "--dali-threads", "1", "--dali-validation-threads", "1",
              "--data-val", str(digits_data / "val.rec"), "--data-val-idx", str(digits_data / "val.idx"),
              "--num-layers", "18", "--num-classes", "10", "--image-shape", "3,32,32", "--data-val-resize", "32",
              "--batch-size", "32", "--workspace", str(tmp_path)]
    training = ["--data-train", str(digits_data / "train.rec"), "--data-train-idx", str(digits_data / "train.idx"),
                "--num-epochs", "2", "--num-examples", "384", "--lr", "0.1", "--warmup-epochs", "0",
                "--random-mirror", "0", "--min-random-area", "0.5", "--seed", "2"]
    first = run_train(*common, *training, "--run-epochs", "1")
    assert "Saved checkpoint" in first.stderr
    resumed = run_train(*common, *training)  # loads the parameters on both contexts
    assert "Resuming from" in resumed.stderr and "epoch 1" in resumed.stderr
    with open(tmp_path / "report.json") as f:
        metrics = json.load(f)["metrics"]
    assert len(metrics["train.loss"]) == 2 and len(metrics["val.top1"]) == 2
    assert all(np.isfinite(metrics["train.loss"]))
    # Scoring the last checkpoint on two contexts, and on one, gives the last validation of the training run:
    # the same weights and samples, each counted once, whatever the split over devices.
    run_train(*common, "--mode", "val", "--num-epochs", "1", "--report", "score2.json")
    command = [sys.executable, os.path.join(ROOT, "train.py"), "--kv-store", "local", *common, "--mode", "val",
               "--num-epochs", "1", "--report", "score1.json"]
    result = subprocess.run(command, env=venv_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("score2.json", "score1.json"):
        with open(tmp_path / name) as f:
            scored = json.load(f)["metrics"]
        assert abs(scored["val.top1"][0] - metrics["val.top1"][-1]) < 1e-9, (name, scored, metrics["val.top1"])
        assert abs(scored["val.loss"][0] - metrics["val.loss"][-1]) < 1e-4 * abs(metrics["val.loss"][-1])
