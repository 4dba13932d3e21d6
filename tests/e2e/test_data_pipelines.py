"""The data pipelines on record files in process, the heavier cases: every automatic-augmentation policy, a
DALI pipeline collected on its own thread, --test-io, label-ordered files, progressive training sizes."""
import gc
import subprocess
import sys
import types
import warnings
import weakref

import cv2
import mxnet as mx
import numpy as np
import pytest

import train
from rn50kit.config import data_flags, settings, train_config
from rn50kit.data import backend_dali, io_timing, loaders, protocol, records
from rn50kit.training import epoch_data
from support.datasets import write_record_file
from support.processes import HANG_S, ROOT, venv_env
from support.runs import parse_ordered, parse_train

pytestmark = pytest.mark.slow  # launches processes, trains end to end or builds heavy data


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
    cfg = data_flags.DataConfig(data_backend="dali-cpu", data_train=rec_path, data_train_idx=idx,
                                image_shape=(3, 32, 32), input_layout=layout, dali_threads=1, dali_prefetch_queue=2,
                                min_random_area=1.0, min_random_aspect_ratio=1.0, max_random_aspect_ratio=1.0,
                                random_mirror=0, **augment)
    train_iter, _ = backend_dali.get_iterators(cfg, protocol.Feed(batch_size=8, seed=seed), 0, 1, 0, 1, mx.cpu())
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


FINALIZED_OFF_MAIN = r'''
import gc, sys
sys.path.insert(0, sys.argv[1])
import mxnet as mx
import dali
from nvidia.dali import Pipeline, fn, pipeline_def

gc.disable()  # collections only where collect() runs them: on DALI's threads

off_main = []


def collect(x):  # a collection on DALI's thread, as an allocation in the OpenCV resize may start one
    gc.collect()
    return x


@pipeline_def(batch_size=2, num_threads=2, device_id=None, prefetch_queue_depth=3)
def working():
    return fn.python_function(fn.random.uniform(range=[0, 1], shape=[4]), function=collect)


@pipeline_def(batch_size=2, num_threads=1, device_id=None)
def plain():
    return fn.random.uniform(range=[0, 1], shape=[4]), fn.random.uniform(range=[0, 1], shape=[1])


for _ in range(4):
    pipe = working()
    pipe.build()
    pipe.run()  # it goes on working ahead
    cycle = {"pipe": pipe}
    cycle["self"] = cycle  # dropped into a reference cycle, as a traceback's frames hold one
    del pipe, cycle
kept = [p for p in dali._finalized_off_main if isinstance(p, Pipeline) and p._pipe is not None]  # not stubs
batches = dali.DaliBatches(plain(), mx.cpu())
batches.pipeline.build()
batches.next()  # the main thread shuts down what was finalized elsewhere
print("kept", len(kept), "shut", sum(p._pipe is None for p in kept))
'''


@pytest.mark.slow  # a process of its own, collecting on every python_function call
def test_a_pipeline_collected_on_its_own_thread_does_not_abort_the_process(tmp_path):
    """DALI's Pipeline.__del__ joins the pipeline's threads: run by a collection on one of them (a pipeline in a
    reference cycle, dropped while its python_function works ahead) it aborted the process ("terminate called",
    Resource deadlock avoided). dali.py keeps such a pipeline and the main thread shuts it down at its next batch."""
    script = tmp_path / "finalized_off_main.py"
    script.write_text(FINALIZED_OFF_MAIN)
    result = subprocess.run([sys.executable, str(script), ROOT], env=venv_env(), capture_output=True, text=True,
                            timeout=HANG_S)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Resource deadlock" not in result.stderr and "Exception ignored" not in result.stderr, result.stderr
    kept, shut = (int(word) for word in result.stdout.split()[1::2])
    assert kept >= 1 and shut == kept  # running pipelines collected off the main thread, then shut down by it


def test_test_io_counts_every_image(digits_data):
    args = parse_train("--data-backend", "dali-cpu", "--data-train", digits_data / "train.rec",
                 "--data-train-idx", digits_data / "train.idx", "--data-val", digits_data / "val.rec",
                 "--data-val-idx", digits_data / "val.idx", "--batch-size", "32", "--image-shape", "3,32,32",
                 "--data-val-resize", "32", "--dali-threads", "1", "--dali-validation-threads", "1",
                 "--test-io", "--test-io-mode", "val", "--disp-batches", "2")
    train_iter, val_iter = loaders.get_data_iterators(train_config.from_args(args), 0, 1, 0, 1, mx.cpu())
    lines = []
    result = io_timing.test_io(train_config.from_args(args), train_iter, val_iter, epochs=2, out=lines.append)
    assert result["images"] == 2 * 359 - 32  # the first batch is start-up, not timed
    assert result["images_per_sec"] > 0
    assert "images/s" in lines[-1] and any("ETA" in line for line in lines[:-1])


@pytest.mark.slow
def test_train_py_test_io_runs_without_a_model(digits_data, tmp_path):
    workspace = tmp_path / "ws"
    result = subprocess.run(
        [sys.executable, "train.py", "--data-backend", "mxnet", "--data-train", str(digits_data / "train.rec"),
         "--data-train-idx", str(digits_data / "train.idx"), "--batch-size", "64", "--image-shape", "3,32,32",
         "--num-examples", "640", "--test-io", "--workspace", str(workspace)], cwd=ROOT, env=venv_env(),
        capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert not workspace.exists()  # it writes nothing: no folder, no run lock (a training run there is not refused)
    assert "test-io train backend mxnet: 576 images" in result.stdout
    assert "INFO Timing the input pipeline (train) for resnet50_v1.5" in result.stderr  # no training, no epochs
    assert "Training" not in result.stderr and "epochs" not in result.stderr
    assert "recipe nvidia" not in result.stderr  # no LR is used, so none is explained


@pytest.mark.slow
def test_dali_gpu_without_gpu_is_a_one_line_error(digits_data):
    if mx.context.num_gpus():
        pytest.skip("this machine has a GPU")
    result = subprocess.run(
        [sys.executable, "train.py", "--data-backend", "dali-gpu", "--data-train", str(digits_data / "train.rec"),
         "--data-train-idx", str(digits_data / "train.idx"), "--test-io"],
        cwd=ROOT, env=venv_env(), capture_output=True, text=True)
    assert result.returncode == 2
    assert "error: --data-backend dali-gpu needs a GPU" in result.stderr and "Traceback" not in result.stderr


def test_label_order_measure(digits_data, sorted_rec):
    shuffled = records.RecordFile(str(digits_data / "train.rec"), str(digits_data / "train.idx"))
    assert not records.label_runs(shuffled.labels)["ordered"]  # im2rec shuffles its list
    by_class = np.sort(shuffled.labels)
    runs = records.label_runs(by_class)
    assert runs["ordered"] and runs["longest_run"] == np.bincount(by_class.astype(int)).max()
    # classes in blocks of 50, as an ImageNet list written per class folder would be
    blocks = np.repeat(np.random.RandomState(0).permutation(100), 50)
    assert records.label_runs(blocks)["ordered"]


def test_mxnet_backend_refuses_a_label_ordered_file_with_several_workers(tmp_path, digits_data):
    """ImageRecordIter gives each worker a contiguous part of the file: on a sorted file it is refused, with
    the fix; one worker (a permutation of the whole file) and a shuffled file are accepted."""
    digits = records.RecordFile(str(digits_data / "train.rec"), str(digits_data / "train.idx"))
    order = np.argsort(digits.labels, kind="stable")
    images = [cv2.imdecode(digits.image(i), cv2.IMREAD_COLOR) for i in order]
    rec, idx = write_record_file(str(tmp_path / "sorted"), images, digits.labels[order])
    args = parse_ordered(rec, idx, "--data-backend", "mxnet", "--data-mxnet-threads", "1", "--image-shape", "3,32,32")
    with pytest.raises(protocol.DataError) as error:
        loaders.get_data_iterators(train_config.from_args(args), 0, 2, 0, 1, mx.cpu())
    message = str(error.value)
    assert "label order" in message and "check_dataset.py" in message and "\n" not in message
    assert loaders.get_data_iterators(train_config.from_args(args), 0, 1, 0, 1, mx.cpu())[0] is not None
    shuffled = parse_ordered(str(digits_data / "train.rec"), str(digits_data / "train.idx"), "--data-backend", "mxnet",
                     "--data-mxnet-threads", "1", "--image-shape", "3,32,32")
    assert loaders.get_data_iterators(train_config.from_args(shuffled), 0, 2, 0, 1, mx.cpu())[0] is not None


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
    make = epoch_data.train_iterator_factory(cfg, dist, [mx.cpu()], first)
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
