"""Training resolution apart from the test resolution, and progressive resizing: FFCV's plan, the sizes the kit's
rebuilt training pipelines deliver epoch by epoch, validation at the test size, no pipeline kept alive."""
import gc
import types
import weakref

import mxnet as mx
import numpy as np
import pytest

from rn50kit.data import loaders
from rn50kit.common import schedules
from rn50kit.config import settings
import train
from conftest import write_record_file


def test_progressive_sizes_follow_ffcvs_plan():
    # rn50_88_epochs.yaml: min_res 160, max_res 192, start_ramp 65, end_ramp 76 (epochs from 0), multiples of 32
    plan = [schedules.train_size(e, 160, 192, 65, 76) for e in range(88)]
    assert plan == [160] * 71 + [192] * 17  # interp(70) = 174.5 -> 160, interp(71) = 177.5 -> 192
    plan = [schedules.train_size(e, 160, 192, 17, 20) for e in range(24)]  # rn50_24_epochs.yaml
    assert plan == [160] * 19 + [192] * 5
    assert [schedules.train_size(e, 16, 32, 1, 3, step=8) for e in range(5)] == [16, 16, 24, 32, 32]


def test_bad_sizes_name_the_flags():
    with pytest.raises(ValueError, match="--train-size-epochs"):
        loaders.check_train_size(loaders.DataConfig(train_size=(16, 32)))
    with pytest.raises(ValueError, match="--train-size"):
        loaders.check_train_size(loaders.DataConfig(train_size=(0,)))
    loaders.check_train_size(loaders.DataConfig(train_size=(16, 32), train_size_epochs=(1, 3)))


@pytest.fixture(scope="module")
def small_rec(tmp_path_factory):
    rng = np.random.RandomState(0)
    images = [rng.randint(0, 256, size=(40, 48, 3), dtype=np.uint8) for _ in range(12)]
    return write_record_file(str(tmp_path_factory.mktemp("sizes") / "train"), images, [i % 3 for i in range(12)])


def configured(rec, backend, *extra):
    rec_path, idx = rec
    argv = ["--kv-store", "local", "--data-backend", backend, "--dtype", "float32", "--data-train", rec_path,
            "--data-val", rec_path, "--image-shape", "3,32,32", "--data-val-resize", "36", "--batch-size", "4",
            "--dali-threads", "1", "--dali-validation-threads", "1", "--data-mxnet-threads", "1", "--num-classes",
            "3", "--num-layers", "18", *extra]
    args = train.parse_args(argv)
    return train.configure(args, settings.given_flags(train.get_args_parser(), argv), 0)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [None, 5])
def test_training_size_changes_on_the_planned_epochs_and_validation_stays(small_rec, seed):
    extra = ["--train-size", "16,32", "--train-size-epochs", "1,3", "--train-size-step", "8"]
    cfg = configured(small_rec, "dali-cpu", *extra, *(["--seed", str(seed)] if seed is not None else []))
    first, val = loaders.get_data_iterators_per_device(cfg, 0, 1, 0, 1, [mx.cpu()])
    dist = types.SimpleNamespace(rank=0, size=1, local_rank=0, local_size=1)
    make = train.train_iterator_factory(cfg, dist, [mx.cpu()], first)
    sizes, previous = [], None
    for epoch in range(5):
        iterator = make(epoch)
        batch = next(iter(iterator))
        sizes.append(batch.data[0].shape[2:])
        assert batch.data[0].shape[:2] == (4, 3)
        if previous is not None and previous() is not iterator:
            gc.collect()
            assert previous() is None, f"epoch {epoch}: the previous training pipeline is still alive"
        previous = weakref.ref(iterator) if iterator is not first else None  # first stays with the caller
        del iterator, batch
        assert next(iter(val)).data[0].shape == (4, 3, 32, 32)
    assert sizes == [(16, 16), (16, 16), (24, 24), (32, 32), (32, 32)]


@pytest.mark.slow
def test_a_fixed_training_size_in_the_mxnet_backend_too(small_rec):
    cfg = configured(small_rec, "mxnet", "--train-size", "24")
    train_iter, val_iter = loaders.get_data_iterators(cfg, 0, 1, 0, 1, mx.cpu())
    assert next(iter(train_iter)).data[0].shape == (4, 3, 24, 24)
    assert next(iter(val_iter)).data[0].shape == (4, 3, 32, 32)
