"""Automatic augmentation (DALI's auto_aug) and colour jitter in the kit's DALI training iterator: valid batches
for every policy, the same images for the same seed, augmentation really applied, other backends refuse it."""
import warnings

import mxnet as mx
import numpy as np
import pytest

from rn50kit.common import cli
from rn50kit.data import loaders
from rn50kit.common import rules
import train
from conftest import TINY_RUN, write_record_file

MEAN, STD = (123.68, 116.779, 103.939), (58.393, 57.12, 57.375)


@pytest.fixture(scope="module")
def square_rec(tmp_path_factory):
    """16 square images (so a crop of the whole image is exact): smooth gradients with a block, labels 0..15."""
    rng = np.random.RandomState(0)
    yy, xx = np.mgrid[0:48, 0:48]
    images = []
    for k in range(16):
        image = np.stack([(xx * 5 + k * 9) % 256, (yy * 4 + k * 13) % 256, (xx + yy) * 2 % 256], -1)
        y, x = rng.randint(0, 30, size=2)
        image[y:y + 16, x:x + 16] = rng.randint(0, 256, size=3)
        images.append(image.astype(np.uint8))
    return write_record_file(str(tmp_path_factory.mktemp("square") / "train"), images, range(16))


def batches(rec, seed=3, n=2, layout="NCHW", **augment):
    rec_path, idx = rec
    cfg = loaders.DataConfig(data_backend="dali-cpu", data_train=rec_path, data_train_idx=idx, image_shape=(3, 32, 32),
                          input_layout=layout, dali_threads=1, dali_prefetch_queue=2, min_random_area=1.0,
                          min_random_aspect_ratio=1.0, max_random_aspect_ratio=1.0, random_mirror=0, **augment)
    train_iter, _ = loaders.get_dali_iterators(cfg, loaders.Feed(batch_size=8, seed=seed), 0, 1, 0, 1, mx.cpu())
    out = []
    for batch in train_iter:
        out.append((batch.data[0].asnumpy().copy(), batch.label[0].asnumpy().copy()))
        if len(out) == n:
            break
    return out


def value_range(channel_axis):
    shape = [1, 1, 1, 1]
    shape[channel_axis] = 3
    low = (0 - np.array(MEAN)) / np.array(STD)
    high = (255 - np.array(MEAN)) / np.array(STD)
    return low.reshape(shape) - 1e-4, high.reshape(shape) + 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("policy, layout", [("autoaugment", "NCHW"), ("randaugment", "NHWC"),
                                            ("trivialaugment", "NCHW")])
def test_each_policy_gives_valid_batches_the_same_for_a_seed_and_changes_images(square_rec, policy, layout):
    augment = dict(auto_augment=policy, randaugment_n=2, randaugment_m=15, color_jitter=(0.4,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = batches(square_rec, layout=layout, **augment)
    # DALI's policies use its deprecated fn.experimental aliases: hundreds of log lines a run, unless the kit
    # keeps them out.
    deprecations = [str(w.message) for w in caught if "deprecated" in str(w.message)]
    assert not deprecations, deprecations[:2]
    plain = {int(label): image for images, labels in batches(square_rec, layout=layout)
             for image, label in zip(images, labels)}  # the whole image, resized: no randomness left
    shape = (8, 3, 32, 32) if layout == "NCHW" else (8, 32, 32, 3)
    low, high = value_range(1 if layout == "NCHW" else 3)
    changed = 0
    for images, labels in first:
        assert images.shape == shape and images.dtype == np.float32 and np.isfinite(images).all()
        assert (images >= low).all() and (images <= high).all()
        assert set(labels.astype(int)) <= set(range(16))
        changed += sum(not np.allclose(image, plain[int(label)], atol=1e-3) for image, label in zip(images, labels))
    assert changed >= 8, f"only {changed} of 16 images differ from the unaugmented ones"
    again = batches(square_rec, layout=layout, **augment)
    for (a, la), (b, lb) in zip(first, again):
        np.testing.assert_array_equal(la, lb)
        np.testing.assert_array_equal(a, b)
    other = batches(square_rec, seed=4, layout=layout, **augment)
    assert any(not np.array_equal(a, b) for (a, _), (b, _) in zip(first, other))


def test_other_backends_refuse_in_one_line():
    line = rules.augment_problem("mxnet", "randaugment")
    assert line and "\n" not in line and "--auto-augment" in line and "dali-cpu" in line
    assert rules.augment_problem("mxnet", "none", (0.4,)).startswith("--color-jitter")
    assert rules.augment_problem("dali-cpu", "randaugment", (0.4,)) is None
    assert rules.augment_problem("dali-gpu", "trivialaugment") is None
    assert rules.augment_problem("mxnet") is None
    args = train.parse_args(["--kv-store", "local", *TINY_RUN, "--auto-augment", "randaugment"])
    with pytest.raises(cli.UsageError) as error:
        train.main(args)
    assert str(error.value) == rules.augment_problem("synthetic", "randaugment")


def test_bad_augmentation_values_name_the_flag():
    with pytest.raises(ValueError, match="--color-jitter"):
        loaders.check_augmentation(loaders.DataConfig(color_jitter=(0.1, 0.2)))
    with pytest.raises(ValueError, match="--randaugment-m"):
        loaders.check_augmentation(loaders.DataConfig(randaugment_m=31))
    assert loaders.color_jitter3((0.4,)) == (0.4, 0.4, 0.4)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_the_image_grid_shows_the_batch_as_fed(tmp_path, layout):
    """--test-io-grid: the PNG read back holds every image of the batch, un-normalised, in its grid cell."""
    import cv2
    rng = np.random.RandomState(5)
    pixels = rng.randint(0, 256, size=(10, 12, 14, 3)).astype(np.float32)  # NHWC, RGB
    normalised = (pixels - np.array(MEAN, np.float32)) / np.array(STD, np.float32)
    batch = normalised if layout == "NHWC" else normalised.transpose(0, 3, 1, 2)
    path = str(tmp_path / "grid.png")
    loaders.save_image_grid(mx.nd.array(batch), path, MEAN, STD, layout, columns=4)
    grid = cv2.imread(path)[:, :, ::-1]
    assert grid.shape == (3 * 12, 4 * 14, 3)
    for i in range(10):
        row, column = divmod(i, 4)
        cell = grid[row * 12:(row + 1) * 12, column * 14:(column + 1) * 14]
        np.testing.assert_allclose(cell, pixels[i], atol=1)
    assert not grid[2 * 12:, 2 * 14:].any()  # the two cells after the last image stay empty
