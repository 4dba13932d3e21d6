"""The training records read ahead on a thread of data.ShuffledShardSource: the same batches in the same order as
reading them in the call, a thread that ends when its source is closed or let go, and a reading error raised in
the call that would have read the batch."""
import gc
import threading
import weakref

import numpy as np
import pytest

import data
import records
from conftest import wait_until

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


@pytest.mark.parametrize("use_mmap", [True, False])
@pytest.mark.parametrize("shard_id, num_shards", [(0, 1), (0, 2), (1, 2)])
def test_same_batches_in_the_same_order(unique_label_rec, shard_id, num_shards, use_mmap):
    rec, idx, count = unique_label_rec
    record_file = records.RecordFile(rec, idx, use_mmap=use_mmap)
    shard = count * (shard_id + 1) // num_shards - count * shard_id // num_shards
    batches = 2 * shard // BATCH + 2  # past the end of two epochs, the queue full on the way
    source = data.ShuffledShardSource(record_file, shard_id, num_shards, BATCH, seed=3, remember=batches, ahead=2)
    expected = expected_batches(count, shard_id, num_shards, 3, batches)
    for picks in expected:
        images, labels = source()
        assert labels.dtype == np.float32 and labels.shape == (BATCH, 1)
        assert labels.ravel().astype(int).tolist() == picks  # record i's label is i
        for image, i in zip(images, picks):
            assert bytes(image) == bytes(record_file.image(i))
    assert list(source.recent) == expected  # what failing_record searches
    source.close()


def new_threads(before):
    return set(threading.enumerate()) - before


@pytest.mark.parametrize("let_go", ["close", "del"])
def test_the_thread_ends_when_the_source_is_closed_or_let_go(unique_label_rec, let_go):
    rec, idx, _ = unique_label_rec
    gc.collect()  # sources of earlier tests
    before = set(threading.enumerate())
    source = data.ShuffledShardSource(records.RecordFile(rec, idx), 0, 1, BATCH, seed=0, ahead=1)
    assert len(new_threads(before)) == 1
    assert all(thread.daemon for thread in new_threads(before))
    source()
    wait_until(source._ready.full, "the reading thread to fill its queue")  # it now waits for room
    if let_go == "close":
        source.close()
        with pytest.raises(RuntimeError, match="closed"):
            source()
    else:
        gone = weakref.ref(source)
        del source
        gc.collect()
        assert gone() is None, "the reading thread keeps its source alive"
    wait_until(lambda: not new_threads(before), "the reading thread to end")


def test_a_reading_error_is_raised_in_the_call_of_its_batch(unique_label_rec):
    rec, idx, count = unique_label_rec
    record_file = records.RecordFile(rec, idx)
    first, second = expected_batches(count, 0, 1, 4, 2)
    record_file.offsets = record_file.offsets.copy()
    record_file.offsets[second[2]] = 10 ** 12  # a record offset past the end of the file: the read fails
    source = data.ShuffledShardSource(record_file, 0, 1, BATCH, seed=4, ahead=3)
    assert source()[1].ravel().astype(int).tolist() == first
    for _ in range(2):  # and again in later calls, rather than a wait for batches that never come
        with pytest.raises(ValueError, match="offset"):
            source()
    assert list(source.recent) == [first]
