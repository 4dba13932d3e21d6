"""launcher (runner's logic) for machines described, not detected: an 8-GPU node (float16, float32, one process for
all GPUs), several nodes, a CPU machine. The planned train.py arguments go through train.py's own parser and
model builder, so GPU command lines are checked on a CPU without launching anything."""
import os

import mxnet as mx
import numpy as np
import pytest

import models
import train
from rn50kit.common import rules
from rn50kit.config import settings, train_config
from rn50kit.config.cli import UsageError
from rn50kit.hardware import devices
from rn50kit.launch import environment
from rn50kit.launch.machine import Machine
from rn50kit.launch.plan import plan_launch
from rn50kit.training.configure import complete
from support.checkpoints import fake_checkpoint
from support.processes import ROOT
from support.runs import planned_train_argv


def test_runner_passes_bfloat16_to_train_py_on_a_cpu_and_refuses_it_on_gpus(tmp_path):
    for name in ("train.rec", "train.idx", "val.rec", "val.idx"):
        (tmp_path / name).write_bytes(b"")
    _, _, command = plan_launch(["-n", "1", "--dtype", "bfloat16", "--data-root", str(tmp_path)],
                                Machine(0, 8), {})
    args = train.parse_args(command[next(i for i, w in enumerate(command) if w.endswith("train.py")) + 1:])
    assert args.dtype == "bfloat16"
    net = models.get_model_from_args(args)  # as train.py builds it for AMP: float32 parameters, float32 logits
    assert net.dtype == "bfloat16"
    net.initialize()
    net.infer_shape(mx.nd.zeros((1, 3, 224, 224)))
    assert {np.dtype(p.dtype) for p in net.collect_params().values()} == {np.dtype(np.float32)}
    _, (logits,), _ = net(mx.sym.var("data")).infer_type(data="float32")
    assert np.dtype(logits) == np.float32
    with pytest.raises(UsageError, match="bfloat16 runs on the CPU only"):
        plan_launch(["-n", "1", "--dtype", "bfloat16", "--data-root", str(tmp_path)],
                    Machine(8, 64), {})


def test_runner_float16_scoring_takes_a_32_pixel_checkpoints_shape(data_folder, tmp_path):
    """examples/SCORE_FP16.sh's case: runner's float16 scoring of a checkpoint trained at 32 pixels.
    Found by the second review of the GPU paths (issue 21)."""
    workspace = tmp_path / "ws"
    params = fake_checkpoint(workspace, 2, num_classes=10, image_shape=[3, 32, 32], data_val_resize=32)
    _, argv = planned_train_argv(["-n", 1, "-b", 128, "--data-root", data_folder, "--mode", "val",
                                  "--load", params, "--workspace", workspace])
    given = settings.given_flags(train.get_args_parser(), argv)
    assert not given & {"image_shape", "input_layout", "conv_layout"}  # runner typed none of them
    args = train.parse_args(argv)
    complete(args, given, num_gpus=8)
    assert args.image_shape == [4, 32, 32] and args.data_val_resize == 32 and args.num_classes == 10
    assert (args.input_layout, args.conv_layout, args.batchnorm_layout, args.pooling_layout) == ("NHWC",) * 4


EIGHT_GPUS = dict(gpus=8, cores=64)


def plan(argv, gpus, cores, environ=None):
    _, env, command = plan_launch([str(a) for a in argv], Machine(gpus, cores), environ or {})
    return env, command


def train_args(command, num_gpus=8):
    """The planned train.py arguments, parsed by train.py's own parser, with the defaults a worker seeing
    ``num_gpus`` GPUs gives a float16 run (devices.float16_gpu_defaults)."""
    start = next(i for i, word in enumerate(command) if word.endswith("train.py")) + 1
    args = train.parse_args(command[start:])
    devices.apply_float16_gpu_defaults(args, settings.given_flags(train.get_args_parser(), command[start:]), num_gpus)
    return args


def test_eight_gpus_float16_is_the_originals_settings_without_fusions(data_root):
    env, command = plan(["-n", 8, "-b", 208, "--data-root", data_root], **EIGHT_GPUS)
    assert os.path.basename(command[0]) == "horovodrun" and command[1:6] == ["-np", "8", "-H", "localhost:8", "--gloo"]
    args = train_args(command)
    assert args.dtype == "float16" and args.data_backend == "dali-gpu" and args.kv_store == "horovod"
    assert args.batch_size == 8 * 208 and args.lr is None  # no -l: train.py scales the recipe's LR per 256
    train.fill_hyper_parameters(args)
    assert args.lr == pytest.approx(0.256 * 8 * 208 / 256)
    # The original's float16 flags (its runner, 2019-10): NHWC compute, 4-channel input; our input is NHWC too
    # (DALI writes HWC), and no fused BatchNorm ops, which upstream MXNet has no GPU kernel for.
    assert (args.conv_layout, args.batchnorm_layout, args.pooling_layout, args.input_layout) == ("NHWC",) * 4
    assert args.image_shape == [4, 224, 224]
    assert args.fuse_bn_relu == 0 and args.fuse_bn_add_relu == 0
    assert args.data_train == str(data_root / "train.rec") and args.data_val == str(data_root / "val.rec")
    # The network these flags build: float16 NHWC convolutions over 4 input channels, float32 BatchNorm.
    net = models.get_model_from_args(args)
    net.initialize()
    net.infer_shape(mx.nd.zeros((1, 224, 224, 4), dtype="float16"))
    params = net.collect_params()
    assert params["conv0_weight"].shape == (64, 7, 7, 4) and params["conv0_weight"].dtype == "float16"
    assert params["bn0_gamma"].dtype == "float32"
    assert all(layer._kwargs["layout"] == "NHWC" for layer in walk(net) if isinstance(layer, mx.gluon.nn.Conv2D))
    assert all(layer._kwargs["axis"] == 3 for layer in walk(net) if isinstance(layer, mx.gluon.nn.BatchNorm))
    for key, value in environment.GPU_ENV.items():
        assert env[key] == value
    assert env["OMP_NUM_THREADS"] == "1" and env["HOROVOD_CYCLE_TIME"] == "0.1"


def walk(block):
    yield block
    for child in block._children.values():
        yield from walk(child)


def test_the_example_script_plans_the_same(data_root):
    """examples/RN50_FP16_8.sh's runner arguments."""
    with open(os.path.join(ROOT, "examples", "RN50_FP16_8.sh")) as f:
        line = next(line for line in f if '"$KIT/runner"' in line)
    argv = line.split('"$KIT/runner"')[1].replace('"$@"', "").split()
    _, command = plan(argv + ["--data-root", data_root], **EIGHT_GPUS)
    _, reference = plan(["-n", 8, "-b", 208, "--data-root", data_root, "--model-prefix", "model"], **EIGHT_GPUS)
    assert command == reference


def test_users_layout_and_shape_are_kept_and_mxnet_backend_gets_3_channels_nchw_input(data_root):
    _, command = plan(["-n", 8, "--data-root", data_root, "--conv-layout", "NCHW", "--image-shape", "3,160,160"],
                      **EIGHT_GPUS)
    args = train_args(command)
    assert args.conv_layout == "NCHW" and args.batchnorm_layout is None and args.image_shape == [3, 160, 160]
    assert command.count("--image-shape") == 1
    _, command = plan(["-n", 8, "--data-root", data_root, "--data-backend", "mxnet"], **EIGHT_GPUS)
    args = train_args(command)
    assert args.input_layout == "NCHW" and args.conv_layout == "NHWC" and args.image_shape == [3, 224, 224]


def test_fused_bn_relu_is_refused_on_gpus_and_allowed_on_cpus(data_root):
    with pytest.raises(UsageError, match="--fuse-bn-relu 1 runs on CPUs only"):
        plan(["-n", 8, "--data-root", data_root, "--fuse-bn-relu", "1"], **EIGHT_GPUS)
    _, command = plan(["-n", 1, "--data-root", data_root, "--fuse-bn-relu", "1"], gpus=0, cores=2)
    assert train_args(command).fuse_bn_relu == 1


def test_eight_gpus_float32(data_root):
    env, command = plan(["-n", 8, "-b", 96, "--dtype", "float32", "--data-root", data_root], **EIGHT_GPUS)
    args = train_args(command)
    assert args.dtype == "float32" and args.data_backend == "dali-gpu" and args.batch_size == 768
    assert args.conv_layout == "NCHW" and args.input_layout == "NCHW" and args.image_shape == [3, 224, 224]
    assert "--conv-layout" not in command and "--image-shape" not in command
    assert env["MXNET_OPTIMIZER_AGGREGATION_SIZE"] == "60" and env["MXNET_ENABLE_CUDA_GRAPHS"] == "1"


def test_one_process_for_all_gpus(data_root):
    env, command = plan(["-n", 4, "--kv-store", "device", "--data-root", data_root], **EIGHT_GPUS)
    assert command[0].endswith("python") and command[1].endswith("train.py")
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    env, _ = plan(["-n", 4, "--kv-store", "device", "--data-root", data_root], **EIGHT_GPUS,
                  environ={"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    assert "CUDA_VISIBLE_DEVICES" not in env  # the user's choice stays


def test_two_nodes_of_eight_gpus(data_root):
    env, command = plan(["-n", 16, "-b", 208, "-H", "node1:8,node2:8", "--data-root", data_root], **EIGHT_GPUS)
    assert command[1:6] == ["-np", "16", "-H", "node1:8,node2:8", "--gloo"]
    args = train_args(command)
    assert args.batch_size == 16 * 208 and args.dtype == "float16" and args.conv_layout == "NHWC"
    with pytest.raises(UsageError, match="more than the 16 slots"):
        plan(["-n", 17, "-H", "node1:8,node2:8", "--data-root", data_root], **EIGHT_GPUS)
    with pytest.raises(UsageError, match="more than the 8 GPU"):
        plan(["-n", 9, "--data-root", data_root], **EIGHT_GPUS)


def test_cpu_machine(data_root):
    env, command = plan(["-n", 2, "-b", 32, "--data-root", data_root], gpus=0, cores=16,
                        environ={"HOROVOD_FUSION_THRESHOLD": "1000"})
    args = train_args(command)
    assert args.dtype == "float32" and args.data_backend == "dali-cpu" and args.conv_layout == "NCHW"
    assert env["OMP_NUM_THREADS"] == "8" and env["HOROVOD_CYCLE_TIME"] == "20"
    assert env["HOROVOD_FUSION_THRESHOLD"] == "1000"  # a value already set wins
    assert "MXNET_ENABLE_CUDA_GRAPHS" not in env and "MXNET_OPTIMIZER_AGGREGATION_SIZE" not in env
    with pytest.raises(UsageError, match="float16 needs a GPU"):
        plan(["-n", 1, "--dtype", "float16", "--data-root", data_root], gpus=0, cores=16)


# Read only by code that the CPU build of MXNet does not compile: checked in the 1.9.1 source instead.
GPU_BUILD_ONLY = {"MXNET_ENABLE_CUDA_GRAPHS": "src/executor/cuda_graphs.h (CudaGraphsExec, CUDA >= 10.2)"}


def test_every_variable_runner_sets_is_read_by_the_installed_libraries():
    import horovod.mxnet
    mxnet_dir = os.path.dirname(mx.__file__)
    texts = []
    for folder, suffixes in ((mxnet_dir, (".py", ".so")), (os.path.dirname(horovod.mxnet.__file__), (".so",))):
        for base, _, files in os.walk(folder):
            for name in files:
                if name.endswith(suffixes):
                    with open(os.path.join(base, name), "rb") as f:
                        texts.append(f.read())
    for variable in {**environment.COMMON_ENV, **environment.GPU_ENV}:
        if variable in GPU_BUILD_ONLY:
            continue
        assert any(variable.encode() in text for text in texts), f"{variable}: no installed library reads it"


def test_gpu_of_each_rank():
    assert [devices.horovod_ordinal(r, 8, 8) for r in range(8)] == list(range(8))  # horovodrun: all GPUs visible
    assert [devices.horovod_ordinal(r, 8, 1) for r in range(8)] == [0] * 8  # srun --gpus-per-task=1
    with pytest.raises(ValueError, match="sees 2 GPUs"):
        devices.horovod_ordinal(5, 8, 2)


def test_fused_bn_relu_is_refused_where_upstream_has_no_kernel():
    args = train.parse_args(["--fuse-bn-relu", "1"])
    assert "CPUs only" in rules.fusion_problem(train_config.from_args(args).model.fuse_bn_relu, gpu=True)
    assert rules.fusion_problem(train_config.from_args(args).model.fuse_bn_relu, gpu=False) is None
    args = train.parse_args(["--fuse-bn-relu", "1", "--conv-layout", "NHWC"])
    with pytest.raises(ValueError, match="axis 1 only"):
        models.get_model_from_args(args)


def test_with_nvidias_build_float16_on_gpus_fuses_as_the_original_and_upstream_is_unchanged(data_root, monkeypatch):
    """NVIDIA's MXNet (its fused BatchNorm ops, stand-ins here): runner lets --fuse-bn-relu 1 through and a float16
    NHWC run gets the original's `--fuse-bn-relu 1 --fuse-bn-add-relu 1`; flags the user typed and an NCHW run
    keep theirs. Upstream's build (test_eight_gpus_float16_...): no fusions and the refusal."""
    from support import fused_standins
    fused_standins.register(monkeypatch)
    nvidia = Machine(8, 64, nvidia_fused=True)
    _, _, command = plan_launch(["-n", "8", "--data-root", str(data_root)], nvidia, {})
    args = train_args(command)
    assert args.fuse_bn_relu == 1 and args.fuse_bn_add_relu == 1 and args.conv_layout == "NHWC"
    net = models.get_model_from_args(args)
    assert any(isinstance(block, models.BatchNormActReLU) for block in walk(net))
    assert all(block.fused for block in walk(net) if isinstance(block, models.BatchNormAddReLU))
    _, _, command = plan_launch(["-n", "8", "--data-root", str(data_root), "--fuse-bn-relu", "1",
                                 "--fuse-bn-add-relu", "0"], nvidia, {})
    args = train_args(command)
    assert args.fuse_bn_relu == 1 and args.fuse_bn_add_relu == 0
    _, _, command = plan_launch(["-n", "8", "--data-root", str(data_root), "--conv-layout", "NCHW"],
                                nvidia, {})
    assert train_args(command).fuse_bn_relu == 0
    _, _, command = plan_launch(["-n", "8", "--data-root", str(data_root), "--dtype", "float32"], nvidia, {})
    assert train_args(command).fuse_bn_relu == 0
    assert rules.fusion_problem(1, gpu=True, nvidia_fused=True) is None
    assert "CPUs only" in rules.fusion_problem(1, gpu=True)
