"""The second newcomer walk (issue 26): what trained silently wrong, and what crashed where one line belongs."""
import os

import numpy as np
import pytest

from conftest import write_record_file
import backends
import cli
import config
import train


def labelled_records(folder, labels):
    """train.rec/.idx and val.rec/.idx with the given labels and no .lst (as check_dataset.py --fix writes)."""
    rng = np.random.RandomState(0)
    images = [rng.randint(0, 255, size=(8, 8, 3), dtype=np.uint8) for _ in labels]
    files = {}
    for split in ("train", "val"):
        files[split] = write_record_file(str(folder / split), images, labels)
    assert not list(folder.glob("*.lst"))
    return files


def record_config(files, backend, num_classes):
    return config.RunConfig().replace(
        data__data_backend=backend, data__data_train=files["train"][0], data__data_train_idx=files["train"][1],
        data__data_val=files["val"][0], data__data_val_idx=files["val"][1], model__num_classes=num_classes,
        fit__num_epochs=1, fit__warmup_epochs=0)


@pytest.mark.parametrize("backend", [name for name, row in backends.BACKENDS.items() if row.reads_records])
def test_class_count_below_the_record_labels_is_refused_without_a_lst(tmp_path, backend, caplog):
    files = labelled_records(tmp_path, [i % 10 for i in range(20)])
    with pytest.raises(cli.UsageError, match="labels up to 9 but --num-classes is 5; use --num-classes 10"):
        train.warn_about(record_config(files, backend, 5), primary=True)
    train.warn_about(record_config(files, backend, 10), primary=True)  # the right count passes
    with caplog.at_level("WARNING"):
        train.warn_about(record_config(files, backend, 12), primary=True)
    assert "the data has 10 classes" in caplog.text


def test_model_best_holds_the_ema_weights_that_were_scored(tmp_path):
    import mxnet as mx
    import fit
    import models
    from test_fit_phases import Batches, CPU, RUN, start, tiny_net, weights
    parsed = train.parse_args(["--kv-store", "local", "--dtype", "float32", "--batch-size", "8", "--num-epochs", "1",
                               "--lr", "0.2", "--warmup-epochs", "0", "--num-classes", "4", "--seed", "3",
                               "--ema-decay", "0.9", "--workspace", str(tmp_path), "--disp-batches", "0"])
    train.fill_hyper_parameters(parsed)
    args = config.from_args(parsed).fit
    net = tiny_net(tmp_path / "init.params")
    state, loop = start(args, net)
    fit.train_one_epoch(args, loop, state, Batches(), epoch=0)
    val = Batches(steps=2)
    scored = fit.validate(net, state.ema, val, CPU, loop.dist, "float32", no_metrics=False)
    live = weights(net)
    fit.save_checkpoint(str(tmp_path / "model"), net, state, RUN, epoch=1, step=0, keep_last=0, seed=3, best=True)
    assert weights(net).keys() == live.keys() and all(
        np.array_equal(value, live[name]) for name, value in weights(net).items())  # live weights put back
    best = tiny_net(tmp_path / "init.params")
    models.load_parameters(best, str(tmp_path / "model-best.params"), CPU)
    for name, value in weights(best).items():
        np.testing.assert_allclose(value, state.ema.shadow[name].asnumpy(), rtol=1e-6, err_msg=name)
    import scoring
    assert scoring.evaluate(best, val, CPU, loop.dist, "float32")["top1"] == scored["top1"]
    assert any(not np.allclose(value, live[name]) for name, value in weights(best).items())


def built(num_layers, image, dtype="float32"):
    import mxnet as mx
    import models
    net = models.build_network(models.ModelConfig(num_layers=num_layers), 3, "NCHW", dtype)
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    net.hybridize()
    net.infer_shape(mx.nd.zeros((1, 3, image, image), dtype="float16" if dtype == "float16" else "float32"))
    return net


def test_memory_estimate_refuses_a_batch_that_cannot_fit_and_names_one_that_does():
    import memory
    net = built(50, 224)
    gib = 2 ** 30
    # The run: ResNet-50, 224 px, batch 192 on a 24 GB machine (it grew to 21 GB resident).
    problem, need = memory.check(net, (1, 3, 224, 224), "float32", 192, 1, 1, 16 * gib, "this machine")
    assert need > 16 * gib and problem.startswith("training needs about")
    fits = int(problem.split("--batch-size ")[1].split()[0])
    assert 0 < fits < 192 and memory.check(net, (1, 3, 224, 224), "float32", fits, 1, 1, 16 * gib, "m")[0] is None
    assert memory.check(net, (1, 3, 224, 224), "float32", fits + 8, 1, 1, 16 * gib, "m")[0] is not None
    # The original's batches on a 16 GB V100 (15.8 GiB usable): float16 208 and float32 96 fit, float32 208 does not.
    v100 = 15.78 * gib
    assert memory.check(net, (1, 3, 224, 224), "float16", 208, 1, 1, v100, "GPU 0")[0] is None
    assert memory.check(net, (1, 3, 224, 224), "float32", 96, 1, 1, v100, "GPU 0")[0] is None
    assert memory.check(net, (1, 3, 224, 224), "float32", 208, 1, 1, v100, "GPU 0")[0] is not None
    # Activations scale with the image and the batch, by layer: ResNet-18 at 32 px holds 1/49 of 224 px's.
    small = built(18, 32)
    assert memory.activation_elements(small, (1, 3, 32, 32)) * 40 < memory.activation_elements(built(18, 224),
                                                                                                (1, 3, 224, 224))


def test_train_refuses_in_one_line_a_batch_the_machine_cannot_hold(monkeypatch):
    import mxnet as mx
    import distributed
    import memory
    monkeypatch.setattr(memory, "cpu_budget", lambda processes: 1 * 2 ** 30)
    cfg = config.RunConfig().replace(fit__batch_size=4096, fit__mode="train", data__image_shape=(3, 32, 32))
    net = built(18, 32)
    with pytest.raises(cli.UsageError, match=r"this machine has 1.0 GiB; use --batch-size \d+ \(global"):
        train.check_memory(cfg, net, [mx.cpu()], distributed.Distributed(None))
    train.check_memory(cfg.replace(fit__batch_size=8), net, [mx.cpu()], distributed.Distributed(None))
    train.check_memory(cfg.replace(fit__memory_check="warn"), net, [mx.cpu()], distributed.Distributed(None))


def test_cpu_defaults_are_a_batch_a_cpu_can_run():
    import settings
    import launch
    args = train.parse_args([])
    settings.machine_defaults(args, num_gpus=0, given=set())
    assert (args.batch_size, args.dtype, args.data_backend) == (settings.CPU_BATCH_SIZE, "float32", "dali-cpu")
    args = train.parse_args(["--batch-size", "192"])
    settings.machine_defaults(args, num_gpus=0, given={"batch_size"})
    assert args.batch_size == 192  # typed: kept
    args = train.parse_args([])
    settings.machine_defaults(args, num_gpus=8, given=set())
    assert (args.batch_size, args.dtype) == (192, "float16")
    cpu, gpus = launch.Machine(gpus=0, cores=2), launch.Machine(gpus=8, cores=64)
    assert "--batch-size 32" in " ".join(launch.plan_launch(["--data-backend", "synthetic"], cpu, {})[2])
    assert "--batch-size 1536" in " ".join(launch.plan_launch(["--data-backend", "synthetic", "-n", "8"], gpus, {})[2])
