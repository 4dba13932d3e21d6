"""Data flags shared by every backend, the non-DALI backends, and the backend dispatch."""
import math
import os

import mxnet as mx

BACKENDS = ["dali-gpu", "dali-cpu", "mxnet", "synthetic"]
PREPARE_HINT = ("prepare ImageNet with `tools/prepare_imagenet.sh RAW_DIR OUT_DIR`, "
                "or run `make demo` to build the demo set")


def int_list(text):
    return [int(x) for x in text.split(",")]


def float_list(text):
    return [float(x) for x in text.split(",")]


def add_data_args(parser):
    group = parser.add_argument_group("Data")
    group.add_argument("--data-train", help="training RecordIO (.rec)")
    group.add_argument("--data-train-idx", default="", help="index of the training RecordIO (.idx)")
    group.add_argument("--data-val", help="validation RecordIO (.rec)")
    group.add_argument("--data-val-idx", default="", help="index of the validation RecordIO (.idx)")
    group.add_argument("--data-backend", default="dali-gpu", choices=BACKENDS, help="data loading backend")
    group.add_argument("--image-shape", type=int_list, default=[3, 224, 224],
                       help="network input C,H,W (C=4 pads a zero channel)")
    group.add_argument("--rgb-mean", type=float_list, default=[123.68, 116.779, 103.939],
                       help="per-channel mean subtracted from the RGB pixels")
    group.add_argument("--rgb-std", type=float_list, default=[58.393, 57.12, 57.375],
                       help="per-channel standard deviation the RGB pixels are divided by")
    group.add_argument("--input-layout", default="NCHW", choices=["NCHW", "NHWC"], help="layout of the input batch")
    group.add_argument("--num-examples", type=int, default=None,
                       help="training samples per epoch (default: the number of records in --data-train)")
    group.add_argument("--data-val-resize", type=int, default=256,
                       help="validation: resize the shorter side to this, then centre-crop the image shape")
    return group


def add_data_aug_args(parser):
    group = parser.add_argument_group("Augmentation", "training-time augmentation, every backend")
    group.add_argument("--min-random-area", type=float, default=0.08,
                       help="random-resized-crop: smallest crop area, as a fraction of the image")
    group.add_argument("--max-random-area", type=float, default=1.0,
                       help="random-resized-crop: largest crop area, as a fraction of the image")
    group.add_argument("--min-random-aspect-ratio", type=float, default=0.75,
                       help="random-resized-crop: smallest aspect ratio")
    group.add_argument("--max-random-aspect-ratio", type=float, default=4 / 3,
                       help="random-resized-crop: largest aspect ratio")
    group.add_argument("--random-mirror", type=int, default=1, choices=[0, 1],
                       help="flip half the training images horizontally")
    return group


def check_data_files(args):
    """Return a one-line message naming the first missing data file, or None."""
    needed = []
    if args.data_train:
        needed += [("--data-train", args.data_train), ("--data-train-idx", args.data_train_idx)]
    if args.data_val:
        needed += [("--data-val", args.data_val), ("--data-val-idx", args.data_val_idx)]
    for flag, path in needed:
        if not path:
            return f"{flag} is required with the {args.data_backend} backend; {PREPARE_HINT}"
        if not os.path.isfile(path):
            return f"{flag} {path} does not exist; {PREPARE_HINT}"
    return None


class SyntheticIterator:
    """Random images made once on the device, for compute-only benchmarks.

    Validation reuses the training batch, so its accuracy measures fitting rather than chance
    (the original kit validated on a second random batch, which can only score chance).
    """

    def __init__(self, batch_size, image_shape, num_classes, num_batches, ctx, dtype="float32",
                 layout="NCHW", seed=0):
        shape = (batch_size, *image_shape) if layout == "NCHW" else \
            (batch_size, image_shape[1], image_shape[2], image_shape[0])
        mx.random.seed(seed, ctx=ctx)
        self.data = mx.nd.random.uniform(-1, 1, shape=shape, ctx=ctx).astype(dtype)
        self.label = mx.nd.random.randint(0, num_classes, shape=(batch_size,), ctx=ctx).astype("float32")
        self.num_batches = num_batches
        self.size = num_batches * batch_size
        self._index = 0

    def __len__(self):
        return self.num_batches

    def __iter__(self):
        self._index = 0
        return self

    def reset(self):
        self._index = 0

    def __next__(self):
        if self._index >= self.num_batches:
            raise StopIteration
        self._index += 1
        return mx.io.DataBatch(data=[self.data], label=[self.label], pad=0)


def get_data_iterators(args, rank, num_workers, local_rank, local_size, ctx):
    """(train, val) iterators for this rank; either is None when its data is not given."""
    if args.data_backend in ("dali-gpu", "dali-cpu"):
        import dali  # DALI is imported only when used
        return dali.get_dali_iterators(args, rank, num_workers, local_rank, local_size, ctx)
    if args.data_backend == "synthetic":
        local_batch = args.batch_size // num_workers
        num_examples = args.num_examples or 32 * args.batch_size
        steps = math.ceil(num_examples / args.batch_size)
        seed = 0 if args.seed is None else args.seed
        train = SyntheticIterator(local_batch, args.image_shape, args.num_classes, steps, ctx, args.dtype,
                                  args.input_layout, seed)
        return train, train
    raise NotImplementedError(f"--data-backend {args.data_backend} is not available yet")
