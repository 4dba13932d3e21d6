"""--tensorboard (rn50kit/reporting/tensorboard_log.py) over real fit() runs of a tiny network, read back with
TensorBoard's own reader (EventAccumulator): every logged step's loss, LR, images/s and loss scale, every
validation and the run's settings are those of the JSON-lines log; with EMA the validation is named so; a resumed
run continues the same steps; ranks but 0 write nothing."""
import dataclasses
import types

import mxnet as mx
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

import fit
from rn50kit.config import fit_flags
from rn50kit.reporting import outputs
from rn50kit.reporting.report import Report
from rn50kit.reporting.tensorboard_log import TensorBoard
from rn50kit.training.distributed import Distributed
from rn50kit.training.elastic import ElasticEpoch, plan_world
from support import loop as loop_harness
from support.loop import CPU, MICRO, RUN, TINY_CLASSES, AccumBatches, fit_config, tiny_accum_net
from support.runs import logged

EPOCHS, STEPS = 2, 3
ARGS = {"lr": 0.4, "batch_size": 4, "model": "tiny", "lr_steps": [30, 60], "pretrained": None, "no_metrics": False}


def train(tmp_path, *flags):
    cfg = fit_config(tmp_path, MICRO, 1, "--num-epochs", str(EPOCHS), "--tensorboard", "tb", *flags)
    batches = AccumBatches(MICRO, STEPS)
    run = dataclasses.replace(RUN, record={"args": ARGS})
    return fit.fit(cfg, run, tiny_accum_net(tmp_path / "init.params"), lambda epoch: batches,
                   AccumBatches(MICRO, 2, seed=1), CPU, Distributed(None), TINY_CLASSES)


def events(folder):
    accumulator = EventAccumulator(str(folder))
    accumulator.Reload()
    return accumulator


def scalars(accumulator, tag):
    return [(event.step, event.value) for event in accumulator.Scalars(tag)]


def as_float32(values):
    """Event files hold scalars as float32."""
    return [float(mx.nd.array([v], dtype="float32").asnumpy()[0]) for v in values]


@pytest.mark.parametrize("ema", [False, True])
def test_the_events_are_the_json_logs_values(tmp_path, keep_signal_handlers, ema):
    train(tmp_path, "--ema-decay", "0.9" if ema else "0")
    read = events(tmp_path / "tb")
    iters = logged(tmp_path, "iter")
    steps = [((r["epoch"] - 1) * STEPS + r["step"] + 1) * MICRO for r in iters]  # the samples read
    assert steps == list(range(MICRO, (EPOCHS * STEPS + 1) * MICRO, MICRO))
    for tag, key in (("loss", "loss"), ("lr", "lr"), ("images_per_s", "ips"), ("loss_scale", "loss_scale")):
        assert scalars(read, f"train/{tag}") == list(zip(steps, as_float32(r[key] for r in iters))), tag
    epochs = logged(tmp_path, "epoch")
    prefix = "val_ema" if ema else "val"
    assert not ({"val/top1", "val_ema/top1"} - {f"{prefix}/top1"}) & set(read.Tags()["scalars"])
    for name in ("top1", "top5", "loss"):
        assert scalars(read, f"{prefix}/{name}") == list(zip([r["epoch"] for r in epochs],
                                                              as_float32(r[f"val.{name}"] for r in epochs)))
    assert scalars(read, "train/epoch_loss") == list(zip([r["epoch"] for r in epochs],
                                                         as_float32(r["train.loss"] for r in epochs)))
    # the settings, once, as TensorBoard's HParams plugin reads them
    content = read.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    settings = {key: value.WhichOneof("kind") and getattr(value, value.WhichOneof("kind"))
                for key, value in start.session_start_info.hparams.items()}
    assert settings == {"lr": 0.4, "batch_size": 4.0, "model": "tiny", "lr_steps": "30,60", "no_metrics": False}
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert [m.name.tag for m in experiment.metric_infos] == [f"{prefix}/top1", f"{prefix}/top5", f"{prefix}/loss"]


def test_a_resumed_run_continues_the_steps(tmp_path, keep_signal_handlers):
    train(tmp_path, "--ema-decay", "0", "--run-epochs", "1")
    train(tmp_path, "--ema-decay", "0")
    read = events(tmp_path / "tb")
    assert [step for step, _ in scalars(read, "train/loss")] == list(range(MICRO, (EPOCHS * STEPS + 1) * MICRO, MICRO))
    assert [step for step, _ in scalars(read, "val/top1")] == list(range(1, EPOCHS + 1))
    assert list(read.PluginTagToContent("hparams")) == ["_hparams_/experiment", "_hparams_/session_start_info",
                                                        "_hparams_/session_end_info"]  # the first run's, once


def test_a_fresh_run_sets_the_earlier_events_aside(tmp_path, keep_signal_handlers):
    train(tmp_path, "--ema-decay", "0")
    train(tmp_path, "--ema-decay", "0", "--resume", "none", "--run-epochs", "1")
    aside = list(tmp_path.glob("previous-*/tb"))
    assert len(aside) == 1
    earlier, fresh = events(aside[0]), events(tmp_path / "tb")
    assert [step for step, _ in scalars(earlier, "val/top1")] == list(range(1, EPOCHS + 1))
    assert scalars(fresh, "val/top1") == [(1, as_float32([logged(tmp_path, "epoch")[0]["val.top1"]])[0])]
    assert scalars(fresh, "train/loss") == scalars(earlier, "train/loss")[:STEPS]  # the same seed: epoch 1 again


def test_ranks_but_0_write_nothing(tmp_path):
    cfg = fit_flags.FitConfig(workspace=str(tmp_path), num_epochs=1, json_log="", tensorboard="tb")
    listed = fit.open_outputs(cfg, RUN, Report("tiny", 2, ["test"]), types.SimpleNamespace(is_primary=False, size=2),
                              [mx.cpu()], True, lambda: 8)
    listed.run_start(1, 1, None)
    listed.iteration(outputs.Step(1, 0, 1, 2.5, 2.5, 0.1, 100.0, 90.0, 0.0, 1.0))
    listed.validation(1, {"top1": 0.5, "top5": 1.0, "loss": 2.0, "samples": 8, "durations": [0.1]}, True)
    listed.close()
    assert list(tmp_path.iterdir()) == []


def test_the_steps_grow_through_an_elastic_world_change(tmp_path, keep_signal_handlers):
    """Issue 55: the step was (epoch - 1) x steps per epoch + step, and an elastic run's steps per epoch change
    with its world: 2 workers (8 micro-steps of 6 images per epoch: 3 each, accumulating 2) read the first 24
    samples, then 3 workers (4 steps of 12) the rest, from step 2; the next epoch starts again at step 0. The step
    is now the samples read: the sum of the micro-batches so far."""
    epoch_samples, global_batch = 48, 12
    cfg = fit_config(tmp_path, MICRO, 1, "--ema-decay", "0")
    state, loop = loop_harness.start(cfg, tiny_accum_net(tmp_path / "init.params"), TINY_CLASSES)
    loop.outputs = outputs.Outputs([TensorBoard(str(tmp_path / "tb"), {})])
    micro_batches = []
    for epoch, workers, consumed, segment in ((0, 2, 0, 24), (0, 3, 24, 24), (1, 3, 0, 48)):
        plan = plan_world(global_batch, workers, max_per_worker=4)
        steps = segment // plan.micro_batch
        first_step = consumed // plan.global_batch * plan.accum
        world_cfg = dataclasses.replace(cfg, batch_size=plan.micro_batch, grad_accum_steps=plan.accum)
        for param in loop.net.collect_params().values():  # as ElasticRun.train_epoch
            param.grad_req = "add" if plan.accum > 1 else "write"
        batches = ElasticEpoch(AccumBatches(plan.micro_batch, steps), first_step, steps, consumed, epoch_samples)
        fit.train_one_epoch(world_cfg, loop, state, batches, epoch)
        micro_batches += [plan.micro_batch] * steps
    loop.outputs.close()
    assert micro_batches == [6] * 4 + [12] * 2 + [12] * 4  # the worlds planned as the docstring says
    logged = [step for step, _ in scalars(events(tmp_path / "tb"), "train/loss")]
    assert logged == np.cumsum(micro_batches).tolist()
