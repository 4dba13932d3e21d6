"""tools/prepare_folder.py's split in process: counts, seeded and stratified, refusals."""
import prepare_folder
import pytest

# ---------------------------------------------------------------------------------------------------------
# the parts that need no im2rec

def test_split_counts():
    assert [prepare_folder.split_counts(n, 0.2) for n in (1, 2, 5, 6, 10, 12)] == [0, 1, 1, 1, 2, 2]
    assert prepare_folder.split_counts(13, 0.1) == 1 and prepare_folder.split_counts(15, 0.1) == 2  # 1.5 rounds up
    assert prepare_folder.split_counts(3, 0.9) == 2  # one training image is always kept
    assert prepare_folder.split_counts(10, 0.0) == 0


def test_split_is_seeded_and_stratified():
    classes = {"a": [f"a/{i}" for i in range(10)], "b": [f"b/{i}" for i in range(4)]}
    first = prepare_folder.split(classes, 0.25, seed=3)
    assert first == prepare_folder.split(classes, 0.25, seed=3)
    assert sorted(label for label, _ in first["val"]) == [0, 0, 0, 1]  # round(2.5) = 3, round(1.0) = 1
    assert sorted(first["train"] + first["val"]) == sorted((label, p) for label, paths in enumerate(classes.values())
                                                           for p in paths)


def test_refusals(tmp_path):
    (tmp_path / "raw").mkdir()
    with pytest.raises(prepare_folder.PrepareError, match="no class folders with images"):
        prepare_folder.prepare(str(tmp_path / "raw"), str(tmp_path / "out"))
    with pytest.raises(prepare_folder.PrepareError, match="must not be inside ROOT"):
        prepare_folder.prepare(str(tmp_path / "raw"), str(tmp_path / "raw" / "out"))
    with pytest.raises(prepare_folder.PrepareError, match="--val-fraction"):
        prepare_folder.prepare(str(tmp_path / "raw"), str(tmp_path / "out"), val_fraction=1.0)
    (tmp_path / "raw" / "a").mkdir()
    (tmp_path / "raw" / "a" / "x.jpg").write_bytes(b"garbage")
    with pytest.raises(prepare_folder.PrepareError, match="a have no readable image"):
        prepare_folder.prepare(str(tmp_path / "raw"), str(tmp_path / "out"), log=lambda line: None)
    assert prepare_folder.main([str(tmp_path / "missing"), str(tmp_path / "out")]) == 1


def test_a_folder_holding_a_dataset_is_refused_unless_forced(tmp_path, capsys):
    """Issue 58: OUT with another dataset's records was replaced without a word; now one line, nothing touched."""
    (tmp_path / "raw" / "a").mkdir(parents=True)
    (tmp_path / "raw" / "a" / "x.jpg").write_bytes(b"garbage")
    out = tmp_path / "out"
    out.mkdir()
    (out / "train.rec").write_bytes(b"the digits")
    (out / "prepare.json").write_text('{"root": "/data/digits/raw"}')
    assert prepare_folder.main([str(tmp_path / "raw"), str(out)]) == 1
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "already holds a dataset (packed from /data/digits/raw)" in error
    assert "--force" in error and (out / "train.rec").read_bytes() == b"the digits"
    with pytest.raises(prepare_folder.PrepareError, match="no readable image"):  # --force goes on to the images
        prepare_folder.prepare(str(tmp_path / "raw"), str(out), log=lambda line: None, force=True)
    (out / "train.rec").unlink()
    (out / "prepare.json").unlink()
    with pytest.raises(prepare_folder.PrepareError, match="no readable image"):  # an empty OUT is fine
        prepare_folder.prepare(str(tmp_path / "raw"), str(out), log=lambda line: None)
