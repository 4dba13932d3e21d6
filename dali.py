"""DALI pipelines reading ImageNet RecordIO, and the hand-over of their outputs to MXNet NDArrays.

DALI 2.x ships no MXNet plugin (it ended with DALI 1.39), so `DaliBatches` hands DALI's outputs to MXNet itself:
a CPU pipeline's batch for the CPU as it is (an NDArray on DALI's memory, no copy), a GPU pipeline's by copying
straight into the NDArray's device memory, a CPU pipeline's for a GPU into pinned host memory, then to the GPU (by
default as uint8 crops, normalized there by DeviceNormalize).
Imports nothing of the kit:
rn50kit/data/backend_dali.py imports this module only when a DALI backend is chosen, and builds the iterators from it.
"""
import atexit
import concurrent.futures
import contextlib
import ctypes
import gc
import os
import re
import threading
import warnings
import weakref

import mxnet as mx
import numpy as np
from nvidia.dali import Pipeline, fn, pipeline_def, types

READER_NAME = "Reader"

_finalized_off_main = []  # pipelines and resize pools finalized off the main thread, shut down by it later
_dali_pipeline_del = Pipeline.__del__


def _on_main_thread():
    return threading.get_ident() == threading.main_thread().ident


def _pipeline_del(pipeline):
    """DALI 2.4's Pipeline.__del__ shuts the pipeline down, joining its threads. A garbage collection can run it on
    any thread: on one of those threads (one running a python_function, such as the OpenCV resize) the join fails
    (std::system_error "Resource deadlock avoided") and std::terminate aborts the process; on a thread they wait for
    (the resize pool) it hangs. It happens to a pipeline in a reference cycle (a traceback's frames, say) dropped
    while it still works ahead. Off the main thread the pipeline is kept instead, and the main thread shuts it down
    at its next batch, at the next iterators' build, or at exit (shut_down_finalized_pipelines; DALI's own exit
    handler no longer knows it: the collection cleared its weak reference)."""
    if _on_main_thread():
        _dali_pipeline_del(pipeline)
    else:
        _finalized_off_main.append(pipeline)  # alive again: __del__ will not run a second time


def _shut_down_pool(pool):
    """The resize pool's end, with its pipeline's: on the main thread now; elsewhere later, as for the pipeline (a
    collection inside pool.submit on a worker holds the pool's lock that shutdown takes: it would hang)."""
    if _on_main_thread():
        pool.shutdown(wait=False)
    else:
        _finalized_off_main.append(pool)


def shut_down_finalized_pipelines():
    """On the main thread: shut down the pipelines (and resize pools) finalized elsewhere (see _pipeline_del). A
    failure to shut one down is a warning, not the caller's error."""
    if not _on_main_thread():
        return
    while _finalized_off_main:
        finalized = _finalized_off_main.pop(0)
        try:
            if isinstance(finalized, Pipeline):
                finalized._shutdown()
            else:
                finalized.shutdown(wait=False)
        except Exception as error:  # noqa: BLE001 (whatever DALI raises, the batch being drawn is not at fault)
            warnings.warn(f"a DALI pipeline finalized off the main thread did not shut down cleanly: {error}")


def _shut_down_at_exit():
    gc.collect()  # what is still in cycles is finalized here, on the main thread, not by a DALI thread later
    shut_down_finalized_pipelines()


Pipeline.__del__ = _pipeline_del
atexit.register(_shut_down_at_exit)  # runs before DALI's handler, registered at its import

# DALI's decoder (nvImageCodec) writes its own messages to stderr in ANSI colours, warnings included, which in a
# log file are escape codes around lines about images it decodes anyway. The kit keeps its errors only (1, the
# lowest DALI allows); a failing image is then named in one line by the kit (rn50kit/data/record_files.py).
# DALI_NVIMGCODEC_LOG_LEVEL=2..5 by hand brings the rest back. Read when a decoder is built, so setting it here,
# before any pipeline, is in time.
os.environ.setdefault("DALI_NVIMGCODEC_LOG_LEVEL", "1")


def _normalize(images, image_shape, mean, std, dtype, layout, mirror, crop=True):
    channels, height, width = image_shape
    return fn.crop_mirror_normalize(
        images, dtype=types.FLOAT16 if dtype == "float16" else types.FLOAT,
        output_layout="HWC" if layout == "NHWC" else "CHW", crop=(height, width) if crop else None,
        mean=list(mean), std=list(std), mirror=mirror, pad_output=channels == 4)


NORMALIZE_WHERE = ("auto", "pipeline", "device")


def normalizes_on_device(where, pipeline_device, ctx):
    """Whether a pipeline's crops leave it as uint8 HWC, normalized after the hand-over by MXNet on ``ctx``
    (DeviceNormalize), for ``where`` (--dali-normalize). "auto": for a CPU pipeline feeding a GPU, whose copy then
    carries a quarter of float32's bytes and whose normalization costs the GPU next to nothing (timm's
    PrefetchLoader and NVIDIA's PyTorch ResNet-50 loader do the same); a CPU keeps DALI's crop_mirror_normalize,
    twice as fast there as MXNet's image.to_tensor and image.normalize. A GPU pipeline normalizes on its GPU."""
    if where not in NORMALIZE_WHERE:
        raise ValueError(f"unknown --dali-normalize {where!r}; choose one of {', '.join(NORMALIZE_WHERE)}")
    if pipeline_device == "gpu":
        return False
    return ctx.device_type == "gpu" if where == "auto" else where == "device"


class DeviceNormalize:
    """What crop_mirror_normalize does at a pipeline's end, done by MXNet on the batch's own device: a batch of
    uint8 NHWC crops to (x - mean) / std, float32 (float16 for ``dtype`` float16), NCHW or NHWC, with a fourth
    channel of zeros for a 4-channel ``image_shape`` (DALI's pad_output)."""

    def __init__(self, image_shape, mean, std, dtype="float32", layout="NCHW"):
        self.channels = image_shape[0]
        self.mean, self.std = [float(m) for m in mean], [float(s) for s in std]
        self.dtype = "float16" if dtype == "float16" else "float32"
        self.layout = layout
        self._constants = {}  # context -> (mean, 1 / std) shaped to broadcast over NHWC

    def __call__(self, images):
        if self.layout == "NCHW":  # MXNet's image operators: NHWC uint8 -> NCHW float32 / 255, then per channel
            out = mx.nd.image.normalize(mx.nd.image.to_tensor(images), mean=tuple(m / 255 for m in self.mean),
                                        std=tuple(s / 255 for s in self.std))
        else:
            mean, inverse_std = self._nhwc_constants(images.context)
            out = mx.nd.broadcast_mul(mx.nd.broadcast_sub(images.astype("float32"), mean), inverse_std)
        if self.dtype != "float32":
            out = out.astype(self.dtype)
        if self.channels == 4:
            axis = 1 if self.layout == "NCHW" else 3
            shape = list(out.shape)
            shape[axis] = 1
            out = mx.nd.concat(out, mx.nd.zeros(shape, ctx=out.context, dtype=self.dtype), dim=axis)
        return out

    def _nhwc_constants(self, ctx):
        if ctx not in self._constants:
            self._constants[ctx] = (mx.nd.array(self.mean, ctx=ctx).reshape((1, 1, 1, -1)),
                                    mx.nd.array([1 / s for s in self.std], ctx=ctx).reshape((1, 1, 1, -1)))
        return self._constants[ctx]


AUTO_AUGMENT = ("none", "autoaugment", "randaugment", "trivialaugment")


def _auto_augment(images, policy, shape, randaugment=(2, 9)):
    """DALI 2.4's nvidia.dali.auto_aug on uint8 HWC images (the pipeline needs ``enable_conditionals=True``):
    AutoAugment's ImageNet policy, RandAugment (n operations of magnitude m of 31 bins), TrivialAugment Wide.
    Translations are relative to ``shape`` (height, width); warps fill with grey 128, as timm does."""
    from nvidia.dali.auto_aug import auto_augment, rand_augment, trivial_augment
    if policy not in AUTO_AUGMENT[1:]:
        raise ValueError(f"unknown automatic augmentation {policy!r}; choose one of {', '.join(AUTO_AUGMENT)}")
    with _without_dali_alias_warnings():
        if policy == "autoaugment":
            return auto_augment.auto_augment_image_net(images, shape=shape)
        if policy == "randaugment":
            n, m = randaugment
            return rand_augment.rand_augment(images, n=n, m=m, shape=shape)
        return trivial_augment.trivial_augment_wide(images, shape=shape)


@contextlib.contextmanager
def _without_dali_alias_warnings():
    """DALI 2.4's own policies still call fn.experimental.equalize/filter, deprecated aliases: a DeprecationWarning
    of three lines per call, hundreds per run, about DALI's code, not the user's. DALI raises them inside its own
    ``catch_warnings`` with a "default" filter, so a filter cannot hold them back; the display step can."""
    show = warnings.showwarning

    def show_others(message, category, *where, **more):
        if not (issubclass(category, DeprecationWarning) and _DALI_ALIAS.search(str(message))):
            show(message, category, *where, **more)
    warnings.showwarning = show_others
    try:
        yield
    finally:
        warnings.showwarning = show


_DALI_ALIAS = re.compile(r"fn\.experimental\.\w+` is now deprecated")


def _color_jitter(images, jitter):
    """Brightness, contrast and saturation factors drawn uniformly from [max(0, 1 - j), 1 + j] per image
    (torchvision's ColorJitter ranges, applied in this fixed order); a 0 leaves that one out."""
    factors = {name: fn.random.uniform(range=[max(0.0, 1 - j), 1 + j])
               for name, j in zip(("brightness", "contrast", "saturation"), jitter) if j > 0}
    return fn.color_twist(images, **factors) if factors else images


def decoder_options(device, nvjpeg_padding_mb):
    """A DALI image decoder's arguments: RGB, on the CPU or on the GPU (nvJPEG, ``mixed``, with its memory padding)."""
    if device != "gpu":
        return {"device": "cpu", "output_type": types.RGB}
    return {"device": "mixed", "output_type": types.RGB, "device_memory_padding": nvjpeg_padding_mb << 20,
            "host_memory_padding": nvjpeg_padding_mb << 20}


def decode_crop_window(jpegs, random_area, random_aspect_ratio, device="cpu", nvjpeg_padding_mb=64):
    """The training pipeline's first operator: only a random crop window of each image is decoded (area and aspect
    ratio ranges as RandomResizedCrop's). tools/bench_io.py times it alone."""
    return fn.decoders.image_random_crop(jpegs, random_area=list(random_area),
                                         random_aspect_ratio=list(random_aspect_ratio),
                                         **decoder_options(device, nvjpeg_padding_mb))


class _OpenCVResize:
    """A batch of uint8 HWC images to ``size`` (width, height), bilinear without antialiasing, each flipped
    left-right where ``flips`` (the python_function's second input, if given) is 1, over a pool of as
    many threads as ``pipeline`` has (cv2.resize releases the GIL). The pool is the pipeline's own, so the pipelines
    of several devices resize at once, and it ends with the pipeline (one is built per epoch), not with this object,
    which DALI's python_function keeps in a reference cycle until the next garbage collection."""

    def __init__(self, size, pipeline):
        import cv2
        cv2.setNumThreads(1)  # from ~314 px up cv2.resize would also spread over a pool of every core: ours suffice
        self.cv2, self.size = cv2, size
        self.pool = None
        if pipeline.num_threads > 1:
            self.pool = concurrent.futures.ThreadPoolExecutor(pipeline.num_threads, thread_name_prefix="opencv-resize")
            weakref.finalize(pipeline, _shut_down_pool, self.pool)

    def one(self, image, flip=0):
        out = self.cv2.resize(image, self.size, interpolation=self.cv2.INTER_LINEAR)
        return self.cv2.flip(out, 1) if flip else out

    def __call__(self, images, flips=None):
        flips = [0] * len(images) if flips is None else flips
        if self.pool is not None:
            try:
                return list(self.pool.map(self.one, images, flips))
            except RuntimeError:  # the pool already shut down (interpreter exit, a batch still in flight)
                pass
        return [self.one(image, flip) for image, flip in zip(images, flips)]


def resize_crops(images, height, width, device="cpu", cpu_resize="opencv", mirror=None):
    """Each crop window to height x width, bilinear without an antialiasing filter, flipped left-right where
    ``mirror`` (a 0/1 per sample, or None) says. On the CPU OpenCV's resize by default, in a DALI python_function:
    the same pixels as DALI's fn.resize (within one grey level) at a quarter of its time (0.23 vs about 1 ms per
    224 px image: DALI 2.4's CPU resampler is scalar code), which took the CPU pipeline on one core from 0.42 to
    0.69-0.85 of decoding alone; its flip is cv2.flip in the same call. On the GPU, DALI's."""
    if device == "gpu" or cpu_resize == "dali":
        images = fn.resize(images, resize_x=width, resize_y=height, antialias=False)
        return images if mirror is None else fn.flip(images, horizontal=mirror)
    inputs = (images,) if mirror is None else (images, mirror)
    return fn.python_function(*inputs, function=_OpenCVResize((width, height), Pipeline.current()),
                              batch_processing=True, output_layouts="HWC")


@pipeline_def
def train_pipeline(source, image_shape, mean, std, dtype="float32", layout="NCHW", device="cpu",
                   random_area=(0.08, 1.0), random_aspect_ratio=(0.75, 4 / 3), random_mirror=True, fuse_decoder=True,
                   nvjpeg_padding_mb=64, auto_augment="none", randaugment=(2, 9), color_jitter=(0.0, 0.0, 0.0),
                   cpu_resize="opencv", normalize=True):
    # The records come from ``source`` (a ShuffledShardSource), not fn.readers.mxnet: the reader gives each
    # shard a contiguous range of the file and shuffles only within a 1024-record window, so on a file stored
    # in label order each worker would see a few classes (see ShuffledShardSource).
    jpegs, labels = fn.external_source(source=source, num_outputs=2, batch=True, dtype=[types.UINT8, types.FLOAT])
    _, height, width = image_shape
    # Training resizes bilinearly without an antialiasing filter (as ImageRecordIter does): on CPU the filter
    # costs about a third of the pipeline's throughput, and a random crop is an augmentation anyway.
    # Validation keeps DALI's antialiased resize: it is what accuracy is measured on.
    mirror = fn.random.coin_flip(probability=0.5) if random_mirror else None
    # Crops that leave as uint8 (normalize=False: DeviceNormalize does the rest) are flipped with the fused
    # decoder's resize (OpenCV's: about 9 % faster than fn.flip after it, README), before automatic augmentation
    # and jitter, whose distributions are left-right symmetric (the same distribution, other random draws).
    flip_with_resize = mirror is not None and not normalize and fuse_decoder
    if fuse_decoder:
        images = decode_crop_window(jpegs, random_area, random_aspect_ratio, device, nvjpeg_padding_mb)
        images = resize_crops(images, height, width, device, cpu_resize, mirror if flip_with_resize else None)
    else:
        images = fn.decoders.image(jpegs, **decoder_options(device, nvjpeg_padding_mb))
        images = fn.random_resized_crop(images, size=(height, width), random_area=list(random_area),
                                        random_aspect_ratio=list(random_aspect_ratio), antialias=False)
    if auto_augment != "none":  # built with enable_conditionals=True (see needs_conditionals)
        images = _auto_augment(images, auto_augment, (height, width), randaugment)
    images = _color_jitter(images, color_jitter)
    if normalize:
        images = _normalize(images, image_shape, mean, std, dtype, layout, 0 if mirror is None else mirror)
    elif mirror is not None and not flip_with_resize:
        images = fn.flip(images, horizontal=mirror)
    return images, labels.gpu() if device == "gpu" else labels


def needs_conditionals(auto_augment):
    """DALI's automatic augmentations choose operations per sample with conditionals, which a pipeline has only
    when built with ``enable_conditionals=True`` (kept off otherwise: it traces the pipeline function)."""
    return auto_augment != "none"


@pipeline_def
def val_pipeline(rec_path, idx_path, shard_id, num_shards, image_shape, mean, std, dtype="float32",
                 layout="NCHW", device="cpu", resize_shorter=256, nvjpeg_padding_mb=64, dont_use_mmap=False,
                 normalize=True):
    # pad_last_batch + stick_to_shard: each shard's epoch ends on a batch boundary (the tail is padded with
    # copies of its last sample, which DaliIterator trims), so every sample is seen exactly once.
    jpegs, labels = fn.readers.mxnet(path=[rec_path], index_path=[idx_path], shard_id=shard_id,
                                     num_shards=num_shards, random_shuffle=False, pad_last_batch=True,
                                     stick_to_shard=True, dont_use_mmap=dont_use_mmap, name=READER_NAME)
    images = fn.decoders.image(jpegs, **decoder_options(device, nvjpeg_padding_mb))
    # Resize the shorter side, centre crop: fused, so only the cropped pixels are resampled (about 1.5x
    # faster on CPU than resizing the whole image, same output).
    _, height, width = image_shape
    images = fn.resize_crop_mirror(images, resize_shorter=resize_shorter, crop=(height, width))
    if normalize:
        images = _normalize(images, image_shape, mean, std, dtype, layout, mirror=0, crop=False)
    return images, labels.gpu() if device == "gpu" else labels


def source_kind(dali_tensor):
    """Where a DALI output lives: "gpu" (TensorGPU, TensorListGPU) or "cpu" (host memory)."""
    return "gpu" if type(dali_tensor).__name__.endswith("GPU") else "cpu"


def memory_kind(ctx):
    """The memory an MXNet context's arrays live in, as DALI sees it: "gpu" for a GPU, "cpu" for host memory
    (cpu and cpu_pinned)."""
    return "gpu" if ctx.device_type == "gpu" else "cpu"


def staging_context(source, ctx):
    """Where ``copy_to_external`` writes a batch of a pipeline whose outputs are on ``source`` ("cpu"/"gpu") for
    arrays wanted on ``ctx``: the memory of the source's kind (DALI's TensorCPU.copy_to_external is a host memcpy,
    TensorGPU's a device copy: backend_impl.cc, CopyToExternal<host>/<device>). A CPU pipeline's batch for a GPU
    is staged in pinned host memory on that GPU's side, then copied to the GPU by MXNet (an asynchronous copy)."""
    if source == "cpu":
        return mx.cpu_pinned(ctx.device_id) if memory_kind(ctx) == "gpu" else ctx
    if memory_kind(ctx) != "gpu":
        raise ValueError(f"a GPU pipeline's batch cannot go to {ctx}: use --data-backend dali-cpu")
    return ctx


def check_copy(source, out_ctx):
    """The guard of every copy out of DALI: source and destination memory of the same kind (a host memcpy into a
    device pointer is a segfault, not an error message)."""
    if source != memory_kind(out_ctx):
        raise AssertionError(f"DALI {source} output copied into {out_ctx} memory ({memory_kind(out_ctx)})")


def _copy_into(dali_tensor, out):
    """Copy one DALI batch (a dense TensorList) into the NDArray ``out``, in one copy into its own buffer, as
    DALI's old MXNet plugin did: host to host (``out`` in host or pinned memory) for a CPU pipeline, device to
    device for dali-gpu (no round trip through the host). The copy is synchronous, so DALI may reuse its buffer
    afterwards."""
    check_copy(source_kind(dali_tensor), out.context)
    mx.base._LIB.MXNDArrayWaitToWrite(out.handle)  # waits until MXNet's pending reads of ``out`` are done
    pointer = ctypes.c_void_p()
    mx.base._LIB.MXNDArrayGetData(out.handle, ctypes.byref(pointer))
    dali_tensor.copy_to_external(pointer)


def _matching(out, tensor, ctx):
    """``out`` if it fits ``tensor``, else a new NDArray on ``ctx`` that does."""
    shape, dtype = tuple(tensor.shape()), _DALI_TO_NUMPY[tensor.dtype]
    if out is None or out.shape != shape or out.dtype != np.dtype(dtype):
        out = mx.nd.empty(shape, ctx=ctx, dtype=dtype)
    return out


_DALI_TO_NUMPY = {types.FLOAT: "float32", types.FLOAT16: "float16", types.INT32: "int32",
                  types.UINT8: "uint8", types.INT64: "int64"}


class DaliBatches:
    """Runs a built DALI pipeline and hands each batch (images, labels) to MXNet as NDArrays on ``ctx``.

    A CPU pipeline's batch for ``mx.cpu()`` is taken as it is, without a copy: an NDArray on DALI's own output
    memory (DLPack), which DALI's dynamic executor keeps valid for as long as the NDArray lives, as DALI's PyTorch
    plugin takes its outputs (DALI 1.44's zero-copy outputs). The copy cost 0.15 ms an image of a 224 px float32
    batch on the step's thread (bench_io.py --handover). Such a batch holds DALI's memory until MXNet is done with
    it, so a consumer bounds how far it runs ahead: the kit's loops read a result of every step (the loss, the
    top-k counts), and test_io waits for each batch.

    Otherwise batches are copied into ``buffers`` sets of NDArrays used in turn, as DALI's old plugin and MXNet's
    own iterators do (a fresh 40 MB array per batch costs a third of the CPU pipeline's speed in page faults): a
    batch stays valid until ``buffers`` more are drawn; copy it to keep it longer. A CPU pipeline's batch for a GPU
    goes through pinned host buffers (``staging_context``), then to the GPU.

    ``normalize`` (a DeviceNormalize, for a pipeline built with normalize=False) turns the uint8 crops into the
    network's input on ``ctx`` once handed over; its result is a new array each batch, not one of the buffers.
    """

    def __init__(self, pipeline, ctx, buffers=2, share=True, normalize=None):
        self.pipeline = pipeline
        self.batch_size = pipeline.max_batch_size
        self.ctx = ctx
        # DLPack's CPU arrays come to MXNet as cpu(0); another CPU context (--cpu-contexts) takes the copy.
        # share=False: always copy (bench_io.py --handover times both).
        self.share = bool(share and pipeline.exec_dynamic and ctx == mx.cpu(0))
        self._slots = [[None, None] for _ in range(max(1, buffers))]  # the arrays copy_to_external writes
        self._device = [[None, None] for _ in range(max(1, buffers))]  # their copies on ctx, when staged
        self._next_slot = 0
        self.normalize = normalize  # DeviceNormalize, for a pipeline built with normalize=False

    def next(self):
        """(images, labels) of the next batch; a pipeline failure (e.g. an image that does not decode) raises
        DALI's RuntimeError."""
        shut_down_finalized_pipelines()
        images, labels = self.pipeline.run()
        index = self._next_slot
        slot, device = self._slots[index], self._device[index]
        self._next_slot = (self._next_slot + 1) % len(self._slots)
        out = []
        for i, tensor_list in enumerate((images, labels)):
            tensor = tensor_list.as_tensor()
            if self.share and source_kind(tensor) == "cpu":
                out.append(mx.nd.from_dlpack(tensor.__dlpack__()))
                continue
            staging = staging_context(source_kind(tensor), self.ctx)
            slot[i] = _matching(slot[i], tensor, staging)
            _copy_into(tensor, slot[i])
            if staging != self.ctx:  # pinned host memory -> the GPU, queued on MXNet's copy stream
                device[i] = _matching(device[i], tensor, self.ctx)
                slot[i].copyto(device[i])
                out.append(device[i])
            else:
                out.append(slot[i])
        images = out[0] if self.normalize is None else self.normalize(out[0])
        return images, out[1].reshape((-1,))


def first_undecodable(images):
    """The position of the first of ``images`` (encoded bytes) that DALI's CPU decoder refuses, or None: to name a
    record a pipeline failed on that OpenCV decodes (nvImageCodec is stricter about some damage)."""
    @pipeline_def(batch_size=1, num_threads=1, device_id=None, exec_pipelined=False, exec_async=False,
                  prefetch_queue_depth=1)  # one image in, one run: no batches ahead
    def decode():
        return fn.decoders.image(fn.external_source(name="jpegs", dtype=types.UINT8), device="cpu")
    pipe = decode()
    pipe.build()
    for position, image in enumerate(images):
        pipe.feed_input("jpegs", [np.asarray(image, dtype=np.uint8)])
        try:
            pipe.run()
        except RuntimeError:
            return position
    return None


def reader_epoch_size(pipeline):
    """Records the pipeline's RecordIO reader reads per epoch (all shards)."""
    return pipeline.reader_meta(READER_NAME)["epoch_size"]
