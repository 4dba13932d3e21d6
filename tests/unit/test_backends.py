"""The backends table's data-root layouts against the checks that use them: for every row, the files it names for a
mode are exactly those runner's check_data_root and train.py's fill_data_files + check_data_files refuse to run
without (each removed in turn from a full data root), runner's command hands train.py those files, synthetic needs
none, and a made-up row (class folders, no index) is honoured by all of them unchanged."""
import argparse
from pathlib import Path

import pytest

from rn50kit.common import backends
from rn50kit.config import cli, data_flags, settings
from rn50kit.launch import arguments, checks, plan

MODES = ["train_val", "train", "val", "pred"]
# What the kit's record backends have always needed (the names the four checks spelled before the table did).
RECORD_FILES = {"train_val": {"train.rec", "train.idx"}, "train": {"train.rec", "train.idx"},
                "val": {"val.rec", "val.idx"}, "pred": set()}
CLASS_FOLDERS = backends.Backend("class-folders", "a made-up backend reading one folder per class",
                                 "nowhere:no_builder", root_layout=backends.RootLayout(
                                     train=backends.SplitFiles("train/"), val=backends.SplitFiles("val/")))
# Everything any layout here names, plus a stray file: a data root holding all of it satisfies every row.
EVERY_NAME = sorted({"train.rec", "train.idx", "val.rec", "val.idx", "train/", "val/", "labels.txt"})


@pytest.fixture()
def class_folders(monkeypatch):
    monkeypatch.setitem(backends.BACKENDS, CLASS_FOLDERS.name, CLASS_FOLDERS)
    return CLASS_FOLDERS.name


def make_root(root, names):
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        if name.endswith("/"):
            (root / name).mkdir()
        else:
            (root / name).write_bytes(b"x")
    return root


def remove(root, name):
    (root / name).rmdir() if name.endswith("/") else (root / name).unlink()


def runner_refuses(root, backend, mode):
    args = argparse.Namespace(data_root=Path(root), data_backend=backend)
    given = argparse.Namespace(mode=mode, data_train=None, data_val=None)
    try:
        checks.check_data_root(args, given)
    except cli.UsageError as error:
        return str(error)
    return None


def train_py_data(root, backend, mode, test_io_mode=None):
    """What train.py makes of --data-root ``root``: (its refusal or None, the data flags it fills)."""
    args = argparse.Namespace(data_backend=backend, mode=mode, data_root=str(root), data_train=None, data_val=None,
                              data_train_idx="", data_val_idx="")
    try:
        settings.fill_data_files(args)
    except ValueError as error:
        return str(error), args
    cfg = data_flags.DataConfig(data_backend=backend, data_root=str(root), data_train=args.data_train,
                             data_train_idx=args.data_train_idx, data_val=args.data_val,
                             data_val_idx=args.data_val_idx, test_io=test_io_mode is not None,
                             test_io_mode=test_io_mode or "train")
    return data_flags.check_data_files(cfg), args


def refused_without(tmp_path, refuses):
    """The names of EVERY_NAME whose absence ``refuses(root)`` objects to (each removed alone from a full root)."""
    assert refuses(make_root(tmp_path / "full", EVERY_NAME)) is None  # a full root is accepted
    refused = set()
    for name in EVERY_NAME:
        root = make_root(tmp_path / f"without-{name.strip('/')}", [n for n in EVERY_NAME if n != name])
        if refuses(root):
            refused.add(name)
    return refused


def runner_data_flags(root, backend, mode, dtype="float32"):
    """The --data-* words of the train.py command runner builds for ``mode`` (in order)."""
    args = arguments.get_args_parser().parse_args(["--data-root", str(root), "--kv-store", "device",
                                                  "--dtype", dtype, "-b", "8"])
    args.data_backend = backend
    command = plan.build_command(args, ["--mode", mode])
    start = next(i for i, word in enumerate(command) if word.endswith("train.py")) + 1
    return command[start:command.index("--dtype")]


def test_record_backends_name_the_files_they_always_needed():
    readers = [name for name, row in backends.BACKENDS.items() if row.reads_records]
    assert readers == ["dali-gpu", "dali-cpu", "mxnet"]
    for name in readers:
        assert {mode: set(backends.get(name).root_layout.files_for(mode)) for mode in MODES} == RECORD_FILES
    # not chosen yet (None) is a DALI backend, whichever the machine gets
    assert backends.root_layout(None) == backends.get(backends.default(True)).root_layout == \
        backends.get(backends.default(False)).root_layout


@pytest.mark.parametrize("backend", [*backends.NAMES, CLASS_FOLDERS.name])
@pytest.mark.parametrize("mode", MODES)
def test_the_files_a_row_names_are_those_the_checks_refuse_to_miss(tmp_path, class_folders, backend, mode):
    layout = backends.get(backend).root_layout
    named = set(layout.files_for(mode))
    assert refused_without(tmp_path / "runner", lambda root: runner_refuses(root, backend, mode)) == named
    # train.py also uses an optional split whose data is there (validation in train_val), and then wants its index
    indexes_of_optional = {layout.files(split).index for split in layout.splits_for(mode)[1]} - {""}
    assert refused_without(tmp_path / "train", lambda root: train_py_data(root, backend, mode)[0]) == \
        named | indexes_of_optional


@pytest.mark.parametrize("backend", [*backends.NAMES, CLASS_FOLDERS.name])
@pytest.mark.parametrize("mode, test_io_mode", [("train_val", "train"), ("train_val", "val"), ("train", "train"),
                                                ("val", "val")])
def test_test_io_needs_the_split_it_times(tmp_path, class_folders, backend, mode, test_io_mode):
    layout = backends.get(backend).root_layout
    named = set(layout.files_for(mode)) | set(layout.files_for(test_io_mode))
    named |= {layout.files(split).index for split in layout.splits_for(mode)[1]} - {""}  # as in the test above
    refused = refused_without(tmp_path, lambda root: train_py_data(root, backend, mode, test_io_mode)[0])
    assert refused == named


def test_synthetic_needs_no_data_root(tmp_path):
    nowhere = tmp_path / "nowhere"
    for mode in MODES:
        assert backends.get("synthetic").root_layout.files_for(mode) == []
        assert runner_refuses(nowhere, "synthetic", mode) is None
        problem, args = train_py_data(nowhere, "synthetic", mode)
        assert problem is None and args.data_train is None and args.data_val is None
        assert runner_data_flags(nowhere, "synthetic", mode) == []


def test_missing_files_and_roots_are_named_as_before(tmp_path):
    make_root(tmp_path, ["val.rec", "val.idx"])
    hint = cli.PREPARE_HINT
    assert runner_refuses(tmp_path, "mxnet", "train") == f"{tmp_path}/train.rec is missing; {hint}"
    assert train_py_data(tmp_path, "mxnet", "train")[0] == f"{tmp_path}/train.rec is missing; {hint}"
    (tmp_path / "train.rec").write_bytes(b"x")
    assert runner_refuses(tmp_path, "dali-cpu", "train") == f"{tmp_path}/train.idx is missing; {hint}"
    assert train_py_data(tmp_path, "dali-cpu", "train")[0] == f"--data-train-idx is required with the dali-cpu " \
                                                              f"backend; {hint}"
    nowhere = tmp_path / "nowhere"
    assert runner_refuses(nowhere, "dali-gpu", "val") == (
        f"data root {nowhere} does not exist; give --data-root DIR (with train.rec/val.rec) or "
        f"--data-train/--data-val; {hint}")
    file_root = tmp_path / "val.rec"
    assert train_py_data(file_root, "dali-gpu", "val")[0] == (
        f"--data-root {file_root} is a file; give the folder that holds train.rec and val.rec (--data-root "
        f"{tmp_path}), or name the files with --data-train/--data-val")


def test_runner_hands_train_py_the_files_of_the_mode(tmp_path):
    root = make_root(tmp_path, ["train.rec", "train.idx", "val.rec", "val.idx"])
    train = ["--data-train", f"{root}/train.rec", "--data-train-idx", f"{root}/train.idx"]
    val = ["--data-val", f"{root}/val.rec", "--data-val-idx", f"{root}/val.idx"]
    for backend in ("dali-gpu", "dali-cpu", "mxnet"):
        assert runner_data_flags(root, backend, "train_val") == train + val
        assert runner_data_flags(root, backend, "train") == train
        assert runner_data_flags(root, backend, "val") == val
        assert runner_data_flags(root, backend, "pred") == []
        assert runner_data_flags(root, backend, "val", dtype="int8") == train + val  # INT8 calibrates on train
    remove(root, "val.rec")
    assert runner_data_flags(root, "mxnet", "train_val") == train  # validation is optional in train_val


def test_a_new_row_is_honoured_without_changing_the_checks(tmp_path, class_folders):
    root = make_root(tmp_path / "root", ["train/", "val/"])
    assert runner_data_flags(root, class_folders, "train_val") == ["--data-train", f"{root}/train/",
                                                                   "--data-val", f"{root}/val/"]
    problem, args = train_py_data(root, class_folders, "train_val")
    assert problem is None and (args.data_train, args.data_val) == (f"{root}/train/", f"{root}/val/")
    assert args.data_train_idx == "" and args.data_val_idx == ""  # the layout has no index
    # a file where the row wants a folder is refused, by runner and by train.py
    remove(root, "train/")
    (root / "train").write_bytes(b"x")
    assert runner_refuses(root, class_folders, "train") == f"{root}/train/ is missing; {cli.PREPARE_HINT}"
    assert train_py_data(root, class_folders, "train")[0] == f"{root}/train/ is missing; {cli.PREPARE_HINT}"
    assert cli.data_root_problem(root / "nowhere", CLASS_FOLDERS.root_layout).startswith(
        f"data root {root}/nowhere does not exist; give --data-root DIR (with train/val)")


def test_a_root_of_class_folders_suggests_prepare_folder(tmp_path):
    """Issue 58: --data-root at the user's class folders suggested tools/prepare_imagenet.sh."""
    for name in ("cat", "dog"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "1.jpg").write_bytes(b"x")
    expected = (f"--data-root {tmp_path} holds folders of images, not train.rec and val.rec: pack them with "
                f"`python tools/prepare_folder.py {tmp_path} OUT`")
    assert runner_refuses(tmp_path, "dali-cpu", "train").startswith(expected)
    assert train_py_data(tmp_path, "dali-cpu", "train")[0].startswith(expected)
