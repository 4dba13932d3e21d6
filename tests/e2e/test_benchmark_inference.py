"""Inference benchmarks on real RecordIO data: fresh weights and --load, -i timed batches (the validation set
cycled), and what the sweep's JSON records. Real runner, horovodrun, DALI and MXNet on the CPU."""
import json
import os
import subprocess

import cv2
import mxnet as mx
import numpy as np
import pytest

import models
import train
from rn50kit.benchmarking.runs import run_settings
from rn50kit.config import train_config
from rn50kit.data import loaders
from rn50kit.scoring import scoring
from rn50kit.training import distributed
from support.datasets import write_record_file
from support.processes import HANG_S, ROOT, run_benchmark, venv_env

pytestmark = pytest.mark.slow  # launches processes or trains end to end


TINY_MODEL = ["--dtype", "float32", "--num-layers", "18", "--image-shape", "3,32,32", "--num-classes", "5",
              "--data-val-resize", "36"]


VAL_COUNT = 10  # with batch 4: 3 batches, the last padded


def users_images(count, seed):
    """Class-sorted labels, mixed sizes and aspect ratios, some grayscale scans."""
    rng = np.random.RandomState(seed)
    images = []
    for i in range(count):
        shape = (30 + 7 * (i % 4), 44 - 5 * (i % 3))
        image = rng.randint(0, 255, size=shape + (3,), dtype=np.uint8)
        images.append(cv2.cvtColor(image, cv2.COLOR_BGR2GRAY) if i % 3 == 0 else image)
    return images, [i * 5 // count for i in range(count)]


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("recordio")
    write_record_file(str(root / "train"), *users_images(16, 0))
    write_record_file(str(root / "val"), *users_images(VAL_COUNT, 1))
    return root


@pytest.fixture(scope="module")
def checkpoint(data_root, tmp_path_factory):
    """The .params of a tiny training run on the same records."""
    workspace = tmp_path_factory.mktemp("trained")
    result = subprocess.run([os.path.join(ROOT, "runner"), "-n", "1", "-b", "4", "-e", "1", "--mode", "train",
                             "--data-root", str(data_root), "--workspace", str(workspace), "--num-examples", "8",
                             *TINY_MODEL], env=venv_env(), capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stderr[-3000:]
    params = workspace / "model-0001.params"
    assert params.is_file(), sorted(os.listdir(workspace))
    return params


def sweep(tmp_path, data_root, *extra, iters=5, ngpus="1"):
    out = tmp_path / "infer.json"
    result = run_benchmark("-n", ngpus, "-b", "4", "-i", str(iters), "--only-inference", "-o", str(out),
                           "--data-root", str(data_root), *TINY_MODEL, *extra)
    assert result.returncode == 0, result.stderr[-3000:]
    return result, json.loads(out.read_text()), out


def check_real_data_cell(data, out, data_root, iters, backend, n=1):
    assert data["real_data"] is True and data["data_backend"] == backend
    assert data["data"]["val"] == str(data_root / "val.rec")
    assert data["dtype"] == "float32" and data["layout"] == {"input": "NCHW", "conv": "NCHW"}
    cell = data["metrics"][str(n)]["4"]
    assert cell["val.total_ips"] > 0 and cell["val.timed_iters"] == iters == data["timed_iters"]
    report = json.loads(out.with_name(f"infer-{n},4.json").read_text())
    # -i counts timed batches: the run was asked for the warmup ones on top (a worker's share of the
    # validation set is 3 batches or fewer: it was cycled)
    cmd = report["cmd"]
    assert int(cmd[cmd.index("--benchmark-iters") + 1]) == cell["untimed_iters"] + iters  # 20 or more: reruns
    assert cell["untimed_iters"] >= data["warmup_iters"] == 20
    assert report["metrics"]["val.timed_iters"] == [iters]
    assert cell["val.total_ips"] == pytest.approx(4 * n / cell["val.latency_avg"])
    return report


def test_real_data_fresh_weights(tmp_path, data_root):
    iters = 5
    result, data, out = sweep(tmp_path, data_root, iters=iters, ngpus="1,2")  # 2 workers: a shard each
    for n in (1, 2):
        report = check_real_data_cell(data, out, data_root, iters, "dali-cpu", n)  # runner's default on a CPU
        assert report["weights"] == "fresh"
    assert data["weights"] == "fresh" and not data["failed"]
    assert "fresh weights" in result.stdout and "real data (dali-cpu)" in result.stdout
    # the JSON says what a reader needs to trust the number
    machine = data["machine"]
    assert machine["cpu"] and machine["cpu_cores_usable"] == len(os.sched_getaffinity(0))
    assert data["versions"]["mxnet"].endswith(mx.__version__) and data["versions"]["horovod"]
    assert data["versions"]["dali"]
    run = data["runs"]["1"]["4"]
    assert run["runner"][0].startswith(os.path.join(ROOT, "runner") + " -n 1 -b 4 ")
    assert "--data-root " + str(data_root) in run["runner"][0]
    assert "train.py" in run["command"] and run["env"]["OMP_NUM_THREADS"]
    assert out.with_suffix(".png").stat().st_size > 1000


def test_real_data_loaded_checkpoint(tmp_path, data_root, checkpoint):
    iters = 4
    result, data, out = sweep(tmp_path, data_root, "--load", str(checkpoint), "--data-backend", "mxnet",
                              iters=iters)
    report = check_real_data_cell(data, out, data_root, iters, "mxnet")
    assert data["weights"] == report["weights"] == str(checkpoint)
    assert f"weights {checkpoint}" in result.stdout


def test_the_report_names_the_image_shape_a_loaded_checkpoint_is_scored_at(checkpoint):
    # train.py takes the shape from the checkpoint when --image-shape is not typed; a flag typed wins
    command = f"python train.py --mode val --load {checkpoint} --data-backend dali-cpu"
    assert run_settings(command)["image_shape"] == "3,32,32"  # TINY_MODEL's, not train.py's 3,224,224
    assert run_settings(command + " --image-shape 3,40,40")["image_shape"] == "3,40,40"
    assert run_settings("python train.py --mode val")["image_shape"] == "3,224,224"


def test_a_missing_checkpoint_is_refused_before_any_run(tmp_path, data_root):
    result = run_benchmark("-n", "1", "-b", "4", "--only-inference", "-o", str(tmp_path / "x.json"),
                           "--data-root", str(data_root), "--load", str(tmp_path / "nope.params"), *TINY_MODEL,
                           timeout=HANG_S)
    assert result.returncode == 2 and "nope.params does not exist" in result.stderr
    assert result.stderr.count("\n") == 1 and not (tmp_path / "x.json").exists()


# --- scoring.evaluate and fit.load_for_scoring in process ----------------------------------------------------------

class CountingIterator:
    """The real validation iterator, counting the batches drawn from it."""

    def __init__(self, inner):
        self.inner = inner
        self.drawn = 0

    def __len__(self):
        return len(self.inner)

    def __iter__(self):
        iter(self.inner)
        return self

    def __next__(self):
        batch = next(self.inner)
        self.drawn += 1
        return batch


def val_args(data_root, workspace, *extra):
    return train.parse_args(
        ["--mode", "val", "--data-backend", "mxnet", "--batch-size", "4", "--data-val", str(data_root / "val.rec"),
         "--data-val-idx", str(data_root / "val.idx"), "--workspace", str(workspace), "--data-mxnet-threads", "1",
         *TINY_MODEL, *extra])


def test_evaluate_cycles_the_set_for_max_iters_and_counts_each_sample_once(data_root, tmp_path):
    args = val_args(data_root, tmp_path)
    args.no_metrics = False
    _, val_iter = loaders.get_data_iterators(train_config.from_args(args), 0, 1, 0, 1, mx.cpu())
    net = models.get_model_from_args(args)
    net.initialize(mx.init.Xavier())
    # reference: one pass, numpy top-1 over the valid rows
    logits, labels = [], []
    for batch in val_iter:
        valid = batch.data[0].shape[0] - batch.pad
        logits.append(net(batch.data[0]).asnumpy()[:valid])
        labels.append(batch.label[0].asnumpy()[:valid])
    logits, labels = np.concatenate(logits), np.concatenate(labels)
    assert len(labels) == VAL_COUNT
    expected_top1 = float(np.mean(logits.argmax(axis=1) == labels))
    counting = CountingIterator(val_iter)
    metrics = scoring.evaluate(net, counting, [mx.cpu()], distributed.Distributed(None), args.dtype, max_iters=7)
    assert counting.drawn == 7 and len(metrics["durations"]) == 7  # 3 batches per pass: cycled twice and one
    assert metrics["samples"] == VAL_COUNT
    assert metrics["top1"] == pytest.approx(expected_top1)
    counting.drawn = 0
    one_process = distributed.Distributed(None)
    metrics = scoring.evaluate(net, counting, [mx.cpu()], one_process, args.dtype)  # a plain scoring pass
    assert counting.drawn == 3 and metrics["samples"] == VAL_COUNT
    assert metrics["top1"] == pytest.approx(expected_top1)
    counting.drawn = 0
    metrics = scoring.evaluate(net, counting, [mx.cpu()], one_process, args.dtype, max_iters=2)  # a shorter cap
    assert counting.drawn == 2 == len(metrics["durations"]) and metrics["samples"] == 8


def test_fresh_weights_only_where_no_accuracy_is_reported(data_root, tmp_path):
    args = val_args(data_root, tmp_path)
    with pytest.raises(scoring.ScoringError, match="no checkpoint to score.*--no-metrics"):
        scoring.load_weights(None, train_config.from_args(args).fit, args.data_backend, [mx.cpu()],
                             distributed.Distributed(None))
    args.no_metrics = True
    assert scoring.load_weights(None, train_config.from_args(args).fit, args.data_backend, [mx.cpu()],
                                distributed.Distributed(None)) is None
