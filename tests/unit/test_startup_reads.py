"""Start-up on a large record file reads the index and a bounded sample of record headers (positioned reads), and
a damaged record it did not read is named in one line where the training reader meets it; the .lst parser agrees
with a line-by-line reading; check_dataset's overlap check agrees with a rescan of every entry."""
import os
import struct

import check_dataset
import numpy as np
import pytest

from rn50kit.data import backend_mxnet, protocol, record_source, records

COUNT, SAMPLE, BLOCK = 300, 32, 8  # a file ten times the (shrunk) sample


def write_records(path, labels, spacing=200):
    """A .rec with one record (a label header and 20 bytes standing for an image) every ``spacing`` bytes."""
    with open(path + ".rec", "wb") as rec, open(path + ".idx", "w") as idx:
        for i, label in enumerate(labels):
            rec.seek(i * spacing)
            rec.write(records.encode_record(records.IR_HEADER.pack(0, label, i, 0) + bytes(20)))
            idx.write(f"{i}\t{i * spacing}\n")
    return path + ".rec", path + ".idx"


@pytest.fixture
def small_sample(monkeypatch):
    monkeypatch.setattr(records, "SAMPLE_RECORDS", SAMPLE)
    monkeypatch.setattr(records, "SAMPLE_BLOCK", BLOCK)


@pytest.fixture
def preads(monkeypatch):
    """The (offset, size) of every os.pread."""
    calls, pread = [], os.pread
    monkeypatch.setattr(os, "pread", lambda fd, size, offset: calls.append((offset, size)) or pread(fd, size, offset))
    return calls


def test_the_sample_spans_the_file_in_blocks_with_its_first_and_last_record(small_sample):
    assert records.checked_records(SAMPLE).tolist() == list(range(SAMPLE))
    sample = records.checked_records(COUNT)
    assert len(sample) == SAMPLE and sample[0] == 0 and sample[-1] == COUNT - 1
    starts = sample[::BLOCK]
    assert np.all(np.diff(sample.reshape(-1, BLOCK), axis=1) == 1)  # blocks of consecutive records
    assert np.ptp(np.diff(starts)) <= 1  # spread evenly


def test_start_up_reads_the_sample_s_headers_only(tmp_path, small_sample, preads):
    rec, idx = write_records(str(tmp_path / "big"), [i % 7 for i in range(COUNT)])
    record_file = records.RecordFile(rec, idx)
    assert sorted(offset for offset, _ in preads) == [200 * int(i) for i in records.checked_records(COUNT)]
    assert {size for _, size in preads} == {records.HEADER_BYTES}
    assert record_file.labels.tolist() == [i % 7 for i in record_file.checked]


def damage(rec, offset, change):
    data = bytearray(open(rec, "rb").read())
    change(data, offset)
    open(rec, "wb").write(bytes(data))


def unchecked_record(small_sample_count=COUNT):
    return next(i for i in range(small_sample_count) if i not in set(records.checked_records(small_sample_count)))


@pytest.mark.parametrize("use_mmap", [True, False])
def test_a_damaged_record_the_start_up_did_not_read_is_named_where_it_is_read(tmp_path, small_sample, use_mmap):
    rec, idx = write_records(str(tmp_path / "big"), [i % 7 for i in range(COUNT)])
    bad = unchecked_record()
    damage(rec, 200 * bad + 4, lambda data, at: data.__setitem__(slice(at, at + 4), struct.pack("<I", 500)))
    record_file = records.RecordFile(rec, idx, use_mmap=use_mmap)  # the sample is sound: the run starts
    source = record_source.ShuffledShardSource(record_file, 0, 1, 10, seed=1, ahead=0)
    with pytest.raises(records.RecordFileError) as met:
        for _ in range(COUNT // 10 + 1):
            source()
    message = str(met.value)
    assert f"{rec} record {bad} (byte {200 * bad}) points to a record that runs into the next one" in message
    assert "--fix OUT.rec" in message and "\n" not in message
    with pytest.raises(records.RecordFileError, match=f"record {bad} "):  # as the pipeline's error line says it
        source.failing_record()


def test_a_label_the_start_up_did_not_read_is_named_by_the_training_reader(tmp_path, small_sample):
    rec, idx = write_records(str(tmp_path / "big"), [i % 7 for i in range(COUNT)])
    bad = unchecked_record()
    damage(rec, 200 * bad + 12, lambda data, at: data.__setitem__(slice(at, at + 4), struct.pack("<f", 2.5)))
    record_file = records.RecordFile(rec, idx)
    source = record_source.ShuffledShardSource(record_file, 0, 1, 10, seed=1, ahead=0, num_classes=7)
    with pytest.raises(records.RecordFileError) as met:
        for _ in range(COUNT // 10 + 1):
            source()
    assert f"{rec} record {bad} (byte {200 * bad}) has label 2.5, not a class 0 to 6" in str(met.value)


def reference_lst(path):
    """The line-by-line reading the kit did before (train.py's class count, then the class names)."""
    names = {}
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) >= 3:
                names[int(float(parts[1]))] = parts[-1].replace("\\", "/").split("/")[0]
    return names


def test_lst_classes_agree_with_a_line_by_line_reading(tmp_path):
    rng = np.random.default_rng(3)
    lines = [f"{i}\t{label}.000000\tn{label:03d}/{i}.JPEG" for i, label in enumerate(rng.integers(0, 40, 500))]
    lines += ["500\t3\tthree\\x.jpg", "501\t12.5\thalf/a", "502\t-1\tneg/a", "not a line", "", "503\t7\t1\tmulti/b",
              "504\t1e1\tten/c", "505\t.0\tdot/d", "506\t0042\tlead/e", "507\t3\tthree-again/f"]
    path = tmp_path / "train.lst"
    path.write_text("\n".join(lines) + "\r\n503\t39\tlast/no-newline", newline="")
    assert records.lst_classes(str(path)) == reference_lst(str(path))
    assert records.lst_classes(str(path))[3] == "three-again"  # the last line of a label listed twice


def quadratic_overlaps(results, size):
    """check_dataset's overlap check as it was: every entry rescans the record starts."""
    by_offset = sorted(results, key=lambda r: r[2])
    starts = sorted({r[2] for r in results if r[6] is not None})
    for k, (_, key, offset, errors, _, _, end) in enumerate(by_offset):
        if k and by_offset[k - 1][2] == offset:
            errors.append(("repeated index entry", by_offset[k - 1][1]))
            continue
        following = next((start for start in starts if start > offset), size)
        if not errors and end is not None and end > following:
            errors.append(("overlapping record", end - following, following))
    return results


def test_overlaps_agree_with_a_rescan_of_every_entry():
    rng = np.random.default_rng(0)
    offsets = rng.choice(4000, 300) * 4  # repeats among them
    size = 16100
    results = [(i, i, int(offset), [] if rng.random() > 0.1 else [("bad", "")], [], {},
                None if rng.random() < 0.05 else int(offset) + 8 + 4 * int(rng.integers(0, 12)))
               for i, offset in enumerate(offsets)]
    ours = check_dataset.overlaps([r[:3] + ([],) + r[4:] for r in results], size)
    theirs = quadratic_overlaps([r[:3] + ([],) + r[4:] for r in results], size)
    kinds = [[kind for kind, *_ in r[3]] for r in ours]
    assert kinds == [[kind for kind, *_ in r[3]] for r in theirs]
    assert {"repeated index entry", "overlapping record"} <= {kind for found in kinds for kind in found}


def test_label_order_is_still_seen_in_the_sample_of_a_large_file(tmp_path, monkeypatch):
    """The mxnet backend refuses a label-ordered file for several workers: its blocks of consecutive records keep
    the runs of one label that the measure needs."""
    monkeypatch.setattr(records, "SAMPLE_RECORDS", 64)
    monkeypatch.setattr(records, "SAMPLE_BLOCK", 16)
    ordered = [i // 60 for i in range(600)]  # ten classes, class by class
    shuffled = np.random.default_rng(0).permutation(ordered).tolist()
    for name, labels, expected in (("ordered", ordered, True), ("shuffled", shuffled, False)):
        record_file = records.RecordFile(*write_records(str(tmp_path / name), labels))
        assert len(record_file.labels) == 64
        assert records.label_runs(record_file.labels)["ordered"] is expected, name
        if expected:
            with pytest.raises(protocol.DataError, match="label order"):
                backend_mxnet.check_mxnet_shards(record_file, 2)
