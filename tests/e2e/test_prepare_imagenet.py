"""tools/prepare_imagenet.sh on a small class-folder tree; the pipelines read its output with the right labels."""
import os
import shutil
import subprocess
import sys

import cv2
import mxnet as mx
import numpy as np
import pytest

import train
from rn50kit.config import train_config
from rn50kit.data import loaders
from support.processes import ROOT, venv_env

pytestmark = pytest.mark.slow  # launches processes or trains end to end


SCRIPT = os.path.join(ROOT, "tools", "prepare_imagenet.sh")


# Sorted folder names give labels 0, 1, 2; each class is one dominant colour (RGB channel = label).
CLASSES = {"n01440764": (0, 0, 220), "n01443537": (0, 220, 0), "n01484850": (220, 0, 0)}  # BGR


def make_tree(root, per_class):
    rng = np.random.RandomState(0)
    for split, count in per_class.items():
        for name, bgr in CLASSES.items():
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                shape = (rng.randint(40, 70), rng.randint(40, 70), 3)
                image = np.clip(np.array(bgr) + rng.randint(0, 30, size=shape), 0, 255).astype(np.uint8)
                cv2.imwrite(str(folder / f"{name}_{i}.JPEG"), image)


def prepare(raw, out):
    env = dict(venv_env(), PYTHON=sys.executable)
    return subprocess.run([SCRIPT, str(raw), str(out)], capture_output=True, text=True, env=env)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("prep")
    make_tree(root / "raw", {"train": 4, "val": 3})
    result = prepare(root / "raw", root / "out")
    assert result.returncode == 0, result.stderr
    return root


@pytest.mark.parametrize("backend", ["dali-cpu", "mxnet"])
def test_pipelines_read_prepared_records_with_right_labels(prepared, backend):
    out = prepared / "out"
    args = train.parse_args([
        "--data-backend", backend, "--data-train", str(out / "train.rec"), "--data-train-idx", str(out / "train.idx"),
        "--data-val", str(out / "val.rec"), "--data-val-idx", str(out / "val.idx"), "--batch-size", "4",
        "--image-shape", "3,32,32", "--data-val-resize", "36", "--rgb-mean", "0,0,0", "--rgb-std", "1,1,1",
        "--dali-threads", "1", "--dali-validation-threads", "1", "--data-mxnet-threads", "1", "--seed", "1"])
    train_iter, val_iter = loaders.get_data_iterators(train_config.from_args(args), 0, 1, 0, 1, mx.cpu())
    for iterator, expected in ((val_iter, 9), (train_iter, 12)):
        seen = 0
        for batch in iterator:
            valid = 4 - batch.pad
            images = batch.data[0].asnumpy()[:valid]
            labels = batch.label[0].asnumpy()[:valid].astype(int)
            np.testing.assert_array_equal(images.mean(axis=(2, 3)).argmax(axis=1), labels)
            seen += valid
        assert seen == expected


def test_rerun_is_safe_and_keeps_outputs(prepared):
    out = prepared / "out"
    before = {name: os.path.getmtime(out / name) for name in ("train.rec", "val.rec", "val.idx")}
    result = prepare(prepared / "raw", out)
    assert result.returncode == 0, result.stderr
    assert "train.rec (12 records), val.rec (9 records)" in result.stdout
    assert before == {name: os.path.getmtime(out / name) for name in before}


def test_wrong_arguments_print_usage(tmp_path):
    result = subprocess.run([SCRIPT, str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 2 and "usage:" in result.stderr


def test_missing_validation_class_is_refused(tmp_path):
    make_tree(tmp_path / "raw", {"train": 1, "val": 1})
    shutil.rmtree(tmp_path / "raw" / "val" / "n01443537")
    result = prepare(tmp_path / "raw", tmp_path / "out")
    assert result.returncode == 1
    assert "error: the class folders" in result.stderr and "n01443537" in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_flat_validation_folder_is_named_with_the_way_to_sort_it(tmp_path):
    make_tree(tmp_path / "raw", {"train": 2})
    (tmp_path / "raw" / "val").mkdir()
    for i in range(3):  # as ILSVRC2012_img_val.tar unpacks: no class folders
        cv2.imwrite(str(tmp_path / "raw" / "val" / f"ILSVRC2012_val_{i:08d}.JPEG"), np.zeros((8, 8, 3), np.uint8))
    result = prepare(tmp_path / "raw", tmp_path / "out")
    assert result.returncode == 1 and "holds 3 images directly, not in class folders" in result.stderr
    assert "valprep.sh" in result.stderr and "differ" not in result.stderr


def test_a_rerun_after_images_were_added_packs_them(tmp_path):
    make_tree(tmp_path / "raw", {"train": 2, "val": 1})
    first = prepare(tmp_path / "raw", tmp_path / "out")
    assert first.returncode == 0 and "train.rec (6 records), val.rec (3 records)" in first.stdout, first.stderr
    assert "n01440764" not in first.stdout  # im2rec's class listing goes to its log file
    name = next(iter(CLASSES))
    cv2.imwrite(str(tmp_path / "raw" / "train" / name / "added.JPEG"), np.zeros((8, 8, 3), np.uint8))
    again = prepare(tmp_path / "raw", tmp_path / "out")
    assert again.returncode == 0, again.stderr
    assert "[train] " + str(tmp_path / "raw" / "train") + " changed" in again.stdout
    assert "train.rec (7 records), val.rec (3 records)" in again.stdout
    unchanged = prepare(tmp_path / "raw", tmp_path / "out")
    assert "changed" not in unchanged.stdout and "packing" not in unchanged.stdout
