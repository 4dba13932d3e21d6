"""The training records read ahead by loaders.ShuffledShardSource on the process's one reading thread: the same batches
in the same order as a numpy permutation computed here (one shard and two, mmap and plain reads, across epoch
ends), intact through a real DALI pipeline while its buffers are reused, one thread however many sources (a
pipeline per epoch), and a reading error raised in the call of its batch."""
import threading

import numpy as np
import pytest

from rn50kit.data import loaders
from rn50kit.data import records

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
    source = loaders.ShuffledShardSource(record_file, shard_id, num_shards, BATCH, seed=3, remember=batches, ahead=2)
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
    source = loaders.ShuffledShardSource(record_file, 0, 1, BATCH, seed=5, ahead=1)

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
        source = loaders.ShuffledShardSource(record_file, epoch % 2, 2, BATCH, seed=epoch)
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
    source = loaders.ShuffledShardSource(record_file, 0, 1, BATCH, seed=4, ahead=3)
    assert source()[1].ravel().astype(int).tolist() == first
    for _ in range(2):  # and again in later calls, rather than a wait for a batch that never comes
        with pytest.raises(ValueError, match="offset"):
            source()
    assert list(source.recent) == [first]
