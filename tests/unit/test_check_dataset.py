"""tools/check_dataset.py's checker on RecordIO files with planted faults, written with MXNet's own recordio."""
import check_dataset
import pytest
from mxnet import recordio

from support.datasets import EXPECTED_ERRORS, run_tool

EXPECTED_WARNINGS = {5: "not a JPEG", 8: "grayscale JPEG", 9: "unusual size"}


def test_checker_names_each_planted_fault(planted):
    rec, idx = planted
    report = check_dataset.check(rec, idx, num_classes=10, jobs=1)
    errors = {key: {kind for kind, _ in errs} for _, key, _, errs, _, _, _ in report["entries"] if errs}
    warnings = {key: {kind for kind, _ in warns} for _, key, _, _, warns, _, _ in report["entries"] if warns}
    assert set(errors) == set(EXPECTED_ERRORS)
    for key, kind in EXPECTED_ERRORS.items():
        assert kind in errors[key], (key, errors[key])
    for key, kind in EXPECTED_WARNINGS.items():
        assert kind in warnings[key], (key, warnings.get(key))
    assert not {0, 1} & set(warnings)
    assert 3 not in warnings  # garbage is an error only: no "re-encode it as JPEG" for what does not decode


def test_multi_part_records_match_mxnet(tmp_path):
    """Payloads holding the RecordIO magic word are stored in parts: our reader and writer agree with MXNet's."""
    magic = check_dataset.MAGIC_BYTES
    payloads = [b"abcd" + magic + b"efgh" + magic + b"xy", magic + b"1234", b"plain"]
    prefix = str(tmp_path / "parts")
    writer = recordio.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "w")
    for i, payload in enumerate(payloads):
        writer.write_idx(i, payload)
    writer.close()
    data = open(prefix + ".rec", "rb").read()
    entries, _ = check_dataset.read_index(prefix + ".idx")
    assert [check_dataset.read_record(data, offset)[0] for _, _, offset in entries] == payloads
    assert b"".join(check_dataset.encode_record(p) for p in payloads) == data


def test_positioned_reads_read_as_the_map_does_and_fail_alike(tmp_path):
    """check_dataset reads records with positioned reads (RecordReader), not through a map of the whole file: each
    record, multi-part ones too, and each damaged one against records.read_record over the file's bytes."""
    magic = check_dataset.MAGIC_BYTES
    payloads = [b"abcd" + magic + b"efgh" + magic + b"xy", magic + b"1234", b"plain", b"last one"]
    path = tmp_path / "r.rec"
    data = b"".join(check_dataset.encode_record(p) for p in payloads)
    path.write_bytes(data[:-6])  # the last record cut short
    data = data[:-6]
    starts = [0]
    for p in payloads[:-1]:
        starts.append(starts[-1] + len(check_dataset.encode_record(p)))
    reader = check_dataset.RecordReader(str(path))
    try:
        for offset in starts[:-1]:
            assert reader.record(offset) == check_dataset.read_record(data, offset)
        for offset in (starts[-1], starts[0] + 8, starts[1] + 8, len(data) - 4):  # cut, not a start, a middle part
            with pytest.raises(check_dataset.RecordError) as ours:
                reader.record(offset)
            with pytest.raises(check_dataset.RecordError) as mapped:
                check_dataset.read_record(data, offset)
            assert str(ours.value) == str(mapped.value)
    finally:
        reader.close()


def test_missing_file_is_a_one_line_error(tmp_path):
    result = run_tool(str(tmp_path / "nothing.rec"))
    assert result.returncode == 2
    assert result.stderr.startswith("check_dataset.py: error:") and "Traceback" not in result.stderr


def test_a_repeated_entry_and_a_record_running_into_the_next_are_errors(tmp_path):
    """Found by tests/e2e/test_record_fuzz.py: both passed before (DALI fails on the second in C++)."""
    import struct

    from support.datasets import jpeg, photo, write_payloads
    rec, idx = write_payloads(str(tmp_path / "f"), [(i % 3, jpeg(photo(i))) for i in range(6)])
    lines = open(idx).read().splitlines()
    offsets = [int(line.split()[1]) for line in lines]
    data = bytearray(open(rec, "rb").read())
    word = struct.unpack_from("<I", data, offsets[2] + 4)[0]
    data[offsets[2] + 4:offsets[2] + 8] = struct.pack("<I", word + 64)  # record 2's length field, 64 too long
    open(rec, "wb").write(bytes(data))
    open(idx, "w").write("\n".join(lines + [f"9\t{offsets[4]}"]) + "\n")
    report = check_dataset.check(rec, idx, num_classes=3, jobs=1)
    errors = {key: {kind for kind, _ in errs} for _, key, _, errs, _, _, _ in report["entries"] if errs}
    assert errors == {2: {"overlapping record"}, 9: {"repeated index entry"}}, errors


def dali_refused_jpeg():
    """A JPEG OpenCV decodes and DALI's decoder refuses: the 0xFF of its first Huffman table's marker changed. libjpeg
    skips the stray bytes with a warning and, the table missing, uses the standard one the encoder used (the image
    decodes unchanged); nvImageCodec's parser stops at the invalid marker. One flipped bit in a file does this."""
    from support.datasets import jpeg, photo
    good = jpeg(photo(0))
    at = good.index(b"\xff\xc4")
    return good[:at] + b"\xfd" + good[at + 1:]


def test_an_image_only_dalis_decoder_refuses_is_a_bad_record_and_fix_drops_it(tmp_path, capsys):
    import cv2
    import numpy as np

    import dali
    from support.datasets import jpeg, photo, write_payloads
    bad = dali_refused_jpeg()
    assert cv2.imdecode(np.frombuffer(bad, np.uint8), cv2.IMREAD_COLOR) is not None  # OpenCV decodes it
    assert dali.first_undecodable([np.frombuffer(bad, np.uint8)]) == 0  # the loaders' DALI verdict: refused
    payloads = [(i % 3, bad if i == 4 else jpeg(photo(i))) for i in range(8)]
    rec, idx = write_payloads(str(tmp_path / "f"), payloads)
    fixed = str(tmp_path / "fixed.rec")
    assert check_dataset.main([rec, "--num-classes", "3", "--jobs", "1", "--fix", fixed]) == 0
    out = capsys.readouterr().out
    assert "error: undecodable image: 1 record(s)" in out, out
    assert "  record 4 (index line 5, byte " in out and "DALI's decoder (the dali backends') refuses it" in out
    assert "decoders: OpenCV " in out and " and DALI " in out
    assert "7 records (0 re-encoded as JPEG, 1 dropped)" in out
    reader = recordio.MXIndexedRecordIO(str(tmp_path / "fixed.idx"), fixed, "r")
    kept = [recordio.unpack(reader.read_idx(key))[1] for key in sorted(reader.keys)]
    assert kept == [image for i, (_, image) in enumerate(payloads) if i != 4]
    # OpenCV alone passes it, as the check did before
    assert check_dataset.main([rec, "--num-classes", "3", "--jobs", "1", "--no-dali"]) == 0
    assert "decoders: OpenCV " in capsys.readouterr().out
