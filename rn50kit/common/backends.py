"""The data backends, in one table (no MXNet here: runner and benchmark.py read it too).

Each row says what a backend reads (the files of its data root, per split), where its pipeline runs, which flags
only it reads, what it supports and which function builds its iterators (rn50kit/data/protocol.py: the protocol).
Adding a backend means its module (rn50kit/data/backend_<name>.py) and a row here (docs/extending.md); nothing
else compares backend names or spells a data root's file names: the rest asks the row."""
import dataclasses
import os

SPLITS = ("train", "val")  # train.py's --data-<split> and --data-<split>-idx, in the order it takes them
# The splits each train.py --mode reads: (needed, used when present). pred reads the images named on its command
# line; --test-io-mode train or val needs what --mode of that name needs.
MODE_SPLITS = {"train_val": (("train",), ("val",)), "train": (("train",), ()), "val": (("val",), ()),
               "pred": ((), ())}


def present(path, name):
    """Whether ``path``, the layout's ``name`` or a file given in its place, exists as the layout wants it: a folder
    for a name ending in "/", else a file."""
    return os.path.isdir(path) if name.endswith("/") else os.path.isfile(path)


@dataclasses.dataclass(frozen=True)
class SplitFiles:
    """One split's files in a data root: its data, which train.py gets as --data-<split> (a name ending in "/" is
    a folder), and the index beside it, which it gets as --data-<split>-idx ("": the format has none)."""
    data: str
    index: str = ""

    def names(self):
        return [name for name in (self.data, self.index) if name]

    def index_beside(self, data_path):
        """The index of a data file however it was named: its name with the index's extension (foo.rec ->
        foo.idx, as im2rec writes them), or "" if the format has none or it is not there."""
        if not self.index or not data_path:
            return ""
        index = os.path.splitext(data_path)[0] + os.path.splitext(self.index)[1]
        return index if os.path.isfile(index) else ""


@dataclasses.dataclass(frozen=True)
class RootLayout:
    """What a backend reads from a --data-root, per split; a split left None is not read from files."""
    train: SplitFiles = None
    val: SplitFiles = None

    def splits(self):
        return [split for split in SPLITS if getattr(self, split)]

    def files(self, split):
        return getattr(self, split)

    def splits_for(self, mode):
        """The splits ``mode`` needs and those it uses when present (a mode runner does not know needs none:
        train.py refuses it)."""
        needed, optional = MODE_SPLITS.get(mode, ((), ()))
        return ([split for split in needed if split in self.splits()],
                [split for split in optional if split in self.splits()])

    def files_for(self, mode):
        """The names a data root must hold for ``mode``."""
        return [name for split in self.splits_for(mode)[0] for name in self.files(split).names()]

    def data_names(self):
        return [self.files(split).data for split in self.splits()]

    @staticmethod
    def path_in(root, name):
        return os.path.join(str(root), name)


RECORDS = RootLayout(train=SplitFiles("train.rec", "train.idx"), val=SplitFiles("val.rec", "val.idx"))  # RecordIO
NO_FILES = RootLayout()  # a backend that makes its own data


@dataclasses.dataclass(frozen=True)
class Backend:
    name: str
    description: str
    builder: str  # "module:function" making (train, val) iterators: a protocol.GetIterators
    root_layout: RootLayout = RECORDS  # the files of its data root
    pipeline_device: str = "cpu"  # where its pipeline runs: "gpu" needs a GPU on every worker
    flag_prefix: str = ""  # the flags only this backend reads start with it
    input_layout_fixed: str = None  # the layout it always delivers, whatever --input-layout says
    auto_augment: bool = False  # runs --auto-augment and --color-jitter (DALI's auto_aug and color_twist)
    elastic: bool = False  # reads an epoch's training records from any position of its permutation (Feed.start):
    #                        an elastic run's new world reads the records the old one did not

    @property
    def reads_records(self):
        """Whether it reads data files (else it makes its own data)."""
        return bool(self.root_layout.splits())


BACKENDS = {backend.name: backend for backend in (
    Backend("dali-gpu", "DALI: nvJPEG decoding and augmentation on the GPU",
            "rn50kit.data.backend_dali:get_iterators", pipeline_device="gpu", flag_prefix="dali_", auto_augment=True,
            elastic=True),
    Backend("dali-cpu", "DALI: decoding and augmentation on the CPU", "rn50kit.data.backend_dali:get_iterators",
            flag_prefix="dali_", auto_augment=True, elastic=True),
    Backend("mxnet", "MXNet's ImageRecordIter (CPU)", "rn50kit.data.backend_mxnet:get_iterators",
            flag_prefix="data_mxnet_", input_layout_fixed="NCHW"),
    Backend("synthetic", "random images made on the device (speed tests)",
            "rn50kit.data.backend_synthetic:get_iterators", root_layout=NO_FILES),
)}
NAMES = list(BACKENDS)  # --data-backend's choices (runner's and train.py's parsers hold this list itself)


def register(backend):
    """Add a row at run time, as a line in the table above does (a backend kept outside the kit: a plugin, a
    test); train.py and runner accept its name from then on."""
    if backend.name in BACKENDS:
        raise ValueError(f"a data backend named {backend.name} exists already")
    BACKENDS[backend.name] = backend
    NAMES.append(backend.name)
    return backend


def unregister(name):
    del BACKENDS[name]
    NAMES.remove(name)


def names_with(feature):
    """The backends whose row has ``feature`` (a Backend field: "elastic", "auto_augment"), in name order."""
    return sorted(name for name, backend in BACKENDS.items() if getattr(backend, feature))


def elastic_refusal(name):
    """Why an elastic run cannot read its records with backend ``name`` (one line), or None when it can."""
    if get(name).elastic:
        return None
    return (f"elastic runs read the records with the dali backends (the records not read yet go to the new world); "
            f"--data-backend {name} cannot: use {' or '.join(names_with('elastic'))}")


def get(name):
    if name not in BACKENDS:
        raise ValueError(f"unknown --data-backend {name}; choose from {', '.join(NAMES)}")
    return BACKENDS[name]


def default(gpu):
    """The backend a machine gets when none is named: the GPU pipeline with a GPU, the CPU one without."""
    return "dali-gpu" if gpu else "dali-cpu"


def root_layout(name):
    """The files ``name`` reads from a data root; None (not chosen yet) is the machine's default, a DALI backend
    either way."""
    return get(default(gpu=False) if name is None else name).root_layout


def reads_records(name):
    """Whether ``name`` reads data files; None (not chosen yet: the machine's default) does."""
    return bool(root_layout(name).splits())


def needs_gpu(name):
    return get(name).pipeline_device == "gpu"


def builder(name):
    """The function that builds ``name``'s iterators (imported only now: DALI is a large import)."""
    import importlib
    module, function = get(name).builder.split(":")
    return getattr(importlib.import_module(module), function)
