"""loaders: the data iterators of every CPU backend (the contract fit.py relies on, sharding, synthetic data), the
read-ahead of the training records, augmentation flags, one pipeline and shard per device, the mxnet backend's
conversion on the device and the pipeline threads."""
import collections
import os
import threading

import mxnet as mx
import numpy as np
import pytest

import train
from rn50kit.common import rules
from rn50kit.config import cli, data_flags, train_config
from rn50kit.data import backend_mxnet, backend_synthetic, io_timing, loaders, protocol, record_source, records
from rn50kit.scoring import scoring
from rn50kit.training import distributed
from support.runs import TINY_RUN, parse_train

MEAN, STD = (123.68, 116.779, 103.939), (58.393, 57.12, 57.375)


def test_other_backends_refuse_in_one_line():
    line = rules.augment_problem("mxnet", "randaugment")
    assert line and "\n" not in line and "--auto-augment" in line and "dali-cpu" in line
    assert rules.augment_problem("mxnet", "none", (0.4,)).startswith("--color-jitter")
    assert rules.augment_problem("dali-cpu", "randaugment", (0.4,)) is None
    assert rules.augment_problem("dali-gpu", "trivialaugment") is None
    assert rules.augment_problem("mxnet") is None
    args = train.parse_args(["--kv-store", "local", *TINY_RUN, "--auto-augment", "randaugment"])
    with pytest.raises(cli.UsageError) as error:
        train.main(args)
    assert str(error.value) == rules.augment_problem("synthetic", "randaugment")


def test_bad_augmentation_values_name_the_flag():
    with pytest.raises(ValueError, match="--color-jitter"):
        data_flags.check_augmentation(data_flags.DataConfig(color_jitter=(0.1, 0.2)))
    with pytest.raises(ValueError, match="--randaugment-m"):
        data_flags.check_augmentation(data_flags.DataConfig(randaugment_m=31))
    assert data_flags.color_jitter3((0.4,)) == (0.4, 0.4, 0.4)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_the_image_grid_shows_the_batch_as_fed(tmp_path, layout):
    """--test-io-grid: the PNG read back holds every image of the batch, un-normalised, in its grid cell."""
    import cv2
    rng = np.random.RandomState(5)
    pixels = rng.randint(0, 256, size=(10, 12, 14, 3)).astype(np.float32)  # NHWC, RGB
    normalised = (pixels - np.array(MEAN, np.float32)) / np.array(STD, np.float32)
    batch = normalised if layout == "NHWC" else normalised.transpose(0, 3, 1, 2)
    path = str(tmp_path / "grid.png")
    io_timing.save_image_grid(mx.nd.array(batch), path, MEAN, STD, layout, columns=4)
    grid = cv2.imread(path)[:, :, ::-1]
    assert grid.shape == (3 * 12, 4 * 14, 3)
    for i in range(10):
        row, column = divmod(i, 4)
        cell = grid[row * 12:(row + 1) * 12, column * 14:(column + 1) * 14]
        np.testing.assert_allclose(cell, pixels[i], atol=1)
    assert not grid[2 * 12:, 2 * 14:].any()  # the two cells after the last image stay empty


def rec_args(backend, rec, idx, batch_size, *extra):
    return parse_train("--data-backend", backend, "--data-train", rec, "--data-train-idx", idx, "--data-val", rec,
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
    assert [backend_mxnet.mxnet_shard_size(13, r, 2) for r in range(2)] == [7, 6]
    assert sum(backend_mxnet.mxnet_shard_size(53, r, 3) for r in range(3)) == 53


def test_synthetic_validation_follows_the_training_rule():
    args = parse_train("--data-backend", "synthetic", "--batch-size", "64", "--image-shape", "3,16,16",
                 "--num-classes", "5", "--num-examples", "512", "--seed", "2")
    train_iter, val_iter = loaders.get_data_iterators(train_config.from_args(args), 0, 1, 0, 1, mx.cpu())

    def features(iterator):
        xs, ys = [], []
        for batch in iterator:
            xs.append(backend_synthetic.quadrant_means(batch.data[0]).asnumpy())
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


# --- 6: the mxnet backend copies to the device first, then casts, pads and transposes there ----------------

def test_mxnet_backend_converts_on_the_device(monkeypatch):
    """Found by the second review of the GPU paths (issue 21)."""
    seen = []
    real = backend_mxnet.to_layout

    def to_layout(batch, *rest):
        seen.append(batch.context)
        return real(batch, *rest)

    class Records:  # ImageRecordIter's batches: float32 NCHW in host memory
        def next(self):
            return mx.io.DataBatch(data=[mx.nd.ones((2, 3, 8, 8))], label=[mx.nd.zeros((2,))])

        def reset(self):
            pass

    monkeypatch.setattr(backend_mxnet, "to_layout", to_layout)
    device = mx.cpu(1)  # a context other than the reader's, standing in for the GPU
    iterator = backend_mxnet.RecordIterator(Records(), 4, 2, device, channels=4, dtype="float16", layout="NHWC",
                                            wrap=True)
    batch = next(iter(iterator))
    assert seen == [device]
    assert batch.data[0].shape == (2, 8, 8, 4) and batch.data[0].dtype == np.float16
    assert batch.data[0].context == device


# --- 8: DALI's threads from the affinity mask -----------------------------------------------------------------

def test_pipeline_threads_follow_the_affinity_mask(monkeypatch):
    """Found by the second review of the GPU paths (issue 21)."""
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert protocol.default_threads(1) == 4 and protocol.default_threads(2) == 2


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
    # One permutation of the whole file per epoch, cut into a shard per device (record_source.ShuffledShardSource):
    # disjoint, and each drawn from the whole file rather than from a contiguous range of records.
    assert not trained[0] & trained[1]
    for d in range(2):
        assert len(trained[d]) > len(shards[d]) // 2 and trained[d] - shards[d]


BATCH = 5  # divides neither shard of the 53 records (26 and 27)


def expected_batches(total, shard_id, num_shards, seed, count):
    """``count`` batches of this shard, computed here: each epoch a permutation of all records (numpy's generator
    seeded by (seed, epoch)), the shard's slice of it, the epochs one after another."""
    start, end = total * shard_id // num_shards, total * (shard_id + 1) // num_shards
    flat, epoch = [], 0
    while len(flat) < count * BATCH:
        flat += np.random.default_rng([seed, epoch]).permutation(total)[start:end].tolist()
        epoch += 1
    return [flat[i * BATCH:(i + 1) * BATCH] for i in range(count)]


def shard_batches(count, shard_id, num_shards):
    shard = count * (shard_id + 1) // num_shards - count * shard_id // num_shards
    return 2 * shard // BATCH + 2  # past the ends of two epochs


@pytest.mark.parametrize("use_mmap", [True, False])
@pytest.mark.parametrize("shard_id, num_shards", [(0, 1), (0, 2), (1, 2)])
def test_same_batches_in_the_same_order(unique_label_rec, shard_id, num_shards, use_mmap):
    rec, idx, count = unique_label_rec
    record_file = records.RecordFile(rec, idx, use_mmap=use_mmap)
    batches = shard_batches(count, shard_id, num_shards)
    source = record_source.ShuffledShardSource(record_file, shard_id, num_shards, BATCH, seed=3, remember=batches,
                                               ahead=2)
    expected = expected_batches(count, shard_id, num_shards, 3, batches)
    for picks in expected:
        images, labels = source()
        assert labels.dtype == np.float32 and labels.shape == (BATCH, 1)
        assert labels.ravel().astype(int).tolist() == picks  # record i's label is i
        assert [bytes(image) for image in images] == [bytes(record_file.image(i)) for i in picks]
    assert list(source.recent) == expected  # what failing_record searches


def test_batches_stay_intact_through_dali_while_the_buffers_are_reused(unique_label_rec):
    """DALI's own external_source and prefetching, the fewest buffers (ahead=1: two), a queue deeper than them:
    a buffer reused before DALI had copied its batch would show as another record's bytes."""
    from nvidia.dali import fn, pipeline_def, types
    rec, idx, count = unique_label_rec
    record_file = records.RecordFile(rec, idx)
    source = record_source.ShuffledShardSource(record_file, 0, 1, BATCH, seed=5, ahead=1)

    @pipeline_def(batch_size=BATCH, num_threads=1, device_id=None, prefetch_queue_depth=4)
    def passthrough():
        return tuple(fn.external_source(source=source, num_outputs=2, batch=True, dtype=[types.UINT8, types.FLOAT]))

    pipe = passthrough()
    pipe.build()
    batches = shard_batches(count, 0, 1)
    for picks in expected_batches(count, 0, 1, 5, batches):
        images, labels = pipe.run()
        assert np.asarray(labels.as_tensor()).ravel().astype(int).tolist() == picks
        assert [bytes(np.asarray(images[j])) for j in range(BATCH)] == [bytes(record_file.image(i)) for i in picks]
    assert len(source._buffers) == 2


def reading_threads():
    return [thread for thread in threading.enumerate() if thread.name == "record-reader"]


def test_one_reading_thread_for_every_source(unique_label_rec):
    rec, idx, _ = unique_label_rec
    record_file = records.RecordFile(rec, idx)
    for epoch in range(12):  # train.py builds a pipeline, and its source, per epoch
        source = record_source.ShuffledShardSource(record_file, epoch % 2, 2, BATCH, seed=epoch)
        for _ in range(3):
            source()
    assert len(reading_threads()) == 1
    assert reading_threads()[0].daemon  # an exiting process does not wait on a read


def test_a_reading_error_is_raised_in_the_call_of_its_batch(unique_label_rec):
    rec, idx, count = unique_label_rec
    record_file = records.RecordFile(rec, idx)
    first, second = expected_batches(count, 0, 1, 4, 2)
    record_file.offsets = record_file.offsets.copy()
    record_file.offsets[second[2]] = 10 ** 12  # a record offset past the end of the file: the read fails
    source = record_source.ShuffledShardSource(record_file, 0, 1, BATCH, seed=4, ahead=3)
    assert source()[1].ravel().astype(int).tolist() == first
    for _ in range(2):  # and again in later calls, rather than a wait for a batch that never comes
        with pytest.raises(records.RecordFileError, match=f"record {second[2]} .* points past the end of the file"):
            source()
    assert list(source.recent) == [first]


def test_bad_sizes_name_the_flags():
    with pytest.raises(ValueError, match="--train-size-epochs"):
        data_flags.check_train_size(data_flags.DataConfig(train_size=(16, 32)))
    with pytest.raises(ValueError, match="--train-size"):
        data_flags.check_train_size(data_flags.DataConfig(train_size=(0,)))
    data_flags.check_train_size(data_flags.DataConfig(train_size=(16, 32), train_size_epochs=(1, 3)))
