"""Per-class results and class names: the confusion matrix of a validation equals a numpy recount from the logits
(one device and two), the report keeps it and draws it, and the names travel from the data into the checkpoint and
on to --mode pred and val."""
import json
import os
import subprocess
import sys

import cv2
import mxnet as mx
import numpy as np
import pytest

from rn50kit.config import train_config
from rn50kit.data import loaders
from rn50kit.training import distributed
from rn50kit.common import imagenet_classes
from rn50kit.scoring import predict
from rn50kit.reporting import report as reports
from rn50kit.scoring import scoring
import train
from conftest import ROOT, venv_env

TWO = [mx.cpu(0), mx.cpu(1)]


def logits_recount(net, val_iter, ctxs, num_classes):
    """The confusion matrix from the logits themselves, read to numpy: argmax per valid row, counted by numpy."""
    matrix = np.zeros((num_classes, num_classes), dtype="int64")
    val_iter.reset()
    for batch in val_iter:
        datas, labels = scoring.split(batch, ctxs, "float32")
        for x, label, valid in zip(datas, labels, scoring.valid_counts(batch, [d.shape[0] for d in datas])):
            logits = net(x).asnumpy()[:valid]
            truth = label.asnumpy()[:valid].astype(int)
            for t, p in zip(truth, logits.argmax(axis=1)):
                matrix[t, p] += 1
    return matrix


@pytest.mark.parametrize("ctxs", [[mx.cpu(0)], TWO], ids=["one-device", "two-devices"])
def test_confusion_equals_a_numpy_recount_of_the_logits(unique_label_rec, ctxs):
    rec, idx, count = unique_label_rec  # labels 0..52, one sample each; batches end in padding
    args = train.parse_args(
        ["--data-backend", "dali-cpu", "--data-val", rec, "--data-val-idx", idx, "--batch-size", "8",
         "--image-shape", "3,16,16", "--data-val-resize", "16", "--dali-validation-threads", "1", "--seed", "1"])
    val_iter = loaders.get_data_iterators_per_device(train_config.from_args(args), 0, 1, 0, 1, ctxs)[1]
    net = mx.gluon.nn.Dense(count, in_units=3 * 16 * 16, flatten=True)
    # Seeded, whatever ran before in this process: a random network is right about one of the 53 samples on
    # average and about none a third of the time (seed 2 here); seed 1's is right about some.
    mx.random.seed(1)
    net.initialize(mx.init.Normal(0.05), ctx=ctxs)
    metrics = scoring.evaluate(net, val_iter, ctxs, distributed.Distributed(None), "float32")
    confusion = metrics["confusion"]
    assert confusion.shape == (count, count) and confusion.sum() == count == metrics["samples"]
    np.testing.assert_array_equal(confusion, logits_recount(net, val_iter, ctxs, count))
    assert np.trace(confusion) == metrics["correct1"]
    assert 0 < metrics["correct1"] < count  # a random network: some right, some wrong, so the test can tell
    per_class = reports.per_class_results(confusion, None, 1)
    assert per_class["samples"] == [1] * count and per_class["correct"] == np.diag(confusion).tolist()
    assert sum(n for _, _, n in per_class["confused_pairs"]) == count - metrics["correct1"]


def test_no_metrics_has_no_confusion(unique_label_rec):
    rec, idx, count = unique_label_rec
    args = train.parse_args(["--data-backend", "dali-cpu", "--data-val", rec, "--data-val-idx", idx, "--batch-size",
                             "16", "--image-shape", "3,16,16", "--data-val-resize", "16",
                             "--dali-validation-threads", "1"])
    val_iter = loaders.get_data_iterators_per_device(train_config.from_args(args), 0, 1, 0, 1, [mx.cpu()])[1]
    net = mx.gluon.nn.Dense(count, in_units=3 * 16 * 16, flatten=True)
    net.initialize(ctx=mx.cpu())
    assert scoring.evaluate(net, val_iter, [mx.cpu()], distributed.Distributed(None), no_metrics=True)[
        "confusion"] is None


def test_per_class_results_and_report_round_trip(tmp_path):
    confusion = np.array([[5, 1, 0], [2, 3, 0], [0, 0, 0]])
    per_class = reports.per_class_results(confusion, ["cat", "dog", "zebra"], 4)
    assert per_class["samples"] == [6, 5, 0] and per_class["correct"] == [5, 3, 0]
    assert per_class["top1"] == [5 / 6, 3 / 5, None]  # a class without validation images has no top-1
    assert per_class["confused_pairs"] == [[1, 0, 2], [0, 1, 1]]
    assert per_class["confusion"] == confusion.tolist()
    report = reports.Report("resnet", 1, ["x"], {"val.top1": [0.7]}, info={"class_names": ["cat", "dog", "zebra"]})
    report.add_per_class(confusion, 4)
    report.save(str(tmp_path / "r.json"))
    loaded = reports.Report.load(str(tmp_path / "r.json"))
    assert loaded.per_class == json.loads(json.dumps(per_class))
    summary = loaded.summary()
    assert "dog 0.600 (3/5)" in summary and "dog -> cat x2" in summary


def test_many_classes_keep_the_whole_matrix_as_pairs():
    rng = np.random.RandomState(0)
    classes = reports.DENSE_CONFUSION_MAX + 20
    confusion = rng.poisson(0.05, size=(classes, classes)) + np.diag(rng.randint(0, 9, classes))
    per_class = reports.per_class_results(confusion, None, 2)
    assert per_class["confusion"] is None  # too big to hold as rows in the JSON
    np.testing.assert_array_equal(reports.confusion_from(per_class), confusion)
    counts = [n for _, _, n in per_class["confused_pairs"]]
    assert counts == sorted(counts, reverse=True) and all(counts)


@pytest.mark.parametrize("classes", [3, reports.PNG_MATRIX_MAX + 5])
def test_confusion_png_and_plot_report(tmp_path, classes):
    rng = np.random.RandomState(1)
    confusion = rng.randint(0, 4, size=(classes, classes)) + np.diag(np.full(classes, 20))
    report = reports.Report("resnet", 1, [], {"val.top1": [0.5, 0.8]})
    report.add_per_class(confusion, 2, [f"class {i}" for i in range(classes)])
    path = str(tmp_path / "report.json")
    report.save(path)
    result = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "plot_report.py"), path], env=venv_env(),
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    png = str(tmp_path / "report-confusion.png")
    assert png in result.stdout.splitlines()
    image = cv2.imread(png)
    assert image is not None and image.shape[0] > 200 and image.std() > 0


def test_names_from_beside_the_records(tmp_path):
    rec = tmp_path / "train.rec"
    rec.write_bytes(b"")
    (tmp_path / "train.lst").write_text("0\t1.000000\tdog/a.jpg\n1\t0.000000\tcat/b.jpg\n")
    assert predict.dataset_class_names(str(rec)) == ["cat", "dog"]
    (tmp_path / "classes.txt").write_text("kitten\npuppy\n")  # tools/prepare_folder.py's file comes first
    assert predict.dataset_class_names(str(rec)) == ["kitten", "puppy"]
    assert predict.dataset_class_names(None, str(tmp_path / "val.rec")) == ["kitten", "puppy"]
    assert predict.dataset_class_names(str(tmp_path / "elsewhere" / "train.rec")) is None
    assert predict.training_class_names(None, str(rec), None, 2) == ["kitten", "puppy"]
    assert predict.training_class_names(None, str(rec), None, 3) is None  # another number of classes: not these


def test_imagenet_word_net_ids_become_names():
    assert predict.readable(list(imagenet_classes.SYNSETS)) == imagenet_classes.names()
    assert predict.readable(["n01443537", "n01440764"]) == ["goldfish", "tench"]  # a subset of ImageNet's folders
    assert predict.readable(["n01443537", "mine"]) == ["n01443537", "mine"]  # not all ids: kept as they are


def test_names_saved_with_a_checkpoint_come_first(tmp_path):
    (tmp_path / "m-0002.params").write_bytes(b"")
    (tmp_path / "m-0002.states").write_bytes(b"")
    state = {"epoch": 2, "step": 0, "files": {"params": "m-0002.params", "states": "m-0002.states"},
             "class_names": ["n01443537", "n01440764"]}
    (tmp_path / "m-0002.state.json").write_text(json.dumps(state))
    params = str(tmp_path / "m-0002.params")
    assert predict.checkpoint_class_names(params) == ["n01443537", "n01440764"]
    assert predict.class_names(None, None, params) == ["goldfish", "tench"]
    assert predict.class_names(None, None, str(tmp_path / "m-best.params")) == ["goldfish", "tench"]  # the run's
    other = tmp_path / "names.txt"
    other.write_text("a\nb\n")
    assert predict.class_names(str(other), None, params) == ["a", "b"]  # --class-names wins
    assert predict.class_names(None, None, params, num_classes=5) is None  # names of another head: not used


NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def run(command, timeout=900):
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
