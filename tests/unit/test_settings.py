"""settings in process: which flags were typed, the data files a --data-root gives, the settings a scored
checkpoint brings, machine defaults, and the files of an abandoned run moved aside."""
import os
import re

import pytest

import train
from rn50kit.config import settings
from rn50kit.training.configure import complete
from rn50kit.training.workspace import set_aside_superseded
from rn50kit.weights import checkpoint
from support.checkpoints import fake_checkpoint, touch
from support.runs import plan_refusal


def test_python_train_py_on_a_gpu_gets_the_float16_defaults_runner_gets(tmp_path):
    """One place for a float16 GPU run's defaults: train.py alone on a GPU machine (described: 8 GPUs).
    Found by the second review of the GPU paths (issue 21)."""
    argv = ["--data-backend", "synthetic", "--workspace", str(tmp_path)]
    args = train.parse_args(argv)
    complete(args, settings.given_flags(train.get_args_parser(), argv), num_gpus=8)
    assert args.dtype == "float16" and args.image_shape == [4, 224, 224]
    assert (args.input_layout, args.conv_layout) == ("NHWC", "NHWC")
    argv += ["--conv-layout", "NCHW", "--image-shape", "3,160,160"]  # the user's choice stays
    args = train.parse_args(argv)
    complete(args, settings.given_flags(train.get_args_parser(), argv), num_gpus=8)
    assert args.conv_layout == "NCHW" and args.input_layout == "NCHW" and args.image_shape == [3, 160, 160]


def test_cpu_defaults_are_a_batch_a_cpu_can_run():
    """Found by the second newcomer walk (issue 26)."""
    from rn50kit.config import settings
    from rn50kit.launch.machine import Machine
    from rn50kit.launch.plan import plan_launch
    args = train.parse_args([])
    settings.machine_defaults(args, num_gpus=0, given=set())
    assert (args.batch_size, args.dtype, args.data_backend) == (settings.CPU_BATCH_SIZE, "float32", "dali-cpu")
    args = train.parse_args(["--batch-size", "192"])
    settings.machine_defaults(args, num_gpus=0, given={"batch_size"})
    assert args.batch_size == 192  # typed: kept
    args = train.parse_args([])
    settings.machine_defaults(args, num_gpus=8, given=set())
    assert (args.batch_size, args.dtype) == (192, "float16")
    cpu, gpus = Machine(gpus=0, cores=2), Machine(gpus=8, cores=64)
    assert "--batch-size 32" in " ".join(plan_launch(["--data-backend", "synthetic"], cpu, {})[2])
    command = plan_launch(["--data-backend", "synthetic", "-n", "8"], gpus, {})[2]
    assert "--batch-size 1536" in " ".join(command)


def test_float32_and_int8_scores_of_a_checkpoint_do_not_overwrite_each_other(tmp_path):
    """Found by the second newcomer walk (issue 26)."""
    from support.checkpoints import fake_checkpoint
    fake_checkpoint(tmp_path, 2, num_classes=10, image_shape=[3, 32, 32])
    reports = set()
    for flags in ([], ["--dtype", "int8"], ["--dtype", "int8", "--calib-mode", "entropy"]):
        args, given = parse("--mode", "val", "--data-backend", "synthetic", "--workspace", tmp_path, *flags)
        complete(args, given, num_gpus=0)
        reports.add(os.path.basename(args.report))
    assert reports == {"model-0002.float32.score.json", "model-0002.int8-naive-10.score.json",
                       "model-0002.int8-entropy-10.score.json"}


def test_flip_tta_and_other_data_scores_do_not_overwrite_the_plain_score(tmp_path):
    """Issue 58: --val-tta flip and another --data-val replaced model-0002.float32.score.json."""
    from support.checkpoints import fake_checkpoint
    for folder in ("digits", "photos"):
        (tmp_path / folder).mkdir()
        touch(tmp_path / folder / "val.rec")
    fake_checkpoint(tmp_path, 2, num_classes=10, image_shape=[3, 32, 32], data_val=str(tmp_path / "digits" / "val.rec"))
    reports = []
    for flags in (["--data-val", tmp_path / "digits" / "val.rec"], ["--data-val", tmp_path / "digits" / "val.rec",
                  "--val-tta", "flip"], ["--data-val", tmp_path / "photos" / "val.rec"]):
        args, given = parse("--mode", "val", "--data-backend", "synthetic", "--workspace", tmp_path, *flags)
        complete(args, given, num_gpus=0)
        reports.append(os.path.basename(args.report))
    assert reports[:2] == ["model-0002.float32.score.json", "model-0002.float32.flip.score.json"]
    assert re.fullmatch(r"model-0002\.float32\.on-photos-[0-9a-f]{6}\.score\.json", reports[2]), reports[2]


def test_a_data_root_naming_the_rec_file_says_give_its_folder(tmp_path):
    """Found by the second newcomer walk (issue 26)."""
    rec = tmp_path / "train.rec"
    rec.write_bytes(b"x")
    expected = f"--data-root {rec} is a file; give the folder that holds train.rec and val.rec (--data-root {tmp_path})"
    args = train.parse_args(["--data-root", str(rec)])
    with pytest.raises(ValueError) as error:
        complete(args, {"data_root"}, num_gpus=0)
    assert str(error.value).startswith(expected)
    assert plan_refusal("--data-backend", "dali-cpu", "--data-root", str(rec)).startswith(expected)


def parse(*argv):
    argv = [str(a) for a in argv]
    return train.parse_args(argv), settings.given_flags(train.get_args_parser(), argv)


def data_files_of(*argv):
    args, _ = parse(*argv)
    settings.machine_defaults(args, num_gpus=0)
    settings.fill_data_files(args)
    return args


def test_given_flags_sees_typed_flags_whatever_their_value_and_abbreviations():
    _, given = parse("--num-classes", "1000", "--rec", "he", "--wd-bn-bias", "--lr=0.1")
    assert given == {"num_classes", "recipe", "wd_bn_bias", "lr"}


def test_data_root_gives_the_files_that_exist_and_their_indexes(tmp_path):
    for name in ("train.rec", "train.idx", "val.rec"):
        touch(tmp_path / name)
    args = data_files_of("--data-root", tmp_path)
    assert args.data_train == str(tmp_path / "train.rec") and args.data_train_idx == str(tmp_path / "train.idx")
    assert args.data_val == str(tmp_path / "val.rec") and args.data_val_idx == ""  # no val.idx beside it
    with pytest.raises(ValueError, match="does not exist.*prepare"):
        data_files_of("--data-root", tmp_path / "nowhere")
    (tmp_path / "train.rec").unlink()
    with pytest.raises(ValueError, match="train.rec is missing"):
        data_files_of("--data-root", tmp_path)


def test_scoring_takes_the_latest_checkpoint_and_its_settings(tmp_path):
    fake_checkpoint(tmp_path, 1, num_classes=10, image_shape=[3, 32, 32], data_val_resize=32)
    latest = fake_checkpoint(tmp_path, 2, num_classes=10, image_shape=[3, 32, 32], data_val_resize=32,
                             arch="resnetv15", num_layers=18)
    args, given = parse("--mode", "val", "--data-backend", "synthetic", "--workspace", tmp_path)
    assert complete(args, given, num_gpus=0) == str(latest)
    assert (args.num_classes, args.image_shape, args.data_val_resize, args.num_layers) == (10, [3, 32, 32], 32, 18)
    assert args.num_epochs == 1 and args.dtype == "float32"
    assert args.report == os.path.abspath(str(latest).replace(".params", ".float32.score.json"))
    # a 4-channel input loads a 3-channel stem; another size or class count contradicts the checkpoint
    args, given = parse("--mode", "val", "--data-backend", "synthetic", "--workspace", tmp_path,
                        "--image-shape", "4,32,32")
    complete(args, given, num_gpus=0)
    assert args.image_shape == [4, 32, 32]
    args, given = parse("--mode", "val", "--data-backend", "synthetic", "--workspace", tmp_path,
                        "--num-classes", "1000")
    with pytest.raises(ValueError, match="--num-classes 1000 contradicts .*--num-classes 10"):
        complete(args, given, num_gpus=0)
    args, given = parse("--mode", "val", "--data-backend", "synthetic", "--workspace", tmp_path, "--num-layers", "50")
    with pytest.raises(ValueError, match="resnet50_v1.5, but .* is a resnet18_v1.5"):
        complete(args, given, num_gpus=0)


def test_machine_defaults_and_the_default_workspace(tmp_path):
    args, given = parse("--data-backend", "synthetic", "--num-layers", "34")
    complete(args, given, num_gpus=8)
    assert (args.dtype, args.workspace) == ("float16", os.path.join("runs", "resnet34_v1.5"))
    args, given = parse("--data-train", touch(tmp_path / "t.rec"))
    complete(args, given, num_gpus=0)
    assert (args.dtype, args.data_backend, args.data_train_idx) == ("float32", "dali-cpu", "")


def test_resuming_an_earlier_checkpoint_moves_the_later_ones_aside(tmp_path):
    fake_checkpoint(tmp_path, 1)
    fake_checkpoint(tmp_path, 2)
    fake_checkpoint(tmp_path, 2, step=5)
    first = checkpoint.list_complete(str(tmp_path / "model"))[0]
    moved = set_aside_superseded(str(tmp_path), "model", first)
    assert [s["epoch"] for s in checkpoint.list_complete(str(tmp_path / "model"))] == [1]
    assert sorted(os.listdir(moved)) == sorted(["model-0002.params", "model-0002.states", "model-0002.state.json",
                                                "model-0002-step000005.params", "model-0002-step000005.states",
                                                "model-0002-step000005.state.json", "model-symbol.json"])
    assert (tmp_path / "model-symbol.json").exists()  # still needed by the checkpoint kept
    moved_all = set_aside_superseded(str(tmp_path), "model", None, ["report.json"])
    assert checkpoint.find_latest(str(tmp_path / "model")) is None and "model-0001.params" in os.listdir(moved_all)


def test_int8_scoring_with_a_data_root_gets_its_training_file_to_calibrate_on(tmp_path):
    """As runner passes it: train.py alone with --data-root, --mode val --dtype int8 (found walking the guide)."""
    for name in ("train.rec", "train.idx", "val.rec", "val.idx"):
        touch(tmp_path / name)
    int8 = data_files_of("--data-root", tmp_path, "--mode", "val", "--dtype", "int8")
    assert (int8.data_train, int8.data_train_idx) == (str(tmp_path / "train.rec"), str(tmp_path / "train.idx"))
    assert int8.data_val == str(tmp_path / "val.rec")
    float32 = data_files_of("--data-root", tmp_path, "--mode", "val", "--dtype", "float32")
    assert not float32.data_train and float32.data_val == str(tmp_path / "val.rec")
    (tmp_path / "train.rec").unlink()  # scoring needs no training file: without one, INT8 says so when it calibrates
    assert not data_files_of("--data-root", tmp_path, "--mode", "val", "--dtype", "int8").data_train
