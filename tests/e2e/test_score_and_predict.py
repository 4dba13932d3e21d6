"""Scoring and prediction end to end: per-class results of two workers equal one worker's, the names saved with a
checkpoint printed by --mode pred, the ImageNet class list, evaluation queueing every device's forward."""
import csv
import json
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

from rn50kit.common import imagenet_classes
from rn50kit.scoring import predict, scoring
from rn50kit.training.distributed import Distributed
from support.datasets import photo_folder
from support.processes import LONG_HANG_S, ROOT, venv_env

pytestmark = pytest.mark.slow  # launches processes, trains end to end or builds heavy data


# --- 5: evaluation queues every device's forward before reading any result ----------------------------------

@pytest.mark.slow  # a heavier in-process test (the fast lane stays under a minute)
def test_evaluate_queues_every_devices_forward_before_reading(monkeypatch):
    """Found by the second review of the GPU paths (issue 21)."""
    events = []
    ctxs = [mx.cpu(0), mx.cpu(1)]

    def net(data):
        events.append(("forward", data.context))
        logits = mx.nd.zeros((data.shape[0], 10), ctx=data.context)
        logits[:, 3] = 1
        return logits

    real_asscalar, real_wait = mx.nd.NDArray.asscalar, mx.nd.NDArray.wait_to_read
    monkeypatch.setattr(mx.nd.NDArray, "asscalar", lambda self: events.append(("read",)) or real_asscalar(self))
    monkeypatch.setattr(mx.nd.NDArray, "wait_to_read", lambda self: events.append(("read",)) or real_wait(self))
    batch = mx.io.DataBatch(data=[mx.nd.ones((4, 3, 8, 8))], label=[mx.nd.array([3, 3, 1, 3])], pad=0)
    metrics = scoring.evaluate(net, [batch, batch], ctxs, Distributed(None))
    assert metrics["top1"] == pytest.approx(0.75) and metrics["samples"] == 8
    first_read = events.index(("read",))
    assert events[:first_read] == [("forward", ctxs[0]), ("forward", ctxs[1])]
    events.clear()
    scoring.evaluate(net, [batch], ctxs, Distributed(None), no_metrics=True)
    assert events[:2] == [("forward", ctxs[0]), ("forward", ctxs[1])]


@pytest.mark.slow  # launches a process
def test_printed_list_reads_as_class_names(tmp_path):
    out = subprocess.run([sys.executable, "-m", "rn50kit.common.imagenet_classes"], cwd=ROOT, capture_output=True,
                         text=True, env=venv_env(), check=True).stdout
    (tmp_path / "classes.txt").write_text(out)
    assert predict.class_names(str(tmp_path / "classes.txt"), None) == imagenet_classes.names()


NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def run(command, timeout=LONG_HANG_S):
    result = subprocess.run(command, env=venv_env(), capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def named_run(digits_data, tmp_path_factory):
    """A short training on the digits with a classes.txt beside the records (as tools/prepare_folder.py leaves
    it): a checkpoint whose state holds the names."""
    out = tmp_path_factory.mktemp("named")
    data_dir = out / "data"
    os.makedirs(data_dir)
    for name in ("train.rec", "train.idx", "val.rec", "val.idx"):
        os.symlink(digits_data / name, data_dir / name)
    (data_dir / "classes.txt").write_text("\n".join(NAMES) + "\n")
    d = str(data_dir)
    common = ["--data-backend", "dali-cpu", "--dali-threads", "1", "--dali-validation-threads", "1",
              "--data-val", f"{d}/val.rec", "--batch-size", "64"]
    run([sys.executable, os.path.join(ROOT, "train.py"), *common, "--data-train", f"{d}/train.rec",
         "--num-layers", "18", "--num-classes", "10", "--image-shape", "3,32,32", "--data-val-resize", "32",
         "--random-mirror", "0", "--min-random-area", "0.5", "--num-epochs", "2", "--lr", "0.2",
         "--warmup-epochs", "1", "--seed", "3", "--workspace", str(out / "run")])
    return out, common


def load(path):
    with open(path) as f:
        return json.load(f)


def test_two_workers_score_each_class_as_one_worker(named_run):
    out, common = named_run
    weights = str(out / "run" / "model-0002.params")
    score = [sys.executable, os.path.join(ROOT, "train.py"), "--mode", "val", "--load", weights, *common]
    one = run(score + ["--report", str(out / "one.json")])  # one worker: oneDNN's fused graph
    run(["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", *score, "--report", str(out / "two.json")])
    trained, one_report, two_report = (load(out / name) for name in ("run/report.json", "one.json", "two.json"))
    assert two_report["ngpus"] == 2 and one_report["ngpus"] == 1
    per_class = one_report["per_class"]
    assert per_class["classes"] == NAMES and sum(per_class["samples"]) == 359  # every validation image once
    assert 0 < sum(per_class["correct"]) < 359
    predicted = np.asarray(per_class["confusion"]).sum(axis=0)
    assert (predicted > 0).sum() >= 3, per_class  # a network that tells classes apart, not one answer for all
    del per_class["epoch"], two_report["per_class"]["epoch"], trained["per_class"]["epoch"]  # passes vs epochs
    assert two_report["per_class"] == per_class  # counts, per-class top-1, matrix and pairs: exact over workers
    assert trained["per_class"] == per_class  # the training run's own validation of the same weights
    assert abs(sum(per_class["correct"]) / 359 - one_report["metrics"]["val.top1"][0]) < 1e-12
    assert "Per-class results" in one.stdout and os.path.isfile(out / "one-confusion.png")


def test_pred_prints_the_names_saved_with_the_checkpoint(named_run, digits_data):
    out, _ = named_run
    folder = digits_data / "raw" / "val" / "4"
    result = run([sys.executable, os.path.join(ROOT, "train.py"), "--mode", "pred", "--load",
                  str(out / "run" / "model-best.params"), "--data-pred", str(folder / sorted(os.listdir(folder))[0])])
    names = [line.rsplit("-> ", 1)[1] for line in result.stdout.splitlines() if "% -> " in line]
    assert len(names) == 5 and set(names) <= set(NAMES), result.stdout


def test_flip_tta_scores_the_same_over_two_workers_as_over_one(named_run):
    out, common = named_run
    score = [sys.executable, os.path.join(ROOT, "train.py"), "--mode", "val", "--load",
             str(out / "run" / "model-0002.params"), *common]
    run(score + ["--report", str(out / "plain.json")])
    run(score + ["--val-tta", "flip", "--report", str(out / "flip-one.json")])
    run(["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", *score, "--val-tta", "flip",
         "--report", str(out / "flip-two.json")])
    plain, one, two = (load(out / name) for name in ("plain.json", "flip-one.json", "flip-two.json"))
    assert one["ngpus"] == 1 and two["ngpus"] == 2
    for report in (plain, one, two):
        assert sum(report["per_class"]["samples"]) == 359  # every validation image once, none twice
    for key in ("val.top1", "val.top5"):
        assert one["metrics"][key] == pytest.approx(two["metrics"][key], abs=1e-12), key
    assert one["metrics"]["val.loss"] == pytest.approx(two["metrics"]["val.loss"], rel=1e-5)
    assert one["per_class"]["confusion"] == two["per_class"]["confusion"]
    # the flag applied: a network trained without mirroring scores its images' mirrors otherwise
    assert one["metrics"]["val.loss"] != pytest.approx(plain["metrics"]["val.loss"], rel=1e-4)
    assert one["per_class"]["confusion"] != plain["per_class"]["confusion"]


def test_pred_over_a_folder_writes_a_row_per_image_and_names_the_corrupt_one(named_run, tmp_path):
    out, _ = named_run
    photos = photo_folder(tmp_path / "photos")
    predict_command = [sys.executable, os.path.join(ROOT, "train.py"), "--mode", "pred", "--load",
                       str(out / "run" / "model-best.params"), "--workspace", str(tmp_path)]
    result = run(predict_command + ["--data-pred", str(photos), "--pred-out", str(tmp_path / "out.csv")])
    assert "Traceback" not in result.stderr
    with open(tmp_path / "out.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    found = sorted(str(p) for p in photos.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    assert [row["path"] for row in rows] == found  # nested, PNG and grayscale ones too; the text file left out
    broken = str(photos / "a" / "broken.jpg")
    assert [row["path"] for row in rows if row["error"]] == [broken]
    warnings = [line for line in result.stderr.splitlines() if broken in line]
    assert len(warnings) == 1 and "left out" in warnings[0], result.stderr[-2000:]
    gray = str(photos / "b" / "gray.jpg")
    alone = run(predict_command + ["--data-pred", gray]).stdout  # the one-image path, as printed
    printed = [line.rsplit("-> ", 1)[1] for line in alone.splitlines() if "% -> " in line]
    row = rows[found.index(gray)]
    assert printed[:3] == [row[f"name_{k}"] for k in range(1, 4)] and set(printed) <= set(NAMES)


def test_pred_writes_where_the_user_stands_and_beside_its_checkpoint(named_run, tmp_path):
    """Issue 58: own-images.md's `--pred-out runs/digits/predictions.csv` landed in
    runs/resnet50_v1.5/runs/digits/, and a ResNet-18 checkpoint's default predictions under runs/resnet50_v1.5.
    A relative --pred-out is from the current directory; the default goes beside the checkpoint."""
    out, _ = named_run
    photo_folder(tmp_path / "photos")
    checkpoint_dir = tmp_path / "ck"
    checkpoint_dir.mkdir()
    for path in (out / "run").iterdir():  # the ResNet-18 run's checkpoints, where the user keeps them
        os.symlink(path, checkpoint_dir / path.name)
    predict_command = [sys.executable, os.path.join(ROOT, "train.py"), "--mode", "pred", "--load",
                       "ck/model-best.params", "--data-pred", "photos"]
    typed = subprocess.run(predict_command + ["--pred-out", "preds/digits.csv"], cwd=tmp_path, env=venv_env(),
                           capture_output=True, text=True, timeout=LONG_HANG_S)
    assert typed.returncode == 0 and "Traceback" not in typed.stderr, typed.stderr[-2000:]
    assert (tmp_path / "preds" / "digits.csv").is_file()
    default = subprocess.run(predict_command, cwd=tmp_path, env=venv_env(), capture_output=True, text=True,
                             timeout=LONG_HANG_S)
    assert default.returncode == 0, default.stderr[-2000:]
    assert (checkpoint_dir / "predictions.csv").is_file()
    assert not (tmp_path / "runs").exists()  # nothing under runs/resnet50_v1.5


def test_tta_and_other_data_scores_keep_the_plain_one_and_other_classes_warn(named_run, tmp_path):
    """Issue 58: --val-tta flip and another data set replaced model-0002.float32.score.json, which did not say TTA
    was used; scoring on data whose class names differ said nothing."""
    out, common = named_run
    checkpoint_dir = tmp_path / "ck"
    checkpoint_dir.mkdir()
    for path in (out / "run").iterdir():
        os.symlink(path, checkpoint_dir / path.name)
    other = tmp_path / "other"
    other.mkdir()
    for name in ("val.rec", "val.idx"):
        os.symlink(out / "data" / name, other / name)
    (other / "classes.txt").write_text("\n".join(reversed(NAMES)) + "\n")
    score = [sys.executable, os.path.join(ROOT, "train.py"), "--mode", "val", "--load",
             str(checkpoint_dir / "model-0002.params"), *common]
    scored = run(score)
    run(score + ["--val-tta", "flip"])
    elsewhere = run([str(other / "val.rec") if arg.endswith("data/val.rec") else arg for arg in score])
    plain, flip = (load(checkpoint_dir / f"model-0002.float32{tag}.score.json") for tag in ("", ".flip"))
    assert plain["info"]["val_tta"] == "none" and flip["info"]["val_tta"] == "flip"
    assert plain["metrics"]["val.loss"] != flip["metrics"]["val.loss"]
    on_other = list(checkpoint_dir.glob("model-0002.float32.on-other-*.score.json"))
    assert len(on_other) == 1 and load(on_other[0])["info"]["data_val"] == str(other / "val.rec")
    warned = [line for line in elsewhere.stderr.splitlines() if "are not those" in line]
    assert len(warned) == 1 and "0: nine here, zero in training" in warned[0], elsewhere.stderr[-2000:]
    # the summary line shows the latency percentiles the README promises, the report's (seconds per batch)
    summary = next(line for line in scored.stderr.splitlines() if "Pass 1:" in line)
    latency = ", ".join(f"p{p} {plain['metrics'][f'val.latency_{p}'][0] * 1000:.1f} ms" for p in (50, 90, 99))
    assert f"latency per batch {latency}" in summary, summary


def test_two_workers_predict_a_folder_into_one_file_every_image_once(named_run, tmp_path):
    """Issue 55, item 4: each of runner's workers predicted every image and wrote the same file. Now each predicts
    its share and rank 0 writes them all: the rows of one worker's file, in the same order."""
    out, _ = named_run
    photos = photo_folder(tmp_path / "photos")
    for k in range(5):  # 13 images in all: the shares are not equal
        (photos / "c").mkdir(exist_ok=True)
        os.symlink(photos / "5.png", photos / "c" / f"{k}.png")
    predict = ["--mode", "pred", "--load", str(out / "run" / "model-best.params"), "--data-pred", str(photos),
               "--workspace", str(tmp_path)]
    run([sys.executable, os.path.join(ROOT, "train.py"), *predict, "--pred-out", str(tmp_path / "one.csv")])
    two = run([sys.executable, os.path.join(ROOT, "runner"), "-n", "2", "-b", "2", *predict, "--pred-out",
               str(tmp_path / "two.csv")])
    assert "Traceback" not in two.stderr
    output = (two.stdout + two.stderr).splitlines()
    read = [line for line in output if "broken.jpg" in line and "left out" in line]
    assert len(read) == 1, output[-40:]  # each image read by one worker: the broken one's warning comes once

    def rows(name):
        with open(tmp_path / name, newline="") as f:
            return list(csv.DictReader(f))
    one_rows, two_rows = rows("one.csv"), rows("two.csv")
    found = sorted(str(p) for p in photos.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    assert len(found) == 13 and [row["path"] for row in two_rows] == found  # every image once, in order
    assert [row["error"] for row in two_rows] == [row["error"] for row in one_rows]
    assert [row["name_1"] for row in two_rows] == [row["name_1"] for row in one_rows]
    for mine, theirs in zip(two_rows, one_rows):
        if not mine["error"]:
            assert float(mine["probability_1"]) == pytest.approx(float(theirs["probability_1"]), rel=1e-4)
    assert not list(tmp_path.glob("*.tmp"))


def test_pred_over_a_folder_refuses_a_gif_and_a_truncated_jpeg_as_the_packer_does(named_run, tmp_path):
    """Issue 58: a GIF in the folder was passed over without a word and a truncated JPEG was predicted; now each
    gets a row whose error is the reason tools/prepare_folder.py gives for leaving it out."""
    import io

    import prepare_folder
    from PIL import Image
    out, _ = named_run
    photos = photo_folder(tmp_path / "photos")
    gif = io.BytesIO()
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(gif, "GIF")
    (photos / "b" / "anim.gif").write_bytes(gif.getvalue())
    whole = (photos / "b" / "3.jpg").read_bytes()
    (photos / "b" / "cut.jpg").write_bytes(whole[:len(whole) // 2])
    run([sys.executable, os.path.join(ROOT, "train.py"), "--mode", "pred", "--load",
         str(out / "run" / "model-best.params"), "--data-pred", str(photos), "--pred-out", str(tmp_path / "p.csv")])
    with open(tmp_path / "p.csv", newline="") as f:
        errors = {os.path.relpath(row["path"], photos): row["error"] for row in csv.DictReader(f) if row["error"]}
    packer = {rel: "; ".join(f"{kind}: {detail}" for kind, detail in prepare_folder.check_image((str(photos), rel))[1])
              for rel in ("b/anim.gif", "b/cut.jpg", "a/broken.jpg")}
    assert errors == packer and errors["b/anim.gif"].startswith("unsupported image: GIF")
