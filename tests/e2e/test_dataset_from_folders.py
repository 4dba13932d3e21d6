"""tools/prepare_folder.py end to end: class folders to stratified, seeded train/val RecordIO with class names
and bad images named."""
import json
import os
import subprocess
import sys

import check_dataset
import cv2
import numpy as np
import prepare_folder
import pytest
from mxnet import recordio

from rn50kit.scoring import predict
from support.processes import ROOT, venv_env

pytestmark = pytest.mark.slow  # launches processes, trains end to end or builds heavy data


SCRIPT = os.path.join(ROOT, "tools", "prepare_folder.py")


# good images per class: cat 10 JPEG; dog 4 PNG + 2 grayscale JPEG; zebra 5 JPEG (+ one corrupt file)
GOOD = {"cat": 10, "dog": 6, "zebra": 5}


VAL_AT_0_2 = {"cat": 2, "dog": 1, "zebra": 1}  # round(n * 0.2), at least 1


def make_tree(root):
    rng = np.random.RandomState(0)
    colours = {"cat": (0, 0, 200), "dog": (0, 200, 0), "zebra": (200, 0, 0)}  # BGR

    def image(name):
        shape = (rng.randint(40, 70), rng.randint(40, 70), 3)
        return np.clip(np.array(colours[name]) + rng.randint(0, 50, size=shape), 0, 255).astype(np.uint8)

    for name in GOOD:
        (root / name).mkdir(parents=True)
    for i in range(10):
        cv2.imwrite(str(root / "cat" / f"c{i}.jpg"), image("cat"))
    for i in range(4):
        cv2.imwrite(str(root / "dog" / f"d{i}.png"), image("dog"))
    for i in range(2):
        cv2.imwrite(str(root / "dog" / f"gray{i}.JPEG"), cv2.cvtColor(image("dog"), cv2.COLOR_BGR2GRAY))
    for i in range(5):
        cv2.imwrite(str(root / "zebra" / f"z{i}.jpg"), image("zebra"))
    good = (root / "zebra" / "z0.jpg").read_bytes()
    (root / "zebra" / "broken.jpg").write_bytes(good[:len(good) // 2])  # cut short: no end-of-image marker
    (root / "cat" / "notes.txt").write_text("not an image")
    (root / "empty").mkdir()  # no images: not a class


def read_records(out, split):
    """[(index, label, payload image bytes)] of OUT/<split>.rec through its index, and the .lst rows."""
    record = recordio.MXIndexedRecordIO(str(out / f"{split}.idx"), str(out / f"{split}.rec"), "r")
    rows = []
    for key in record.keys:
        header, image = recordio.unpack(record.read_idx(key))
        rows.append((int(header.id), int(header.label), image))
    record.close()
    with open(out / f"{split}.lst") as f:
        lst = [line.rstrip("\n").split("\t") for line in f]
    return rows, {int(index): (int(label), path) for index, label, path in lst}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    base = tmp_path_factory.mktemp("folder")
    make_tree(base / "raw")
    result = subprocess.run([sys.executable, SCRIPT, str(base / "raw"), str(base / "out"), "--val-fraction", "0.2",
                             "--seed", "0", "--threads", "1", "--jobs", "1"],
                            capture_output=True, text=True, env=venv_env())
    assert result.returncode == 0, result.stderr + result.stdout
    return base, result


@pytest.mark.slow
def test_bad_image_is_named_and_left_out(prepared):
    base, result = prepared
    lines = [line for line in result.stdout.splitlines() if line.startswith("bad image")]
    assert len(lines) == 1 and lines[0].startswith("bad image, left out: zebra/broken.jpg: truncated image")
    summary = json.loads((base / "out" / "prepare.json").read_text())
    assert list(summary["bad_images"]) == ["zebra/broken.jpg"]
    assert summary["ignored_files"]["not images"] == ["cat/notes.txt"]
    for split in ("train", "val"):
        assert "broken.jpg" not in (base / "out" / f"{split}.lst").read_text()


@pytest.mark.slow
def test_split_is_stratified(prepared):
    base, _ = prepared
    names = ["cat", "dog", "zebra"]
    for split, expected in (("val", VAL_AT_0_2), ("train", {k: GOOD[k] - VAL_AT_0_2[k] for k in GOOD})):
        rows, _ = read_records(base / "out", split)
        counts = {name: sum(1 for _, label, _ in rows if label == i) for i, name in enumerate(names)}
        assert counts == expected, split
    summary = json.loads((base / "out" / "prepare.json").read_text())
    assert summary["per_class"] == {k: {"train": GOOD[k] - VAL_AT_0_2[k], "val": VAL_AT_0_2[k]} for k in GOOD}


@pytest.mark.slow
def test_record_labels_match_class_folders(prepared):
    """Each record's label is its image's class folder; JPEGs are packed byte for byte, PNGs as RGB JPEG."""
    base, _ = prepared
    raw, out = base / "raw", base / "out"
    names = (out / "classes.txt").read_text().splitlines()
    assert names == ["cat", "dog", "zebra"]
    seen = set()
    for split in ("train", "val"):
        rows, lst = read_records(out, split)
        labels = [label for _, label, _ in rows]
        assert labels != sorted(labels)  # shuffled, not in label order
        for index, label, image in rows:
            lst_label, path = lst[index]
            assert label == lst_label == names.index(path.split("/")[0])
            original = (raw / path).read_bytes()
            if path.endswith(".png"):
                assert image[:3] == b"\xff\xd8\xff"  # re-encoded as JPEG
                decoded = cv2.imdecode(np.frombuffer(image, np.uint8), cv2.IMREAD_COLOR)
                source = cv2.imdecode(np.frombuffer(original, np.uint8), cv2.IMREAD_COLOR)
                assert decoded.shape == source.shape  # the same picture (JPEG is lossy on noise: compare colours)
                assert np.abs(decoded.mean(axis=(0, 1)) - source.mean(axis=(0, 1))).max() < 3
            else:
                assert image == original
            seen.add(path)
    assert len(seen) == sum(GOOD.values())
    # the checker finds the output clean: no errors, no non-JPEG images, not in label order
    for split in ("train", "val"):
        report = check_dataset.check(str(out / f"{split}.rec"), str(out / f"{split}.idx"), 3, jobs=1)
        lines = []
        assert check_dataset.summarize(report, out=lines.append) == 0
        assert not any("not a JPEG" in line for line in lines)


@pytest.mark.slow
def test_class_names_are_read_as_predict_reads_them(prepared):
    base, _ = prepared
    out = base / "out"
    assert predict.class_names(str(out / "classes.txt"), None) == ["cat", "dog", "zebra"]
    assert predict.class_names(None, str(out / "train.rec")) == ["cat", "dog", "zebra"]  # from train.lst


@pytest.mark.slow
def test_lists_are_the_seeded_split(prepared):
    """The packed lists are split() of the good images with the seed given: a rerun gives the same files."""
    base, _ = prepared
    classes, _, _ = prepare_folder.find_images(str(base / "raw"))
    classes["zebra"].remove("zebra/broken.jpg")
    expected = prepare_folder.split(classes, 0.2, seed=0)
    for split in ("train", "val"):
        _, lst = read_records(base / "out", split)
        assert [lst[i] for i in range(len(lst))] == expected[split]
    other = prepare_folder.split(classes, 0.2, seed=1)
    assert sorted(label for label, _ in other["val"]) == sorted(label for label, _ in expected["val"])
    assert sorted(other["val"]) != sorted(expected["val"])


@pytest.mark.slow
def test_rerun_over_a_dataset_is_refused_and_force_rebuilds(prepared, tmp_path):
    """Issue 58: the command typed again over OUT is refused in one line, the records untouched; --force rebuilds."""
    base, _ = prepared
    out = tmp_path / "out"
    out.mkdir()
    for name in ("train.rec", "train.idx", "classes.txt"):
        (out / name).write_bytes((base / "out" / name).read_bytes())
    before = (out / "train.rec").read_bytes()
    command = [sys.executable, SCRIPT, str(base / "raw"), str(out), "--val-fraction", "0.2", "--threads", "1",
               "--jobs", "1"]
    refused = subprocess.run(command, capture_output=True, text=True, env=venv_env())
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "already holds a dataset" in refused.stderr and "Traceback" not in refused.stderr
    assert (out / "train.rec").read_bytes() == before and not (out / "val.rec").exists()
    forced = subprocess.run(command + ["--force"], capture_output=True, text=True, env=venv_env())
    assert forced.returncode == 0, forced.stderr
    assert (out / "val.rec").exists() and (out / "prepare.json").exists()
