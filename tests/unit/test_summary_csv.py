"""summary.csv (rn50kit/reporting/summary_csv.py) over real fit() runs of a tiny network: its values are those of
the JSON-lines log and the report; a run stopped by --run-epochs and resumed, and a run resumed from an earlier
checkpoint, list every epoch once, with the values of the run that trained it last."""
import csv
import json

import fit
from rn50kit.training.distributed import Distributed
from support.loop import CPU, MICRO, RUN, TINY_CLASSES, AccumBatches, fit_config, tiny_accum_net
from support.runs import logged

EPOCHS = 3


def train(tmp_path, *flags):
    """fit() of the tiny network in ``tmp_path`` (its workspace) for EPOCHS epochs, as ``flags`` add."""
    cfg = fit_config(tmp_path, MICRO, 1, "--num-epochs", str(EPOCHS), "--ema-decay", "0", *flags)
    batches = AccumBatches(MICRO, 3)
    return fit.fit(cfg, RUN, tiny_accum_net(tmp_path / "init.params"), lambda epoch: batches,
                   AccumBatches(MICRO, 2, seed=1), CPU, Distributed(None), TINY_CLASSES)


def summary(workspace):
    with open(workspace / "summary.csv", newline="") as f:
        return list(csv.DictReader(f))


def latest_epoch_records(workspace):
    """The JSON log's last "epoch" record of each epoch (the log appends across runs)."""
    return {record["epoch"]: record for record in logged(workspace, "epoch")}


def test_a_rows_values_are_the_json_logs_and_the_reports(tmp_path, keep_signal_handlers):
    train(tmp_path)
    rows = summary(tmp_path)
    assert [int(row["epoch"]) for row in rows] == list(range(1, EPOCHS + 1))
    records = latest_epoch_records(tmp_path)
    metrics = json.load(open(tmp_path / "report.json"))["metrics"]
    for i, row in enumerate(rows):
        record = records[i + 1]
        assert float(row["train_loss"]) == record["train.loss"] == metrics["train.loss"][i]
        for name in ("top1", "top5", "loss"):
            assert float(row[f"val_{name}"]) == record[f"val.{name}"] == metrics[f"val.{name}"][i]
        assert float(row["lr"]) == metrics["train.lr"][i]
        assert float(row["images_per_s"]) == metrics["train.total_ips"][i]
    # the training seconds of an epoch: at least its steps' span in the log, at most the time to its record
    times = {}
    for record in logged(tmp_path, "iter"):
        times.setdefault(record["epoch"], []).append(record["time"])
    start = logged(tmp_path, "params")[0]["time"]
    for row in rows:
        epoch = int(row["epoch"])
        steps = times[epoch]
        assert steps[-1] - steps[0] - 1e-3 <= float(row["train_seconds"]) <= records[epoch]["time"] - start + 1e-3


def test_a_resumed_run_lists_each_epoch_once_with_the_latest_values(tmp_path, keep_signal_handlers):
    train(tmp_path, "--run-epochs", "1")
    assert [row["epoch"] for row in summary(tmp_path)] == ["1"]
    first = summary(tmp_path)[0]
    train(tmp_path)  # --resume auto: epochs 2 and 3
    assert [row["epoch"] for row in summary(tmp_path)] == ["1", "2", "3"]
    assert summary(tmp_path)[0] == first
    # again from epoch 1's checkpoint: epochs 2 and 3 are trained anew and replace their rows
    train(tmp_path, "--resume", str(tmp_path / "model-0001.params"))
    rows = summary(tmp_path)
    assert [row["epoch"] for row in rows] == ["1", "2", "3"]
    assert rows[0] == first
    records = latest_epoch_records(tmp_path)
    assert [float(row["train_loss"]) for row in rows] == [records[e]["train.loss"] for e in (1, 2, 3)]
    assert len(logged(tmp_path, "epoch")) == 5  # the log itself keeps every run's records: 1, then 2-3 twice


def test_a_fresh_run_sets_the_earlier_summary_aside(tmp_path, keep_signal_handlers):
    train(tmp_path, "--run-epochs", "1")
    train(tmp_path, "--resume", "none", "--run-epochs", "2")
    assert [row["epoch"] for row in summary(tmp_path)] == ["1", "2"]
    aside = list(tmp_path.glob("previous-*/summary.csv"))
    assert len(aside) == 1 and [row["epoch"] for row in summary(aside[0].parent)] == ["1"]
