"""The data backends, in one table (no MXNet here: runner and benchmark.py read it too).

Each row says what a backend reads, where its pipeline runs, which flags only it reads and which function builds
its iterators. Adding a backend means a row here and its builder in its own module; nothing else compares
backend names."""
import dataclasses


@dataclasses.dataclass(frozen=True)
class Backend:
    name: str
    description: str
    builder: str  # "module:function" making (train, val) iterators: (DataConfig, Feed, rank, num_workers,
    #               local_rank, local_size, ctx)
    reads_records: bool = True  # a RecordIO .rec with its .idx per split (else it makes its own data)
    pipeline_device: str = "cpu"  # where its pipeline runs: "gpu" needs a GPU on every worker
    flag_prefix: str = ""  # the flags only this backend reads start with it
    input_layout_fixed: str = None  # the layout it always delivers, whatever --input-layout says
    auto_augment: bool = False  # runs --auto-augment and --color-jitter (DALI's auto_aug and color_twist)


BACKENDS = {backend.name: backend for backend in (
    Backend("dali-gpu", "DALI: nvJPEG decoding and augmentation on the GPU", "rn50kit.data.loaders:get_dali_iterators",
            pipeline_device="gpu", flag_prefix="dali_", auto_augment=True),
    Backend("dali-cpu", "DALI: decoding and augmentation on the CPU", "rn50kit.data.loaders:get_dali_iterators",
            flag_prefix="dali_", auto_augment=True),
    Backend("mxnet", "MXNet's ImageRecordIter (CPU)", "rn50kit.data.loaders:get_mxnet_iterators", flag_prefix="data_mxnet_",
            input_layout_fixed="NCHW"),
    Backend("synthetic", "random images made on the device (speed tests)", "rn50kit.data.loaders:get_synthetic_iterators",
            reads_records=False),
)}
NAMES = list(BACKENDS)


def get(name):
    if name not in BACKENDS:
        raise ValueError(f"unknown --data-backend {name}; choose from {', '.join(NAMES)}")
    return BACKENDS[name]


def default(gpu):
    """The backend a machine gets when none is named: the GPU pipeline with a GPU, the CPU one without."""
    return "dali-gpu" if gpu else "dali-cpu"


def reads_records(name):
    """Whether ``name`` reads record files; None (not chosen yet: the machine's default) does."""
    return name is None or get(name).reads_records


def needs_gpu(name):
    return get(name).pipeline_device == "gpu"


def builder(name):
    """The function that builds ``name``'s iterators (imported only now: DALI is a large import)."""
    import importlib
    module, function = get(name).builder.split(":")
    return getattr(importlib.import_module(module), function)
