"""quantize: the INT8 calibration line agrees with itself and shows a date."""


def test_the_int8_calibration_line_agrees_with_itself_and_shows_a_date(tmp_path):
    """Found by the second newcomer walk (issue 26)."""
    from rn50kit.scoring import quantize
    rec = tmp_path / "train.rec"
    rec.write_bytes(b"x" * 10)
    source = quantize.calibration_source("dali-cpu", str(rec))
    assert " UTC)" in source and "modified 20" in source
    calibration = dict(quantize.describe_calibration("naive", 10, 64, source), records=160, graph="g")
    line = quantize.summary(calibration)
    assert "on 160 training records (fewer than the 10 batches of 64 asked for: the data has 160)" in line
    assert "on 640 training records (10 batches of 64)" in quantize.summary(dict(calibration, records=640))
