"""Two Horovod workers (Gloo) train on the real digits: they agree on every parameter and learn, and on a copy
stored in class order they reach one worker's accuracy."""
import json
import os
import subprocess
import sys
import cv2
import numpy as np
import pytest
from rn50kit.data import records
from conftest import ROOT, venv_env, write_record_file, digits_run, HANG_S, LONG_HANG_S, need_mpi, mpirun_root_env


pytestmark = pytest.mark.slow  # launches processes or trains end to end


SORTED_EPOCHS = 4


# Measured with this recipe (deterministic with --seed): one worker 0.947, two workers 0.964; two workers reading
# DALI's contiguous shards (the old reader) reached 0.911, which this margin fails. About 100 s of CPU in all.
MARGIN = 0.03


IMAGE = "16"


@pytest.fixture(scope="module")
def sorted_digits(digits_data, tmp_path_factory):
    digits = records.RecordFile(str(digits_data / "train.rec"), str(digits_data / "train.idx"))
    order = np.argsort(digits.labels, kind="stable")
    out = tmp_path_factory.mktemp("sorted_digits")
    images = [cv2.imdecode(digits.image(i), cv2.IMREAD_COLOR) for i in order]
    rec, idx = write_record_file(str(out / "train"), images, digits.labels[order])
    assert records.label_runs(records.RecordFile(rec, idx).labels)["ordered"]
    return rec, idx


def top1(workers, rec, idx, digits, workspace):
    command = [sys.executable, os.path.join(ROOT, "train.py"), "--data-backend", "dali-cpu", "--dali-threads", "1",
               "--dali-validation-threads", "1", "--data-train", rec, "--data-train-idx", idx,
               "--data-val", str(digits / "val.rec"), "--data-val-idx", str(digits / "val.idx"),
               "--num-layers", "18", "--num-classes", "10", "--image-shape", f"3,{IMAGE},{IMAGE}",
               "--data-val-resize", IMAGE, "--batch-size", "64", "--num-epochs", str(SORTED_EPOCHS), "--lr", "0.2",
               "--warmup-epochs", "1", "--random-mirror", "0", "--min-random-area", "0.5", "--seed", "3",
               "--workspace", str(workspace)]
    if workers > 1:
        command = ["horovodrun", "-np", str(workers), "-H", f"localhost:{workers}", "--gloo", *command]
    result = subprocess.run(command, env=venv_env(), capture_output=True, text=True, timeout=LONG_HANG_S)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with open(workspace / "report.json") as f:
        return json.load(f)["metrics"]["val.top1"][-1]


def test_two_workers_reach_one_worker_accuracy_on_a_class_sorted_file(sorted_digits, digits_data, tmp_path):
    one = top1(1, *sorted_digits, digits_data, tmp_path / "one")
    two = top1(2, *sorted_digits, digits_data, tmp_path / "two")
    assert one >= 0.8, one  # the recipe learns (chance is 0.1)
    assert two >= one - MARGIN, (one, two)


EPOCHS = 3


@pytest.fixture(scope="module")
def two_worker_run(digits_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("hvd")
    command = ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
               os.path.join(ROOT, "tests", "hvd_train_worker.py"), str(out), *digits_run(digits_data),
               "--batch-size", "64", "--num-epochs", str(EPOCHS), "--lr", "0.2", "--warmup-epochs", "1",
               "--num-examples", "640", "--seed", "3", "--workspace", str(out)]
    result = subprocess.run(command, env=venv_env(), capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


def test_ranks_end_with_identical_parameters(two_worker_run):
    rank0 = np.load(two_worker_run / "params-rank0.npz")
    rank1 = np.load(two_worker_run / "params-rank1.npz")
    assert sorted(rank0.files) == sorted(rank1.files)
    assert any(name.endswith("running_mean") for name in rank0.files)  # BN statistics are compared too
    for name in rank0.files:
        np.testing.assert_array_equal(rank0[name], rank1[name], err_msg=name)


def test_loss_goes_down(two_worker_run):
    with open(two_worker_run / "report.json") as f:
        losses = json.load(f)["metrics"]["train.loss"]
    assert losses[-1] < 0.8 * losses[0], losses


def test_report_has_one_entry_per_epoch_for_each_metric(two_worker_run):
    with open(two_worker_run / "report.json") as f:
        report = json.load(f)
    assert set(report) >= {"model", "ngpus", "total_duration", "cmd", "metrics"}
    assert report["ngpus"] == 2
    for key in ("train.loss", "val.top1", "val.top5", "val.loss", "train.total_ips"):
        assert key in report["metrics"], key
    for key, values in report["metrics"].items():
        assert len(values) == EPOCHS, key
    assert all(0.0 <= v <= 1.0 for v in report["metrics"]["val.top1"])


def test_last_checkpoint_holds_the_trained_parameters(two_worker_run):
    import mxnet as mx
    prefix = str(two_worker_run / "model")
    net = mx.gluon.SymbolBlock.imports(f"{prefix}-symbol.json", ["data"], f"{prefix}-{EPOCHS:04d}.params")
    rank0 = np.load(two_worker_run / "params-rank0.npz")
    loaded = {name: p.data().asnumpy() for name, p in net.collect_params().items()}
    assert sorted(loaded) == sorted(rank0.files)
    for name in rank0.files:
        np.testing.assert_array_equal(loaded[name], rank0[name], err_msg=name)


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_rank_zeros_values_reach_every_rank_bit_for_bit(controller, tmp_path):
    """Distributed.broadcast_ (an allreduce: Horovod's own broadcast can crash, see its docstring) gives every rank
    rank 0's bits: each dtype the kit sends, a zero's sign, infinities, subnormals, and a ResNet's weights on every
    context; a NaN stays a NaN (Horovod's float16 sum gives its own NaN's bits)."""
    if controller == "mpi":
        need_mpi()
        command, env = ["mpirun", "-np", "2", "--oversubscribe"], mpirun_root_env()
    else:
        command, env = ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo"], venv_env()
    command += [sys.executable, os.path.join(ROOT, "tests", "hvd_broadcast_worker.py"), str(tmp_path)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    before, after = [[np.load(tmp_path / f"{when}-rank{rank}.npz") for rank in (0, 1)] for when in ("before", "after")]
    assert np.signbit(before[0]["float32"][0]) and np.isnan(before[0]["float32"][2])  # the special values were sent
    for name in before[0].files:
        assert not np.array_equal(before[0][name], before[1][name], equal_nan=True), name  # the ranks differed
        for rank in (0, 1):
            assert after[rank][name].dtype == before[0][name].dtype, name
            sent, got = before[0][name], after[rank][name]
            nan = np.isnan(sent) if sent.dtype.kind == "f" else np.zeros(sent.shape, bool)
            np.testing.assert_array_equal(np.isnan(got) if got.dtype.kind == "f" else nan, nan, err_msg=name)
            assert got[~nan].tobytes() == sent[~nan].tobytes(), (name, rank)
