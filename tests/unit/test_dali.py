"""dali: the pipelines against independent references (OpenCV + numpy for validation, geometry for augmentation),
the DALI-to-MXNet iterator, and the memory kinds of the copies out of DALI."""
import collections
import os
import threading

import cv2
import mxnet as mx
import numpy as np
import pytest
import sklearn.datasets

import dali
import train
from rn50kit.common import backends, rules
from rn50kit.config import train_config
from rn50kit.data import backend_dali, loaders, record_source, records
from support.datasets import write_record_file
from support.processes import wait_until


def val_labels(rec, idx, shard_id, num_shards, batch_size):
    pipe = dali.val_pipeline(rec_path=rec, idx_path=idx, shard_id=shard_id, num_shards=num_shards,
                             image_shape=(3, 16, 16), mean=[0, 0, 0], std=[1, 1, 1], resize_shorter=16,
                             batch_size=batch_size, num_threads=1, device_id=None, seed=1)
    pipe.build()
    total = dali.reader_epoch_size(pipe)
    iterator = backend_dali.DaliIterator(dali.DaliBatches(pipe, mx.cpu()),
                                         backend_dali.shard_size(total, shard_id, num_shards))
    epochs = []
    for _ in range(2):  # a second epoch must give the same samples again
        labels = []
        for batch in iterator:
            assert batch.data[0].shape == (batch_size, 3, 16, 16)
            valid = batch_size - batch.pad
            labels += batch.label[0][:valid].asnumpy().astype(int).tolist()
        epochs.append(labels)
    return epochs


@pytest.mark.parametrize("batch_size", [4, 7, 32])
def test_validation_sees_every_sample_exactly_once_over_two_ranks(unique_label_rec, batch_size):
    rec, idx, count = unique_label_rec
    per_rank = [val_labels(rec, idx, rank, 2, batch_size) for rank in range(2)]
    for epoch in range(2):
        seen = collections.Counter(per_rank[0][epoch] + per_rank[1][epoch])
        assert sorted(seen) == list(range(count))
        assert set(seen.values()) == {1}


def test_shard_size_matches_reader_split():
    assert sum(backend_dali.shard_size(53, s, 2) for s in range(2)) == 53
    assert [backend_dali.shard_size(10, s, 3) for s in range(3)] == [3, 3, 4]


def test_cpu_batches_are_shared_not_copied_and_outlive_later_batches(unique_label_rec):
    """A dali-cpu batch for mx.cpu() is DALI's own output memory (no copy on the step's thread): the same pixels as
    the copied path's (another CPU context copies), still intact 20 batches later, and freed by MXNet's engine when
    the last operation reading it ends, not while one is still pending."""
    import numpy as np
    rec, idx, _ = unique_label_rec

    def batches(ctx):
        pipe = dali.val_pipeline(rec_path=rec, idx_path=idx, shard_id=0, num_shards=1, image_shape=(3, 16, 16),
                                 mean=[0, 0, 0], std=[1, 1, 1], resize_shorter=16, batch_size=4, num_threads=1,
                                 device_id=None, seed=1)
        pipe.build()
        return dali.DaliBatches(pipe, ctx)
    shared, copied = batches(mx.cpu()), batches(mx.cpu(1))
    assert shared.share and not copied.share
    kept, pending = [], []
    slow = mx.nd.ones((400, 400))
    for step in range(24):
        (images, labels), (ref_images, ref_labels) = shared.next(), copied.next()
        assert images.context == mx.cpu() and ref_images.context == mx.cpu(1)
        np.testing.assert_array_equal(images.asnumpy(), ref_images.asnumpy())
        np.testing.assert_array_equal(labels.asnumpy(), ref_labels.asnumpy())
        if step < 4:
            kept.append((images, labels, images.asnumpy().copy(), labels.asnumpy().copy()))
        # reads still queued (behind a chain of matrix products) when our last reference goes: MXNet's engine
        # must free DALI's memory after them, not before
        delay = slow
        for _ in range(6):
            delay = mx.nd.dot(delay, slow) / 400
        gate = 1 + mx.nd.sum(delay) * 0  # 1, ready only when the chain is done
        pending.append((mx.nd.sum(mx.nd.broadcast_mul(images, gate.reshape((1, 1, 1, 1)))) * 2 +
                        mx.nd.sum(mx.nd.broadcast_mul(labels, gate)),
                        float(ref_images.asnumpy().sum()) * 2 + float(ref_labels.asnumpy().sum())))
        del images, labels
    for images, labels, image_copy, label_copy in kept:  # not overwritten by the 20 batches since
        np.testing.assert_array_equal(images.asnumpy(), image_copy)
        np.testing.assert_array_equal(labels.asnumpy(), label_copy)
    for total, expected in pending:
        assert abs(total.asscalar() - expected) <= 1e-4 * max(1.0, abs(expected))


def test_a_resize_pool_finalized_off_the_main_thread_ends_on_it():
    """The OpenCV resize pool ends with its pipeline; finalized on another thread (a collection inside
    pool.submit there would hold the lock shutdown takes) it is shut down by the main thread's next call."""
    import concurrent.futures
    import threading
    pool = concurrent.futures.ThreadPoolExecutor(1)
    worker = threading.Thread(target=dali._shut_down_pool, args=(pool,))
    worker.start()
    worker.join()
    assert pool.submit(int, "1").result() == 1  # still open
    dali.shut_down_finalized_pipelines()
    with pytest.raises(RuntimeError, match="shutdown"):
        pool.submit(int, "1")


PHOTOS = [cv2.imread(os.path.join(os.path.dirname(sklearn.datasets.__file__), "images", name))
          for name in ("china.jpg", "flower.jpg")]  # real 427x640 photographs (BGR)


MEAN, STD = [123.68, 116.779, 103.939], [58.393, 57.12, 57.375]


@pytest.fixture(scope="module")
def photo_rec(tmp_path_factory):
    """13 real-photo crops of assorted sizes and aspect ratios (portrait and landscape), labels 0..12."""
    rng = np.random.RandomState(0)
    images = []
    for k in range(13):
        photo = PHOTOS[k % 2]
        h, w = rng.randint(150, 427), rng.randint(150, 640)
        y, x = rng.randint(0, 428 - h), rng.randint(0, 641 - w)
        images.append(np.ascontiguousarray(photo[y:y + h, x:x + w]))
    rec, idx = write_record_file(str(tmp_path_factory.mktemp("photos") / "photos"), images, range(13), quality=90)
    return rec, idx, images


def reference_val(jpeg_bgr, resize_shorter, crop, shift=0):
    """Resize the shorter side (area filter: antialiased like DALI's), centre crop, normalize, CHW.
    ``shift`` moves the crop down by that many pixels (to measure what a one-pixel error costs)."""
    rgb = jpeg_bgr[:, :, ::-1].astype(np.float32)
    h, w = rgb.shape[:2]
    scale = resize_shorter / min(h, w)
    nh, nw = int(h * scale + 0.5), int(w * scale + 0.5)
    resized = cv2.resize(rgb, (nw, nh), interpolation=cv2.INTER_AREA)
    y0, x0 = (nh - crop + 1) // 2 + shift, (nw - crop + 1) // 2  # DALI rounds the centre offset half up
    out = (resized[y0:y0 + crop, x0:x0 + crop] - np.array(MEAN, np.float32)) / np.array(STD, np.float32)
    return out.transpose(2, 0, 1)


def run_val(rec, idx, dtype, layout, channels, batch_size=4):
    pipe = dali.val_pipeline(rec_path=rec, idx_path=idx, shard_id=0, num_shards=1, image_shape=(channels, 112, 112),
                             mean=MEAN, std=STD, dtype=dtype, layout=layout, resize_shorter=128,
                             batch_size=batch_size, num_threads=1, device_id=None, seed=1)
    pipe.build()
    iterator = backend_dali.DaliIterator(dali.DaliBatches(pipe, mx.cpu()), 13)
    outputs = {}
    for batch in iterator:
        images = batch.data[0].asnumpy()
        for i, label in enumerate(batch.label[0].asnumpy()[:batch_size - batch.pad].astype(int)):
            outputs[label] = images[i]
    return outputs


@pytest.mark.parametrize("dtype,layout,channels", [("float32", "NCHW", 3), ("float16", "NHWC", 4)])
def test_val_pipeline_matches_opencv(photo_rec, dtype, layout, channels):
    rec, idx, images = photo_rec
    outputs = run_val(rec, idx, dtype, layout, channels)
    assert sorted(outputs) == list(range(13))
    for label, image in enumerate(images):
        out = outputs[label]
        assert out.dtype == np.dtype(dtype)
        if layout == "NHWC":
            out = out.transpose(2, 0, 1)
        if channels == 4:
            assert not out[3].any()  # the padded channel is zero
            out = out[:3]
        decoded = cv2.imdecode(cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 90])[1], cv2.IMREAD_COLOR)
        error = mean_abs_error(out, reference_val(decoded, 128, 112))
        shifted = mean_abs_error(out, reference_val(decoded, 128, 112, shift=1))
        # Decoders and resampling filters differ a little; a crop one pixel off already costs 3x more.
        assert error < 4 and error < 0.6 * shifted, (label, image.shape, error, shifted)


def mean_abs_error(out, expected):
    """In 0..255 pixel units."""
    return float((np.abs(out.astype(np.float32) - expected) * np.array(STD)[:, None, None]).mean())


def coordinate_image(size=200):
    """R encodes x, G encodes y (0..255 across the image), so a crop's box can be read back from its pixels."""
    ramp = np.linspace(0, 255, size, dtype=np.float32)
    image = np.zeros((size, size, 3), np.float32)
    image[:, :, 2] = ramp[None, :]   # R (BGR order)
    image[:, :, 1] = ramp[:, None]   # G
    image[:, :, 0] = 128
    return np.round(image).astype(np.uint8)


def crop_boxes(batches, size=200, out=32):
    """For each output image: (area fraction, aspect ratio, flipped) of its source crop, from the ramps."""
    results = []
    inner = (2, out - 3)  # avoid the edge columns, where the resampling filter clamps
    scale = (size - 1) / 255 * out / (inner[1] - inner[0])
    for images in batches:
        for image in images:
            red, green = image[0].mean(axis=0), image[1].mean(axis=1)
            width = abs(red[inner[1]] - red[inner[0]]) * scale
            height = abs(green[inner[1]] - green[inner[0]]) * scale
            results.append((width * height / size ** 2, width / height, red[inner[1]] < red[inner[0]]))
    return np.array(results)


def run_train(rec, idx, area, mirror, fuse, batches=4, batch_size=64):
    source = record_source.ShuffledShardSource(records.RecordFile(rec, idx), 0, 1, batch_size, seed=7)
    pipe = dali.train_pipeline(source=source, image_shape=(3, 32, 32),
                               mean=[0, 0, 0], std=[1, 1, 1], random_area=area, random_mirror=mirror,
                               fuse_decoder=fuse, batch_size=batch_size, num_threads=1, device_id=None, seed=7)
    pipe.build()
    return [pipe.run()[0].as_array() for _ in range(batches)]


@pytest.fixture(scope="module")
def coordinate_rec(tmp_path_factory):
    image = coordinate_image()
    path = str(tmp_path_factory.mktemp("coords") / "coords")
    from mxnet import recordio
    writer = recordio.MXIndexedRecordIO(path + ".idx", path + ".rec", "w")
    jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 100,
                                        cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444])[1]
    for i in range(8):
        writer.write_idx(i, recordio.pack(recordio.IRHeader(0, 0, i, 0), jpeg.tobytes()))
    writer.close()
    return path + ".rec", path + ".idx"


@pytest.mark.parametrize("fuse", [True, False])
def test_train_crops_follow_configured_ranges(coordinate_rec, fuse):
    boxes = crop_boxes(run_train(*coordinate_rec, area=(0.08, 1.0), mirror=True, fuse=fuse))
    area, aspect, flipped = boxes[:, 0], boxes[:, 1], boxes[:, 2]
    assert area.min() > 0.08 * 0.85 and area.max() < 1.03, (area.min(), area.max())
    assert aspect.min() > 0.75 * 0.92 and aspect.max() < 4 / 3 * 1.08, (aspect.min(), aspect.max())
    assert area.min() < 0.2 and area.max() > 0.8  # the whole range is used, not one fixed crop
    assert aspect.min() < 0.85 and aspect.max() > 1.2
    assert 0.35 < flipped.mean() < 0.65  # 256 samples: about half flipped


def test_train_crop_flags_are_honoured(coordinate_rec):
    boxes = crop_boxes(run_train(*coordinate_rec, area=(0.5, 1.0), mirror=False, fuse=True, batches=2))
    assert boxes[:, 0].min() > 0.5 * 0.9
    assert not boxes[:, 2].any()  # --random-mirror 0: never flipped


def test_gpu_pipeline_matches_cpu_pipeline(photo_rec):
    """On a GPU: nvJPEG's batches against the CPU pipeline's. Without one (this MXNet build, CI): the backend is
    refused in one line before any pipeline is built, and tools/gpu_check.py runs this comparison on GPUs."""
    if mx.context.num_gpus() == 0:
        assert "needs a GPU" in rules.backend_problem("dali-gpu", gpu=False)
        assert rules.backend_problem("dali-cpu", gpu=False) is None
        return
    rec, idx, _ = photo_rec
    cpu = run_val(rec, idx, "float32", "NCHW", 3)
    pipe = dali.val_pipeline(rec_path=rec, idx_path=idx, shard_id=0, num_shards=1, image_shape=(3, 112, 112),
                             mean=MEAN, std=STD, resize_shorter=128, device="gpu", batch_size=4, num_threads=1,
                             device_id=0, seed=1)
    pipe.build()
    for batch in backend_dali.DaliIterator(dali.DaliBatches(pipe, mx.gpu(0)), 13):
        assert batch.data[0].context == mx.gpu(0)
        images = batch.data[0].asnumpy()
        for i, label in enumerate(batch.label[0].asnumpy()[:4 - batch.pad].astype(int)):
            # nvJPEG and libjpeg-turbo differ in IDCT and chroma upsampling: compare loosely.
            assert np.abs(images[i] - cpu[label]).mean() * 58 < 4


def test_opencv_resize_matches_dalis(photo_rec):
    """The CPU training pipeline's OpenCV resize (the default) against DALI's own fn.resize: the same crop windows
    and flips from the same seed, and pixels within one grey level; on one thread and on two (the resize pool)."""
    rec, idx, _ = photo_rec
    outputs = {}
    for cpu_resize, threads in [("dali", 1), ("opencv", 1), ("opencv", 2)]:
        source = record_source.ShuffledShardSource(records.RecordFile(rec, idx), 0, 1, 8, seed=3)
        pipe = dali.train_pipeline(source=source, image_shape=(3, 96, 96), mean=[0, 0, 0], std=[1, 1, 1],
                                   cpu_resize=cpu_resize, batch_size=8, num_threads=threads, device_id=None, seed=5)
        pipe.build()
        outputs[cpu_resize, threads] = [[np.array(part.as_array()) for part in pipe.run()] for _ in range(3)]
    reference = outputs["dali", 1]
    for key in [("opencv", 1), ("opencv", 2)]:
        for (images, labels), (ref_images, ref_labels) in zip(outputs[key], reference):
            np.testing.assert_array_equal(labels, ref_labels)
            difference = np.abs(images - ref_images)
            assert difference.max() <= 1.0 + 1e-4, key
            assert difference.mean() < 0.3, key  # rounding only: most pixels equal


def test_resize_threads_end_with_their_pipeline(photo_rec):
    """A pipeline is built per epoch: the OpenCV resize's threads of each go with it, not with the next collection
    of DALI's reference cycles."""
    rec, idx, _ = photo_rec

    def resize_threads():
        return {t for t in threading.enumerate() if t.name.startswith("opencv-resize") and t.is_alive()}
    for epoch in range(3):
        before = resize_threads()  # (other tests' pipelines may still be collected)
        source = record_source.ShuffledShardSource(records.RecordFile(rec, idx), 0, 1, 8, seed=epoch)
        pipe = dali.train_pipeline(source=source, image_shape=(3, 64, 64), mean=[0, 0, 0], std=[1, 1, 1],
                                   batch_size=8, num_threads=2, device_id=None, seed=epoch)
        pipe.build()
        pipe.run()  # as DaliBatches runs it: the outputs are copied out and dropped
        new = resize_threads() - before
        assert 1 <= len(new) <= 2
        del pipe, source
        wait_until(lambda new=new: not resize_threads() & new, "the resize threads of a pipeline let go to end")


def test_resize_after_its_pool_shut_down():
    """A batch still in flight when the pool has gone (interpreter exit) is resized on DALI's thread, not failed."""
    @dali.pipeline_def(batch_size=1, num_threads=2, device_id=None)
    def owner():
        return dali.fn.random.uniform(range=[0, 1])
    pipe = owner()
    resize = dali._OpenCVResize((24, 16), pipe)
    resize.pool.shutdown()
    image = PHOTOS[0][:50, :60]
    [out] = resize([image])
    np.testing.assert_array_equal(out, cv2.resize(image, (24, 16), interpolation=cv2.INTER_LINEAR))


# --- --dali-normalize device: uint8 crops out of the pipeline, normalized by MXNet after the hand-over ---------

TRAIN_VARIANTS = {"train": {}, "train, DALI's resize": {"cpu_resize": "dali"},
                  "train, unfused": {"fuse_decoder": False}}


def pipeline_batches(kind, normalize, image_shape, dtype, layout, rec, idx, count=3, share=True):
    """``count`` batches (numpy images, labels) of a seeded CPU pipeline through DaliBatches to the CPU, normalized
    in the pipeline (DALI's crop_mirror_normalize) or after it (dali.DeviceNormalize); ``share=False``: copied into
    reused arrays first, as a GPU's batch is into pinned memory."""
    common = dict(image_shape=image_shape, mean=MEAN, std=STD, dtype=dtype, layout=layout, batch_size=8,
                  num_threads=2, device_id=None, seed=11, normalize=normalize)
    if kind in TRAIN_VARIANTS:
        source = record_source.ShuffledShardSource(records.RecordFile(rec, idx), 0, 1, 8, seed=3)
        pipe = dali.train_pipeline(source=source, **TRAIN_VARIANTS[kind], **common)
    else:
        pipe = dali.val_pipeline(rec_path=rec, idx_path=idx, shard_id=0, num_shards=1, resize_shorter=128,
                                 **common)
    pipe.build()
    after = None if normalize else dali.DeviceNormalize(image_shape, MEAN, STD, dtype, layout)
    batches = dali.DaliBatches(pipe, mx.cpu(), normalize=after, share=share)
    out = []
    for _ in range(count):
        images, labels = batches.next()
        out.append((images.asnumpy(), labels.asnumpy()))
    return out


@pytest.mark.parametrize("kind,dtype,layout,channels", [
    (kind, *case) for kind in ("train", "val")
    for case in [("float32", "NCHW", 3), ("float16", "NHWC", 4), ("float32", "NHWC", 3), ("float16", "NCHW", 4)]] + [
    (kind, "float32", "NCHW", 3) for kind in ("train, DALI's resize", "train, unfused", "train, copied")])
def test_normalizing_after_the_pipeline_gives_dalis_batches(photo_rec, kind, dtype, layout, channels):
    """The same seeded pipeline, normalized by DALI's crop_mirror_normalize or by MXNet after the hand-over (what
    a GPU gets by default from dali-cpu): the same crops, flips (the training pipeline mirrors half of them: with
    OpenCV's resize, with DALI's, or after an unfused crop), labels, dtype, layout and zero fourth channel, values
    within float rounding; also when the uint8 batch is copied first. (With colour jitter or automatic augmentation
    the flip comes before them: the same distribution, other random draws.)"""
    rec, idx, _ = photo_rec
    shape = (channels, 112, 112) if kind == "val" else (channels, 96, 96)
    share = kind != "train, copied"  # the uint8 batch copied into a reused slot, then normalized
    kind = "train" if kind == "train, copied" else kind
    in_pipeline = pipeline_batches(kind, True, shape, dtype, layout, rec, idx)
    after = pipeline_batches(kind, False, shape, dtype, layout, rec, idx, share=share)
    tolerance = 1e-5 if dtype == "float32" else 4e-3  # float16 spacing near |x| = 2.6 is 2e-3
    for (images, labels), (ref_images, ref_labels) in zip(after, in_pipeline):
        np.testing.assert_array_equal(labels, ref_labels)
        assert images.dtype == ref_images.dtype == np.dtype(dtype) and images.shape == ref_images.shape
        np.testing.assert_allclose(images.astype(np.float32), ref_images.astype(np.float32), rtol=0, atol=tolerance)
        assert np.abs(ref_images).max() > 1.5  # normalized, not 0..255 nor 0..1
        if channels == 4:
            assert not np.take(images, 3, axis=layout.index("C")).any()


def test_dali_normalize_flag_picks_where(photo_rec):
    """--dali-normalize through loaders.get_data_iterators: "device" on the CPU hands over uint8 crops and
    normalizes them after; "auto" keeps DALI's on the CPU and moves it off the pipeline for a GPU (mx.gpu(0) is only
    named here: the choice is made before any array exists on it); the batches are the same."""
    rec, idx, _ = photo_rec
    first = {}
    for where in ("pipeline", "device", "auto"):
        args = train.parse_args(["--data-backend", "dali-cpu", "--data-val", rec, "--data-val-idx", idx,
                                 "--batch-size", "4", "--image-shape", "3,64,64", "--data-val-resize", "72",
                                 "--dali-threads", "1", "--dali-validation-threads", "1", "--dali-normalize", where])
        _, val_iter = loaders.get_data_iterators(train_config.from_args(args), 0, 1, 0, 1, mx.cpu())
        first[where] = (val_iter.batches.normalize, next(iter(val_iter)).data[0].asnumpy())
    assert first["pipeline"][0] is None and first["auto"][0] is None
    assert isinstance(first["device"][0], dali.DeviceNormalize)
    np.testing.assert_allclose(first["device"][1], first["pipeline"][1], rtol=0, atol=1e-5)
    assert dali.normalizes_on_device("auto", "cpu", mx.gpu(0))
    assert not dali.normalizes_on_device("device", "gpu", mx.gpu(0))  # dali-gpu normalizes on its GPU anyway


# --- 1: a CPU pipeline's batch for a GPU is staged in pinned host memory, then copied to the GPU -------------

CONTEXTS = [mx.cpu(), mx.cpu(1), mx.gpu(0), mx.gpu(3)]


@pytest.mark.parametrize("backend", [name for name in backends.NAMES
                                     if backends.get(name).builder.startswith("rn50kit.data.backend_dali:")])
@pytest.mark.parametrize("ctx", CONTEXTS, ids=str)
def test_every_dali_copy_has_source_and_destination_of_one_memory_kind(backend, ctx):
    """Found by the second review of the GPU paths (issue 21)."""
    source = backends.get(backend).pipeline_device
    if source == "gpu" and ctx.device_type != "gpu":
        with pytest.raises(ValueError, match="dali-cpu"):  # get_dali_iterators refuses it before, too
            dali.staging_context(source, ctx)
        return
    staging = dali.staging_context(source, ctx)
    dali.check_copy(source, staging)  # the guard every copy_to_external passes
    assert dali.memory_kind(staging) == source
    if source == "cpu" and ctx.device_type == "gpu":
        assert staging == mx.cpu_pinned(ctx.device_id)


def test_the_guard_refuses_a_host_copy_into_device_memory():
    """Found by the second review of the GPU paths (issue 21)."""
    with pytest.raises(AssertionError, match="cpu output copied into gpu"):
        dali.check_copy("cpu", mx.gpu(0))
    with pytest.raises(AssertionError):
        dali.check_copy("gpu", mx.cpu_pinned(0))


def test_dali_cpu_batches_for_a_gpu_rank_go_through_pinned_memory(unique_label_rec, monkeypatch):
    """A real dali-cpu pipeline handed a GPU context (mx.gpu(0): allocations for it are made on the CPU here, and
    recorded): every copy out of DALI writes host memory, then the batch is copied to the arrays made for gpu(0).
    Found by the second review of the GPU paths (issue 21)."""
    rec, idx, _ = unique_label_rec
    pipe = dali.val_pipeline(rec_path=rec, idx_path=idx, shard_id=0, num_shards=1, image_shape=(3, 16, 16),
                             mean=[0, 0, 0], std=[1, 1, 1], resize_shorter=16, batch_size=4, num_threads=1,
                             device_id=None, seed=1)
    pipe.build()
    made_for, copies = {}, []
    real_matching, real_copy = dali._matching, dali._copy_into

    def matching(out, tensor, ctx):
        array = real_matching(None, tensor, mx.cpu() if ctx.device_type == "gpu" else ctx)
        made_for[id(array)] = ctx
        return array

    def copy_into(tensor, out):
        copies.append((dali.source_kind(tensor), made_for[id(out)]))
        dali.check_copy(dali.source_kind(tensor), made_for[id(out)])
        real_copy(tensor, out)

    monkeypatch.setattr(dali, "_matching", matching)
    monkeypatch.setattr(dali, "_copy_into", copy_into)
    batches = dali.DaliBatches(pipe, mx.gpu(0))
    images, labels = batches.next()
    assert copies == [("cpu", mx.cpu_pinned(0)), ("cpu", mx.cpu_pinned(0))]
    assert made_for[id(images)] == mx.gpu(0)
    assert images.shape == (4, 3, 16, 16) and labels.shape == (4,)
    reference = dali.DaliBatches(pipe, mx.cpu())
    assert reference.next()[0].shape == images.shape
