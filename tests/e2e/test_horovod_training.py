"""Two Horovod workers (Gloo) train on real data: they agree on every parameter and learn."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, digits_run, venv_env

pytestmark = pytest.mark.slow  # launches processes or trains end to end

EPOCHS = 3


@pytest.fixture(scope="module")
def two_worker_run(digits_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("hvd")
    command = ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
               os.path.join(ROOT, "tests", "hvd_train_worker.py"), str(out), *digits_run(digits_data),
               "--batch-size", "64", "--num-epochs", str(EPOCHS), "--lr", "0.2", "--warmup-epochs", "1",
               "--num-examples", "640", "--seed", "3", "--workspace", str(out)]
    result = subprocess.run(command, env=venv_env(), capture_output=True, text=True, timeout=600)
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
