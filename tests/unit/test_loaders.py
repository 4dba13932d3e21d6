"""loaders.get_data_iterators for every CPU backend: the contract fit.py relies on, sharding, synthetic data, --test-io."""
import collections
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

from rn50kit.data import loaders
import train
from conftest import ROOT, venv_env
from rn50kit.config import train_config


def parse(*argv):
    return train.parse_args([str(a) for a in argv])


def rec_args(backend, rec, idx, batch_size, *extra):
    return parse("--data-backend", backend, "--data-train", rec, "--data-train-idx", idx, "--data-val", rec,
                 "--data-val-idx", idx, "--batch-size", batch_size, "--image-shape", "3,16,16",
                 "--data-val-resize", "16", "--dali-threads", "1", "--dali-validation-threads", "1",
                 "--data-mxnet-threads", "1", "--seed", "3", *extra)


@pytest.mark.parametrize("backend", ["dali-cpu", "mxnet"])
@pytest.mark.parametrize("local_batch", [4, 7])
def test_two_ranks_see_each_val_sample_once(unique_label_rec, backend, local_batch):
    rec, idx, count = unique_label_rec
    args = rec_args(backend, rec, idx, 2 * local_batch)
    seen, train_lengths = collections.Counter(), set()
    for rank in range(2):
        train_iter, val_iter = loaders.get_data_iterators(train_config.from_args(args), rank, 2, 0, 1, mx.cpu())
        train_lengths.add(len(train_iter))
        for epoch in range(2):  # one epoch per `for`, the same samples each time
            batches = 0
            for batch in val_iter:
                assert batch.data[0].shape == (local_batch, 3, 16, 16)
                valid = local_batch - batch.pad
                labels = batch.label[0].asnumpy()[:valid].astype(int)
                seen.update(labels.tolist())
                batches += 1
            assert batches == len(val_iter)
    assert sorted(seen) == list(range(count))
    assert set(seen.values()) == {2}  # once per epoch, two epochs
    # Training: the same number of full batches on both ranks, enough for every record.
    assert train_lengths == {-(-count // (2 * local_batch))}


@pytest.mark.parametrize("backend", ["dali-cpu", "mxnet"])
def test_training_batches_are_full_and_in_requested_format(unique_label_rec, backend):
    rec, idx, count = unique_label_rec
    args = rec_args(backend, rec, idx, 8, "--dtype", "float32", "--input-layout", "NHWC", "--image-shape", "4,16,16")
    args.dtype = "float16"  # fit.py owns --dtype; the pipelines follow args.dtype
    train_iter, _ = loaders.get_data_iterators(train_config.from_args(args), 0, 1, 0, 1, mx.cpu())
    steps = 0
    for batch in train_iter:
        image = batch.data[0]
        assert image.shape == (8, 16, 16, 4) and image.dtype == np.float16 and batch.pad == 0
        assert not image[:, :, :, 3].asnumpy().any()
        labels = batch.label[0].asnumpy()
        assert ((labels >= 0) & (labels < count)).all()
        steps += 1
    assert steps == len(train_iter) == -(-count // 8)


def test_mxnet_shard_size_matches_record_iter_split():
    assert [loaders.mxnet_shard_size(13, r, 2) for r in range(2)] == [7, 6]
    assert sum(loaders.mxnet_shard_size(53, r, 3) for r in range(3)) == 53


def test_synthetic_validation_follows_the_training_rule():
    args = parse("--data-backend", "synthetic", "--batch-size", "64", "--image-shape", "3,16,16",
                 "--num-classes", "5", "--num-examples", "512", "--seed", "2")
    train_iter, val_iter = loaders.get_data_iterators(train_config.from_args(args), 0, 1, 0, 1, mx.cpu())

    def features(iterator):
        xs, ys = [], []
        for batch in iterator:
            xs.append(loaders.quadrant_means(batch.data[0]).asnumpy())
            ys.append(batch.label[0].asnumpy().astype(int))
        return np.concatenate(xs), np.concatenate(ys)

    x_train, y_train = features(train_iter)
    x_val, y_val = features(val_iter)
    assert len(y_train) == 512 and len(y_val) == 128
    assert not (x_val[:, None, :] == x_train[None, :, :]).all(axis=2).any()  # validation images are new images
    assert np.bincount(y_train, minlength=5).min() > 20  # every class occurs
    # A linear classifier fitted on training data only predicts validation labels: the rule is shared.
    weights = np.linalg.lstsq(np.c_[x_train, np.ones(len(x_train))], np.eye(5)[y_train], rcond=None)[0]
    accuracy = (np.c_[x_val, np.ones(len(x_val))].dot(weights).argmax(1) == y_val).mean()
    assert accuracy > 0.6, accuracy  # chance is 0.2


def test_test_io_counts_every_image(digits_data):
    args = parse("--data-backend", "dali-cpu", "--data-train", digits_data / "train.rec",
                 "--data-train-idx", digits_data / "train.idx", "--data-val", digits_data / "val.rec",
                 "--data-val-idx", digits_data / "val.idx", "--batch-size", "32", "--image-shape", "3,32,32",
                 "--data-val-resize", "32", "--dali-threads", "1", "--dali-validation-threads", "1",
                 "--test-io", "--test-io-mode", "val", "--disp-batches", "2")
    train_iter, val_iter = loaders.get_data_iterators(train_config.from_args(args), 0, 1, 0, 1, mx.cpu())
    lines = []
    result = loaders.test_io(train_config.from_args(args), train_iter, val_iter, epochs=2, out=lines.append)
    assert result["images"] == 2 * 359 - 32  # the first batch is start-up, not timed
    assert result["images_per_sec"] > 0
    assert "images/s" in lines[-1] and any("ETA" in line for line in lines[:-1])


@pytest.mark.slow
def test_train_py_test_io_runs_without_a_model(digits_data, tmp_path):
    workspace = tmp_path / "ws"
    result = subprocess.run(
        [sys.executable, "train.py", "--data-backend", "mxnet", "--data-train", str(digits_data / "train.rec"),
         "--data-train-idx", str(digits_data / "train.idx"), "--batch-size", "64", "--image-shape", "3,32,32",
         "--num-examples", "640", "--test-io", "--workspace", str(workspace)], cwd=ROOT, env=venv_env(),
        capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert not workspace.exists()  # it writes nothing: no folder, no run lock (a training run there is not refused)
    assert "test-io train backend mxnet: 576 images" in result.stdout
    assert "INFO Timing the input pipeline (train) for resnet50_v1.5" in result.stderr  # no training, no epochs
    assert "Training" not in result.stderr and "epochs" not in result.stderr
    assert "recipe nvidia" not in result.stderr  # no LR is used, so none is explained


@pytest.mark.slow
def test_dali_gpu_without_gpu_is_a_one_line_error(digits_data):
    if mx.context.num_gpus():
        pytest.skip("this machine has a GPU")
    result = subprocess.run(
        [sys.executable, "train.py", "--data-backend", "dali-gpu", "--data-train", str(digits_data / "train.rec"),
         "--data-train-idx", str(digits_data / "train.idx"), "--test-io"],
        cwd=ROOT, env=venv_env(), capture_output=True, text=True)
    assert result.returncode == 2
    assert "error: --data-backend dali-gpu needs a GPU" in result.stderr and "Traceback" not in result.stderr
