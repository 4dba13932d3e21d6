"""tools/check_dataset.py on RecordIO files with planted faults, written with MXNet's own recordio."""
import os
import subprocess
import sys

import cv2
from mxnet import recordio
import numpy as np
import pytest

import check_dataset
from conftest import ROOT, venv_env

TOOL = os.path.join(ROOT, "tools", "check_dataset.py")


def photo(seed, shape=(60, 80)):
    rng = np.random.RandomState(seed)
    small = rng.randint(0, 255, size=(6, 8, 3), dtype=np.uint8)
    return cv2.resize(small, shape[::-1], interpolation=cv2.INTER_CUBIC)


def jpeg(image, quality=90):
    return cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])[1].tobytes()


def write_payloads(prefix, payloads):
    """payloads: list of (label, image bytes); returns the .rec/.idx paths."""
    writer = recordio.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "w")
    for i, (label, data) in enumerate(payloads):
        writer.write_idx(i, recordio.pack(recordio.IRHeader(0, label, i, 0), data))
    writer.close()
    return prefix + ".rec", prefix + ".idx"


def run_tool(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, env=venv_env())


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    out = tmp_path_factory.mktemp("planted")
    good = jpeg(photo(0))
    payloads = [
        (0, good),                                             # 0 healthy
        (1, jpeg(photo(1))),                                   # 1 healthy
        (2, good[:len(good) // 2]),                            # 2 truncated
        (3, np.random.RandomState(3).bytes(500)),              # 3 garbage
        (4, b""),                                              # 4 empty payload
        (5, cv2.imencode(".png", photo(5))[1].tobytes()),      # 5 PNG (warning, re-encoded by --fix)
        (3.5, jpeg(photo(6))),                                 # 6 label not an integer
        (42, jpeg(photo(7))),                                  # 7 label out of range for 10 classes
        (8, jpeg(cv2.cvtColor(photo(8), cv2.COLOR_BGR2GRAY))),  # 8 grayscale JPEG (warning)
        (9, jpeg(photo(9, (20, 400)))),                        # 9 unusual size (warning)
    ]
    rec, idx = write_payloads(str(out / "planted"), payloads)
    size = os.path.getsize(rec)
    with open(idx) as f:
        first_offset = int(f.readline().split()[1])
    with open(idx, "a") as f:
        f.write(f"10\t{size + 1000}\n")          # 10 dangling: past the end of the file
        f.write(f"11\t{first_offset + 4}\n")     # 11 into the middle of record 0: does not parse
    return rec, idx


EXPECTED_ERRORS = {2: "truncated image", 3: "undecodable image", 4: "empty payload", 6: "bad label",
                   7: "bad label", 10: "dangling index entry", 11: "unreadable record"}
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


@pytest.mark.slow  # a heavier in-process test (the fast lane stays under a minute)
def test_cli_reports_by_record_and_fix_output_passes(planted, tmp_path):
    rec, idx = planted
    result = run_tool(rec, "--num-classes", "10")
    assert result.returncode == 1
    for key, kind in EXPECTED_ERRORS.items():
        assert any(line.startswith(f"  record {key} ") for line in result.stdout.splitlines()), key
        assert f"error: {kind}:" in result.stdout
    assert "FAILED: 7 error(s)" in result.stdout

    fixed = str(tmp_path / "fixed.rec")
    result = run_tool(rec, "--num-classes", "10", "--fix", fixed)
    assert "5 records (1 re-encoded as JPEG" in result.stdout, result.stdout
    again = run_tool(fixed, "--num-classes", "10")
    assert again.returncode == 0, again.stdout
    assert "not a JPEG" not in again.stdout
    # MXNet reads the repaired copy: the healthy records and the re-encoded PNG, labels kept.
    reader = recordio.MXIndexedRecordIO(str(tmp_path / "fixed.idx"), fixed, "r")
    labels = [recordio.unpack(reader.read_idx(key))[0].label for key in sorted(reader.keys)]
    assert labels == [0, 1, 5, 8, 9]
    png_as_jpeg = recordio.unpack_img(reader.read_idx(2))[1]
    assert np.abs(png_as_jpeg.astype(int) - photo(5)).mean() < 3


def test_healthy_set_passes(digits_data):
    result = run_tool(str(digits_data / "val.rec"), "--num-classes", "10", "--jobs", "2")
    assert result.returncode == 0, result.stdout
    assert "classes: 10 (labels 0..9)" in result.stdout
    assert "OK: 0 error(s)" in result.stdout


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


def test_missing_file_is_a_one_line_error(tmp_path):
    result = run_tool(str(tmp_path / "nothing.rec"))
    assert result.returncode == 2
    assert result.stderr.startswith("check_dataset.py: error:") and "Traceback" not in result.stderr
