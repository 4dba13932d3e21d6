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
