"""The loop's outputs as one list (rn50kit/reporting/outputs.py), opened from output_table.py: an output added to
the list hears what the built-in ones hear, in order, over a real fit() on a tiny network; an event an output leaves
alone is a no-op; close() reaches every output; the files are rank 0's."""
import json
import types

import mxnet as mx
import pytest

import fit
from rn50kit.config import fit_flags
from rn50kit.reporting import output_table, outputs
from rn50kit.reporting.report import Report
from rn50kit.training.distributed import Distributed
from support.loop import CPU, MICRO, RUN, TINY_CLASSES, AccumBatches, fit_config, tiny_accum_net

EVENTS = ["run_start", "epoch_start", "iteration", "steps_end", "trained", "validation_start", "validation",
          "epoch_end", "run_end", "close"]


class Recorder(outputs.Output):
    """Every event it hears, with its arguments."""

    def __init__(self):
        self.heard = []


for _event in EVENTS:
    setattr(Recorder, _event, lambda self, *args, _event=_event: self.heard.append((_event, args)))


def test_an_output_added_to_the_list_hears_every_event_of_a_real_run_in_order(tmp_path, monkeypatch,
                                                                               keep_signal_handlers):  # noqa: F811
    recorder = Recorder()
    build = fit.open_outputs

    def with_recorder(*args):
        built = build(*args)
        built.outputs.append(recorder)
        return built
    monkeypatch.setattr(fit, "open_outputs", with_recorder)
    epochs, batches = 2, 3
    cfg = fit_config(tmp_path, MICRO, 1, "--num-epochs", str(epochs), "--ema-decay", "0")
    train_batches = AccumBatches(MICRO, batches)
    report, stopped = fit.fit(cfg, RUN, tiny_accum_net(tmp_path / "init.params"), lambda epoch: train_batches,
                              AccumBatches(MICRO, 2, seed=1), CPU, Distributed(None), TINY_CLASSES)
    assert not stopped
    per_epoch = ["epoch_start"] + ["iteration"] * batches + ["steps_end", "trained", "validation_start",
                                                             "validation", "epoch_end"]
    assert [name for name, _ in recorder.heard] == ["run_start"] + per_epoch * epochs + ["run_end", "close"]
    # what the built-in JSON-lines log and report wrote, from the same events
    records = [json.loads(line) for line in open(tmp_path / "log.jsonl")]
    assert [r["type"] for r in records] == ["params"] + (["iter"] * batches + ["epoch"]) * epochs + ["summary"]
    steps = [args[0] for name, args in recorder.heard if name == "iteration"]
    assert [(s.epoch, s.step, s.loss, s.lr) for s in steps] == \
        [(r["epoch"], r["step"], r["loss"], r["lr"]) for r in records if r["type"] == "iter"]
    assert [args for name, args in recorder.heard if name == "epoch_end"] == \
        [(r.pop("epoch"), {k: v for k, v in r.items() if k not in ("type", "time")})
         for r in records if r["type"] == "epoch"]
    saved = json.load(open(tmp_path / "report.json"))
    assert [args[1]["loss"] for name, args in recorder.heard if name == "trained"] == saved["metrics"]["train.loss"]
    assert [args[1]["top1"] for name, args in recorder.heard if name == "validation"] == saved["metrics"]["val.top1"]
    run_start, run_end = recorder.heard[0][1], recorder.heard[-2][1]
    assert run_start == (1, epochs, None)
    assert run_end[:4] == (epochs, True, False, False) and run_end[4] == saved["total_duration"]


class Quiet(outputs.Output):
    """Hears nothing but close."""

    def __init__(self, fails=False):
        self.fails, self.closed = fails, False

    def close(self):
        self.closed = True
        if self.fails:
            raise OSError("disk full")


def test_events_an_output_leaves_alone_do_nothing_and_the_others_still_hear_them():
    recorder = Recorder()
    listed = outputs.Outputs([outputs.Output(), Quiet(), recorder])
    step = outputs.Step(1, 0, 3, 2.5, 2.5, 0.1, 100.0, 90.0, 5.0, 1.0)
    listed.run_start(1, 2, None)
    listed.iteration(step)
    listed.validation(1, {"top1": 0.5}, True)
    listed.run_end(2, True, False, False, 12.0, None)
    assert recorder.heard == [("run_start", (1, 2, None)), ("iteration", (step,)),
                              ("validation", (1, {"top1": 0.5}, True)),
                              ("run_end", (2, True, False, False, 12.0, None))]


def test_close_reaches_every_output_when_one_fails():
    first, failing, last = Quiet(), Quiet(fails=True), Quiet()
    with pytest.raises(OSError, match="disk full"):
        outputs.Outputs([first, failing, last]).close()
    assert first.closed and failing.closed and last.closed


@pytest.mark.parametrize("primary", [True, False])
def test_the_files_are_written_by_rank_0_only(tmp_path, primary):
    cfg = fit_flags.FitConfig(workspace=str(tmp_path), num_epochs=1, json_log="log.jsonl")
    dist = types.SimpleNamespace(is_primary=primary, size=2)
    report = Report("tiny", 2, ["test"])
    listed = fit.open_outputs(cfg, RUN, report, dist, [mx.cpu()], True, lambda: 8)
    listed.run_start(1, 1, None)
    listed.iteration(outputs.Step(1, 0, 1, 2.5, 2.5, 0.1, 100.0, 90.0, 0.0, 1.0))
    listed.trained(1, {"loss": 2.5}, [0.1], 0.1, 0.2)
    listed.epoch_end(1, {"train.loss": 2.5})
    listed.run_end(1, True, False, False, 3.0, None)
    listed.close()
    assert sorted(path.name for path in tmp_path.iterdir()) == (["log.jsonl", "report.json", "summary.csv"] if primary
                                                                  else [])
    assert report.metrics["train.loss"] == [2.5] and report.total_duration == 3.0  # every rank keeps its report


def test_the_mlperf_log_does_not_build_the_first_epochs_pipeline_twice(tmp_path, keep_signal_handlers):
    """--mllog asks for an epoch's samples at the start: from the first epoch's pipeline, which the epoch then
    uses (under --seed each call of make_train_iter builds a new pipeline)."""
    cfg = fit_config(tmp_path, MICRO, 1, "--num-epochs", "2", "--ema-decay", "0", "--mllog", "mllog.txt")
    built = []

    def make_train_iter(epoch):
        built.append(epoch)
        return AccumBatches(MICRO, 3)
    fit.fit(cfg, RUN, tiny_accum_net(tmp_path / "init.params"), make_train_iter, AccumBatches(MICRO, 2, seed=1),
            CPU, Distributed(None), TINY_CLASSES)
    assert built == [0, 1]
    samples = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in open(tmp_path / "mllog.txt")
               if ":::MLLOG " in line]
    assert {r["key"]: r["value"] for r in samples}["train_samples"] == 3 * cfg.batch_size


def test_every_row_of_the_output_table_is_an_output_with_its_own_open():
    """output_table.OUTPUTS: each row names an Output class that says how a run opens it (the base's open
    refuses), the seven outputs of a run, the console first."""
    classes = [output_table.output_class(row) for row in output_table.OUTPUTS]
    assert all(issubclass(cls, outputs.Output) and "open" in vars(cls) for cls in classes)
    assert [cls.__name__ for cls in classes] == ["Console", "JsonLines", "ReportOutput", "MLPerf", "SummaryCsv",
                                                 "TensorBoard", "ResolvedConfig"]
    with pytest.raises(NotImplementedError, match="Quiet has no open"):
        Quiet.open(None)
