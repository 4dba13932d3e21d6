"""The training record order on a file stored in label order: two shards (in one process, through the real DALI
CPU pipeline) are disjoint, cover every record once per epoch, draw from the whole file, and the order is
reproducible with --seed and across a resume."""
import mxnet as mx
import numpy as np
import pytest

import train
from rn50kit.config import train_config
from rn50kit.data import loaders, record_files, records
from rn50kit.training import distributed, epoch_data
from support.datasets import NUM_CLASSES, NUM_RECORDS, write_record_file
from support.runs import parse_ordered


def epoch_labels(iterator):
    labels = []
    for batch in iterator:
        valid = batch.data[0].shape[0] - batch.pad
        labels += batch.label[0].asnumpy()[:valid].astype(int).tolist()
    return labels


def rank_epochs(args, rank, epochs):
    """Labels each rank reads in its first ``epochs`` epochs, built as train.py builds them (factory per epoch)."""
    first = loaders.get_data_iterators(train_config.from_args(args), rank, 2, 0, 1, mx.cpu())[0]
    dist = distributed.Distributed(None)
    dist.rank, dist.size = rank, 2
    make = epoch_data.train_iterator_factory(train_config.from_args(args), dist, [mx.cpu()], first)
    return [epoch_labels(make(epoch)) for epoch in range(epochs)]


def test_shards_disjoint_every_record_once_and_from_the_whole_file(sorted_rec):
    rec, idx = sorted_rec
    args = parse_ordered(rec, idx, "--seed", "5")
    rank0, rank1 = rank_epochs(args, 0, 2), rank_epochs(args, 1, 2)
    for epoch in range(2):
        assert len(rank0[epoch]) == len(rank1[epoch]) == NUM_RECORDS // 2
        assert not set(rank0[epoch]) & set(rank1[epoch])
        assert sorted(rank0[epoch] + rank1[epoch]) == list(range(NUM_RECORDS))
        for labels in (rank0[epoch], rank1[epoch]):
            # DALI's reader would give rank 0 records 0..31 (classes 0 and 1) and rank 1 the rest
            assert {label // 16 for label in labels} == set(range(NUM_CLASSES)), labels
            assert labels != sorted(labels)
    assert rank0[0] != rank0[1]  # a new shuffle each epoch


def test_order_reproducible_with_seed_and_on_resume(sorted_rec):
    rec, idx = sorted_rec
    run_a = rank_epochs(parse_ordered(rec, idx, "--seed", "5"), 0, 3)
    run_b = rank_epochs(parse_ordered(rec, idx, "--seed", "5"), 0, 3)
    assert run_a == run_b
    # a run resumed at epoch 2 builds only that epoch's pipeline: the same records in the same order
    args = parse_ordered(rec, idx, "--seed", "5")
    first = loaders.get_data_iterators(train_config.from_args(args), 0, 2, 0, 1, mx.cpu())[0]
    dist = distributed.Distributed(None)
    dist.rank, dist.size = 0, 2
    make = epoch_data.train_iterator_factory(train_config.from_args(args), dist, [mx.cpu()], first)
    assert epoch_labels(make(2)) == run_a[2]
    assert rank_epochs(parse_ordered(rec, idx, "--seed", "6"), 0, 1)[0] != run_a[0]


def test_without_seed_the_epochs_continue_through_new_shuffles(sorted_rec):
    """Without --seed the same pipeline serves every epoch: each still covers the rank's shard of a new shuffle."""
    rec, idx = sorted_rec
    cfg = train_config.from_args(parse_ordered(rec, idx))
    iterators = [loaders.get_data_iterators(cfg, rank, 2, 0, 1, mx.cpu())[0] for rank in (0, 1)]
    for _ in range(2):
        labels = [epoch_labels(iterator) for iterator in iterators]
        assert sorted(labels[0] + labels[1]) == list(range(NUM_RECORDS))


def test_shard_order_with_uneven_shards():
    """53 records over 3 shards (sizes 17, 18, 18): disjoint, complete, and a batch crossing the end of a shard
    continues into the next epoch's shard."""
    orders = [records.ShardOrder(53, shard, 3, seed=1) for shard in range(3)]
    sizes = [records.shard_bounds(53, shard, 3) for shard in range(3)]
    epoch0 = [order.take(end - start) for order, (start, end) in zip(orders, sizes)]
    assert sorted(sum(epoch0, [])) == list(range(53))
    epoch1 = [order.take(end - start) for order, (start, end) in zip(orders, sizes)]
    assert sorted(sum(epoch1, [])) == list(range(53)) and epoch1 != epoch0
    crossing = records.ShardOrder(53, 0, 3, seed=1)
    assert crossing.take(20) == epoch0[0] + epoch1[0][:3]


@pytest.mark.parametrize("no_mmap", [False, True])
def test_each_image_arrives_with_its_own_label(tmp_path, no_mmap):
    """Record i holds a flat image of grey level 4*i and label i: after the training pipeline (crop, resize,
    normalisation with mean 0 and std 1) every sample's mean pixel is still 4 * its label, read through mmap
    or, with --dali-dont-use-mmap, with plain reads."""
    flat = [np.full((24, 32, 3), 4 * i, dtype=np.uint8) for i in range(NUM_RECORDS)]
    rec, idx = write_record_file(str(tmp_path / "flat"), flat, range(NUM_RECORDS))
    extra = ["--rgb-mean", "0,0,0", "--rgb-std", "1,1,1", "--seed", "2"] + (["--dali-dont-use-mmap"] if no_mmap else [])
    cfg = train_config.from_args(parse_ordered(rec, idx, *extra))
    iterator = loaders.get_data_iterators(cfg, 0, 1, 0, 1, mx.cpu())[0]
    seen = 0
    for batch in iterator:
        means = batch.data[0].asnumpy().mean(axis=(1, 2, 3))
        np.testing.assert_allclose(means, 4 * batch.label[0].asnumpy(), atol=2)
        seen += len(means)
    assert seen == NUM_RECORDS


def damaged_copy(tmp_path, rec, idx, record, change):
    """A copy of rec/idx whose ``record``-th record (file order) has ``change(bytearray, offset)`` applied."""
    data = bytearray(open(rec, "rb").read())
    offsets = sorted(int(line.split()[1]) for line in open(idx) if line.strip())
    change(data, offsets[record])
    out = tmp_path / "damaged.rec"
    out.write_bytes(bytes(data))
    return str(out), idx, offsets


@pytest.mark.parametrize("record, cflag, extra, words", [
    (3, 0, 64, "runs into the next one"),  # a length field grown past the next record
    (11, 0, 4, "cut off by the end of the file"),  # the last record's, past its padding
    (3, 1, 0, "runs into the next one"),  # "first of several parts": its next part would be the next record
    (11, 1, 0, "cut off by the end of the file"),  # the last record said to go on (a traceback before, issue 48)
])
def test_a_record_that_runs_past_the_next_one_is_refused_naming_it(tmp_path, record, cflag, extra, words):
    """DALI reads each record within the gap to the next one and fails in C++ otherwise: refused first, in one
    line naming the file and record. (Found by tests/e2e/test_record_fuzz.py.)"""
    import struct
    rec, idx = write_record_file(str(tmp_path / "good"), [np.full((20, 24, 3), i * 20, np.uint8) for i in range(12)],
                                 [i % 3 for i in range(12)])

    def change(data, offset):
        word = struct.unpack_from("<I", data, offset + 4)[0]
        data[offset + 4:offset + 8] = struct.pack("<I", (cflag << 29) | ((word & ((1 << 29) - 1)) + extra))
    rec, idx, offsets = damaged_copy(tmp_path, rec, idx, record, change)
    with pytest.raises(records.RecordFileError) as refused:
        records.RecordFile(rec, idx)
    message = str(refused.value)
    assert f"(record {record}) points to a record that {words}" in message or \
        f"(record {record}) points to a record {words}" in message, message
    assert rec in message and "\n" not in message


@pytest.mark.parametrize("label, words", [
    (2.5, "has label 2.5, not a class 0 to 2"), (1e-38, "has label 1e-38, not a class 0 to 2"),
    (float("nan"), "has label nan"), (-1.0, "has label -1, not a class"), (float("inf"), "has label inf"),
    (7.0, "the data has labels up to 7 but --num-classes is 3; use --num-classes 8 (the first such record: "),
])
def test_a_label_that_is_not_a_class_is_refused_naming_file_and_record(tmp_path, label, words):
    """A reader passes a label on as it is (2.5, or 1e-38 from a flipped bit): refused at start-up, naming the
    record. (Found by tests/e2e/test_record_fuzz.py.)"""
    import struct
    rec, idx = write_record_file(str(tmp_path / "good"), [np.full((20, 24, 3), i * 20, np.uint8) for i in range(12)],
                                 [i % 3 for i in range(12)])
    rec, idx, offsets = damaged_copy(tmp_path, rec, idx, 5,
                                     lambda data, offset: data.__setitem__(slice(offset + 12, offset + 16),
                                                                           struct.pack("<f", label)))
    args = train.parse_args(["--data-backend", "dali-cpu", "--data-val", rec, "--data-val-idx", idx,
                             "--num-classes", "3", "--image-shape", "3,32,32"])
    message = record_files.label_problem(train_config.from_args(args).data, 3)
    assert words in message and f"{rec} record 5 (byte {offsets[5]})" in message, message
    assert "\n" not in message
