"""--mode pred over many images (rn50kit/scoring/predict_many.py) on a real ResNet-18: a folder with nested
subfolders, images of mixed sizes, a grayscale JPEG, a PNG and a corrupt file gives one row per image, each the
top-k of scoring that image alone through the one-image path (predict.predict, as printed), the corrupt file
named with its error; a list file and a glob name the same images; JSON by the output's suffix."""
import contextlib
import csv
import io
import json
import re

import numpy as np
import pytest

from rn50kit.config import train_config
from rn50kit.scoring import predict, predict_many, scoring
from support.datasets import photo_folder
from support.loop import CPU
from support.networks import built

NUM_CLASSES, TOP = 1000, 3  # conftest.built's ResNet-18
NAMES = [f"class{i}" for i in range(NUM_CLASSES)]


@pytest.fixture(scope="module")
def net():
    return built(18, 32)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return photo_folder(tmp_path_factory.mktemp("photos"))


def config(workspace, data_pred, pred_out=None, batch=4):
    return train_config.RunConfig().replace(
        data__image_shape=(3, 32, 32), data__data_val_resize=36, model__num_classes=NUM_CLASSES,
        fit__dtype="float32", fit__batch_size=batch, fit__workspace=str(workspace), fit__disp_batches=1,
        predict__data_pred=str(data_pred), predict__pred_out=pred_out, predict__pred_top_k=TOP)


def names_file(tmp_path):
    path = tmp_path / "names.txt"
    path.write_text("\n".join(NAMES) + "\n")
    return str(path)


def one_by_one(net, cfg, path):
    """The one-image path for ``path``: what it returns [(probability, index, name)] and the names it prints."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        top = scoring.predict_image(cfg.replace(predict__data_pred=str(path)), scoring.Scorable(net), CPU)
    return top, re.findall(r"^\d\. +[\d.]+% -> (\S+)$", printed.getvalue(), re.M)


def test_a_folder_gives_the_rows_of_scoring_each_image_alone(net, photos, tmp_path, caplog):
    cfg = config(tmp_path, photos).replace(predict__class_names=names_file(tmp_path))
    scoring.predict_image(cfg, scoring.Scorable(net), CPU)
    with open(tmp_path / "predictions.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    found = sorted(str(p) for p in photos.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    assert [row["path"] for row in rows] == found  # every image, nested ones too, the text file left out
    broken = str(photos / "a" / "broken.jpg")
    assert [row["path"] for row in rows if row["error"]] == [broken]
    assert rows[found.index(broken)]["error"] == \
        "truncated image: JPEG of 22 bytes has no end-of-image marker" and rows[found.index(broken)]["name_1"] == ""
    assert any(broken in message and "left out" in message for message in caplog.messages)
    for row in rows:
        if row["error"]:
            continue
        alone, printed = one_by_one(net, cfg, row["path"])
        assert [row[f"name_{k}"] for k in range(1, TOP + 1)] == [name for _, _, name in alone] == printed
        np.testing.assert_allclose([float(row[f"probability_{k}"]) for k in range(1, TOP + 1)],
                                   [probability for probability, _, _ in alone], rtol=1e-5)


def test_a_list_a_glob_and_json_name_the_same_predictions(net, photos, tmp_path):
    listed = tmp_path / "images.txt"
    listed.write_text(f"{photos}/b/3.jpg\n\n# a comment\n{photos}/a/deep/2.png\n{photos}/missing.jpg\n")
    rows = scoring.predict_image(config(tmp_path, listed, str(tmp_path / "out.json"), batch=2), scoring.Scorable(net),
                                 CPU)
    saved = json.load(open(tmp_path / "out.json"))
    assert [row["path"] for row in saved] == [f"{photos}/b/3.jpg", f"{photos}/a/deep/2.png", f"{photos}/missing.jpg"]
    assert saved[2]["error"] and saved[2]["top"] == []
    assert [[(t["probability"], t["class"], t["name"]) for t in row["top"]] for row in saved] == \
        [row["top"] for row in rows]
    globbed = scoring.predict_image(config(tmp_path, f"{photos}/**/*.png", str(tmp_path / "png.csv")),
                                    scoring.Scorable(net), CPU)
    assert [row["path"] for row in globbed] == [f"{photos}/5.png", f"{photos}/a/deep/2.png"]
    by_path = {row["path"]: row["top"] for row in rows}
    deep = by_path[f"{photos}/a/deep/2.png"]
    np.testing.assert_allclose([p for p, _, _ in globbed[1]["top"]], [p for p, _, _ in deep], rtol=1e-5)


def test_workers_that_see_other_images_are_refused_in_one_line(photos):
    """Several workers share the images by their places in the list: a worker that sees another list would leave
    some out and repeat others. Each rank's count and checksum of the list, as Distributed.gather gives them."""
    paths = predict_many.image_paths(str(photos))

    class Seen:  # the two ranks' views as the collective returns them
        def __init__(self, other):
            self.other = other

        def gather(self, values, name):
            return [values, self.other(values)]
    predict_many.check_same_images(paths, str(photos), Seen(lambda values: list(values)))
    with pytest.raises(predict_many.NoImages) as refused:
        predict_many.check_same_images(paths, str(photos), Seen(lambda values: [values[0] - 1, 7]))
    assert str(refused.value) == (f"--data-pred {photos} names other images on different workers (rank 0: "
                                  f"{len(paths)}, rank 1: {len(paths) - 1} images): give every worker the same "
                                  "files (a shared folder)")


def test_bad_input_is_one_line(tmp_path):
    with pytest.raises(predict_many.NoImages, match="names no image"):
        predict_many.image_paths(str(tmp_path / "nowhere" / "*.jpg"))
    with pytest.raises(ValueError, match="give a .csv or a .json"):
        predict.check_pred_args(str(tmp_path), "out.xlsx")
    with pytest.raises(ValueError, match="does not exist"):
        predict.check_pred_args(str(tmp_path / "none.jpg"))
    predict.check_pred_args("photos/*.jpg")  # a glob is checked when it is expanded
