"""The data flags (Data, Augmentation, DALI data backend): DataConfig, their argparse groups and the checks of their
values; the iterators that read them are rn50kit/data's."""
import dataclasses

from rn50kit.common import backends
from rn50kit.config import cli


def int_list(text):
    return [int(x) for x in text.split(",")]


def float_list(text):
    return [float(x) for x in text.split(",")]


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The data, augmentation and DALI flags' values (their defaults are these)."""
    data_root: str = None
    data_train: str = None
    data_train_idx: str = ""
    data_val: str = None
    data_val_idx: str = ""
    data_backend: str = None  # settings.machine_defaults: dali-gpu with a GPU, dali-cpu without
    image_shape: tuple = (3, 224, 224)
    rgb_mean: tuple = (123.68, 116.779, 103.939)
    rgb_std: tuple = (58.393, 57.12, 57.375)
    input_layout: str = "NCHW"
    num_examples: int = None
    data_val_resize: int = 256
    data_mxnet_threads: int = None
    test_io: bool = False
    test_io_mode: str = "train"
    test_io_grid: str = None
    # augmentation
    min_random_area: float = 0.08
    max_random_area: float = 1.0
    min_random_aspect_ratio: float = 0.75
    max_random_aspect_ratio: float = 4 / 3
    random_mirror: int = 1
    # automatic augmentation and colour jitter (the DALI backends; rules.augment_problem refuses the others)
    auto_augment: str = "none"
    randaugment_n: int = 2
    randaugment_m: int = 9
    color_jitter: tuple = (0.0,)
    # training resolution (validation stays at --image-shape): fixed, or progressive over epochs
    train_size: tuple = ()
    train_size_epochs: tuple = ()
    train_size_step: int = 32
    # DALI
    dali_separ_val: bool = False
    dali_threads: int = None
    dali_validation_threads: int = None
    dali_prefetch_queue: int = 5
    dali_read_ahead: int = 2
    dali_nvjpeg_memory_padding: int = 64
    dali_fuse_decoder: int = 1
    dali_cpu_resize: str = "opencv"
    dali_normalize: str = "auto"
    dali_dont_use_mmap: bool = False


def add_data_args(parser):
    group = parser.add_argument_group("Data")
    group.add_argument("--data-root",
                       help="directory with train.rec/.idx and val.rec/.idx, used for the files not given one by "
                            "one (default, without any data flag: /data/imagenet/train-val-recordio-passthrough)")
    group.add_argument("--data-train", help="training RecordIO (.rec)")
    group.add_argument("--data-train-idx", help="index of the training RecordIO (default: the .idx beside it)")
    group.add_argument("--data-val", help="validation RecordIO (.rec)")
    group.add_argument("--data-val-idx", help="index of the validation RecordIO (default: the .idx beside it)")
    group.add_argument("--data-backend", choices=cli.DATA_BACKENDS,
                       help="data loading backend (default: dali-gpu with a GPU, dali-cpu without)")
    group.add_argument("--image-shape", type=int_list, help="network input C,H,W (C=4 pads a zero channel)")
    group.add_argument("--rgb-mean", type=float_list, help="per-channel mean subtracted from the RGB pixels")
    group.add_argument("--rgb-std", type=float_list,
                       help="per-channel standard deviation the RGB pixels are divided by")
    group.add_argument("--input-layout", choices=["NCHW", "NHWC"], help="layout of the input batch")
    group.add_argument("--num-examples", type=int,
                       help="training samples per epoch (default: the number of records in --data-train)")
    group.add_argument("--data-val-resize", type=int,
                       help="validation: resize the shorter side to this, then centre-crop the image shape")
    group.add_argument("--data-mxnet-threads", type=int,
                       help="decoding threads of the mxnet backend (default: cores per process)")
    group.add_argument("--test-io", action="store_true", help="only iterate the data and print images/s")
    group.add_argument("--test-io-mode", choices=["train", "val"], help="which iterator --test-io times")
    group.add_argument("--test-io-grid", metavar="PNG",
                       help="with --test-io: save the first batch (rank 0) as a grid of images in this PNG, as "
                            "the network gets them (augmented, un-normalised for viewing)")
    parser.set_defaults(**cli.config_defaults(DataConfig))
    return group


def add_data_aug_args(parser):
    group = parser.add_argument_group("Augmentation", "training-time augmentation, every backend")
    group.add_argument("--min-random-area", type=float,
                       help="random-resized-crop: smallest crop area, as a fraction of the image (recipe "
                            "nvidia-2019: 0.05)")
    group.add_argument("--max-random-area", type=float,
                       help="random-resized-crop: largest crop area, as a fraction of the image")
    group.add_argument("--min-random-aspect-ratio", type=float, help="random-resized-crop: smallest aspect ratio")
    group.add_argument("--max-random-aspect-ratio", type=float, help="random-resized-crop: largest aspect ratio")
    group.add_argument("--random-mirror", type=int, choices=[0, 1], help="flip half the training images horizontally")
    group.add_argument("--auto-augment", choices=["none", "autoaugment", "randaugment", "trivialaugment"],
                       help="automatic augmentation after the crop (DALI backends; DALI's nvidia.dali.auto_aug): "
                            "AutoAugment's ImageNet policy, RandAugment (--randaugment-n/-m), TrivialAugment Wide")
    group.add_argument("--randaugment-n", type=int, help="RandAugment: operations per image")
    group.add_argument("--randaugment-m", type=int, help="RandAugment: magnitude, 0-30 (31 bins)")
    group.add_argument("--train-size", type=int_list,
                       help="training images of SIZE x SIZE (validation stays at --image-shape), or START,END: "
                            "progressive resizing over --train-size-epochs (default: --image-shape's)")
    group.add_argument("--train-size-epochs", type=int_list,
                       help="progressive resizing: FIRST,LAST (0-based epochs): START up to FIRST, END from LAST on, "
                            "linear between them in steps of --train-size-step (FFCV's start_ramp/end_ramp)")
    group.add_argument("--train-size-step", type=int, help="progressive resizing: sizes are multiples of this")
    group.add_argument("--color-jitter", type=float_list,
                       help="brightness,contrast,saturation jitter (one value: all three), factors uniform in "
                            "[1-j, 1+j] (DALI backends; 0 = off)")
    return group


def check_augmentation(cfg):
    """ValueError naming the flag for augmentation values out of range."""
    color_jitter3(cfg.color_jitter)
    if not 0 <= cfg.randaugment_m <= 30 or cfg.randaugment_n < 1:
        raise ValueError(f"--randaugment-n must be at least 1 and --randaugment-m in 0..30 (31 magnitude bins); "
                         f"got {cfg.randaugment_n} and {cfg.randaugment_m}")


def check_train_size(cfg):
    """ValueError naming the flag for a training size that cannot be planned."""
    sizes, epochs = tuple(cfg.train_size), tuple(cfg.train_size_epochs)
    if len(sizes) > 2 or any(size < 1 for size in sizes) or cfg.train_size_step < 1:
        raise ValueError(f"--train-size takes SIZE or START,END (positive), --train-size-step a positive number; got "
                         f"{','.join(map(str, sizes))} and {cfg.train_size_step}")
    if (len(sizes) == 2) != bool(epochs) or (epochs and (len(epochs) != 2 or not 0 <= epochs[0] < epochs[1])):
        raise ValueError("progressive resizing needs both --train-size START,END and --train-size-epochs FIRST,LAST "
                         f"(0 <= FIRST < LAST); got --train-size {','.join(map(str, sizes)) or 'none'} and "
                         f"--train-size-epochs {','.join(map(str, epochs)) or 'none'}")


def check_data_files(cfg):
    """Return a one-line message naming the first missing data file of a DataConfig, or None: the files its
    backend's row names (backends.RootLayout) for each split given, and the split --test-io times."""
    layout = backends.root_layout(cfg.data_backend)
    for split in layout.splits():
        data, files = getattr(cfg, f"data_{split}"), layout.files(split)
        if not data:
            continue
        needed = [(f"--data-{split}", data, files.data)]
        if files.index:
            needed.append((f"--data-{split}-idx", getattr(cfg, f"data_{split}_idx"), files.index))
        for flag, path, name in needed:
            if not path:
                return f"{flag} is required with the {cfg.data_backend} backend; {cli.PREPARE_HINT}"
            if not backends.present(path, name):
                return f"{flag} {path} does not exist; {cli.PREPARE_HINT}"
    if cfg.test_io:
        for split in layout.splits_for(cfg.test_io_mode)[0]:
            if not getattr(cfg, f"data_{split}"):
                return f"--test-io-mode {cfg.test_io_mode} needs --data-{split}; {cli.PREPARE_HINT}"
    return None


def input_shape(image_shape, layout, batch):
    """The network's input of ``batch`` images of ``image_shape`` (C,H,W) in ``layout`` (NCHW or NHWC)."""
    channels, height, width = image_shape
    return (batch, channels, height, width) if layout == "NCHW" else (batch, height, width, channels)


def color_jitter3(values):
    """--color-jitter's one or three values as (brightness, contrast, saturation)."""
    values = tuple(values)
    if len(values) == 1:
        return values * 3
    if len(values) != 3 or min(values) < 0:
        raise ValueError(f"--color-jitter takes one value or three (brightness,contrast,saturation), each >= 0; "
                         f"got {','.join(f'{v:g}' for v in values)}")
    return values


def add_dali_args(parser):
    group = parser.add_argument_group("DALI data backend", "used with --data-backend dali-gpu or dali-cpu")
    group.add_argument("--dali-separ-val", action="store_true",
                       help="every process validates on the whole validation set (no sharding)")
    group.add_argument("--dali-threads", type=int,
                       help="CPU threads per training pipeline (default: cores per process)")
    group.add_argument("--dali-validation-threads", type=int,
                       help="CPU threads per validation pipeline (default: cores per process)")
    group.add_argument("--dali-prefetch-queue", type=int, help="DALI prefetch queue depth")
    group.add_argument("--dali-read-ahead", type=cli.batches_ahead,
                       help="training batches whose records a thread reads ahead of the pipeline, each in a buffer "
                            "of its own (0: read on the training step's thread)")
    group.add_argument("--dali-nvjpeg-memory-padding", type=int,
                       help="memory padding value for nvJPEG, in MB (dali-gpu only)")
    group.add_argument("--dali-fuse-decoder", type=int, choices=[0, 1],
                       help="fuse decoding and random cropping (0 = decode, then random-resized-crop)")
    group.add_argument("--dali-cpu-resize", choices=["opencv", "dali"],
                       help="what resizes the training crops on the CPU (dali-cpu, fused decoder): OpenCV's "
                            "cv2.resize, 4x faster, or DALI's fn.resize; both bilinear, the same pixels within one "
                            "grey level")
    group.add_argument("--dali-normalize", choices=["auto", "pipeline", "device"],
                       help="where dali-cpu's crops are normalized: in the pipeline (DALI's crop_mirror_normalize, "
                            "float out) or on the batch's device after the copy (uint8 crops, a quarter of the bytes "
                            "to copy, normalized by MXNet there); auto: on the device for GPUs, in the pipeline for "
                            "the CPU, where DALI's is the faster")
    group.add_argument("--dali-dont-use-mmap", action="store_true",
                       help="read the RecordIO with plain reads instead of mmap (better on network file systems)")
    return group
