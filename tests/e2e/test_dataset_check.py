"""tools/check_dataset.py's command line on RecordIO files with planted faults, and --fix's clean copy."""
import numpy as np
import pytest
from mxnet import recordio

from support.datasets import EXPECTED_ERRORS, photo, run_tool

pytestmark = pytest.mark.slow  # launches processes, trains end to end or builds heavy data


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
