"""Issue 21 (the second review of the GPU paths): each defect reproduced on CPU, with a described 8-GPU machine,
the float16 structures built on CPU, several CPU contexts, or device contexts that allocate nothing
(``mx.gpu(i)`` objects exist on a CPU build)."""
import os

import mxnet as mx
import numpy as np
import pytest

from rn50kit.common import backends
import dali
from rn50kit.data import loaders


# --- 1: a CPU pipeline's batch for a GPU is staged in pinned host memory, then copied to the GPU -------------

CONTEXTS = [mx.cpu(), mx.cpu(1), mx.gpu(0), mx.gpu(3)]


@pytest.mark.parametrize("backend", [name for name in backends.NAMES if backends.get(name).builder.endswith("dali_iterators")])
@pytest.mark.parametrize("ctx", CONTEXTS, ids=str)
def test_every_dali_copy_has_source_and_destination_of_one_memory_kind(backend, ctx):
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
    with pytest.raises(AssertionError, match="cpu output copied into gpu"):
        dali.check_copy("cpu", mx.gpu(0))
    with pytest.raises(AssertionError):
        dali.check_copy("gpu", mx.cpu_pinned(0))


def test_dali_cpu_batches_for_a_gpu_rank_go_through_pinned_memory(unique_label_rec, monkeypatch):
    """A real dali-cpu pipeline handed a GPU context (mx.gpu(0): allocations for it are made on the CPU here, and
    recorded): every copy out of DALI writes host memory, then the batch is copied to the arrays made for gpu(0)."""
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


# --- 2: flags runner adds are not the user's: scoring takes the image shape from the checkpoint --------------

from rn50kit.launch import launcher as runner  # noqa: E402
from rn50kit.config import settings  # noqa: E402
import train  # noqa: E402
from test_settings import fake_checkpoint  # noqa: E402

EIGHT_GPUS = runner.Machine(8, 64)


def planned_train_argv(argv, machine=EIGHT_GPUS, environ=None):
    _, env, command = runner.plan_launch([str(a) for a in argv], machine, environ or {})
    start = next(i for i, word in enumerate(command) if word.endswith("train.py")) + 1
    return env, command[start:]


@pytest.fixture()
def data_root(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    for name in ("train.rec", "train.idx", "val.rec", "val.idx"):
        (root / name).write_bytes(b"")
    return root


def test_runner_float16_scoring_takes_a_32_pixel_checkpoints_shape(data_root, tmp_path):
    """examples/SCORE_FP16.sh's case: runner's float16 scoring of a checkpoint trained at 32 pixels."""
    workspace = tmp_path / "ws"
    params = fake_checkpoint(workspace, 2, num_classes=10, image_shape=[3, 32, 32], data_val_resize=32)
    _, argv = planned_train_argv(["-n", 1, "-b", 128, "--data-root", data_root, "--mode", "val",
                                  "--load", params, "--workspace", workspace])
    given = settings.given_flags(train.get_args_parser(), argv)
    assert not given & {"image_shape", "input_layout", "conv_layout"}  # runner typed none of them
    args = train.parse_args(argv)
    settings.complete(args, given, num_gpus=8)
    assert args.image_shape == [4, 32, 32] and args.data_val_resize == 32 and args.num_classes == 10
    assert (args.input_layout, args.conv_layout, args.batchnorm_layout, args.pooling_layout) == ("NHWC",) * 4


def test_python_train_py_on_a_gpu_gets_the_float16_defaults_runner_gets(tmp_path):
    """One place for a float16 GPU run's defaults: train.py alone on a GPU machine (described: 8 GPUs)."""
    argv = ["--data-backend", "synthetic", "--workspace", str(tmp_path)]
    args = train.parse_args(argv)
    settings.complete(args, settings.given_flags(train.get_args_parser(), argv), num_gpus=8)
    assert args.dtype == "float16" and args.image_shape == [4, 224, 224]
    assert (args.input_layout, args.conv_layout) == ("NHWC", "NHWC")
    argv += ["--conv-layout", "NCHW", "--image-shape", "3,160,160"]  # the user's choice stays
    args = train.parse_args(argv)
    settings.complete(args, settings.given_flags(train.get_args_parser(), argv), num_gpus=8)
    assert args.conv_layout == "NCHW" and args.input_layout == "NCHW" and args.image_shape == [3, 160, 160]


# --- 4: one rule for --gpus: it selects the GPUs with every --kv-store, consistently with runner's variable ---

def fit_cfg(**fields):
    from rn50kit.training import fit_flags
    return fit_flags.FitConfig(**fields)


def test_kv_store_device_gpus_2_3_under_runner_computes_on_the_two_gpus_it_sees(data_root):
    env, argv = planned_train_argv(["-n", 2, "--kv-store", "device", "--gpus", "2,3", "--data-root", data_root])
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    args = train.parse_args(argv)
    ctxs = train.contexts(fit_cfg(kv_store="device", gpus=args.gpus), 0, 1, num_gpus=2, environ=env)
    assert ctxs == [mx.gpu(0), mx.gpu(1)]  # physical GPUs 2 and 3, as this process numbers them


def test_gpus_must_agree_with_n_and_name_gpus_that_exist(data_root):
    with pytest.raises(runner.UsageError, match="-n 4 but --gpus 0,1 names 2"):
        planned_train_argv(["-n", 4, "--kv-store", "device", "--gpus", "0,1", "--data-root", data_root])
    with pytest.raises(train.UsageError, match="GPU 9, and this machine has GPUs 0 to 7"):
        train.contexts(fit_cfg(kv_store="device", gpus="0,9"), 0, 1, num_gpus=8, environ={})
    with pytest.raises(train.UsageError, match="CUDA_VISIBLE_DEVICES=0,1 hides"):
        train.contexts(fit_cfg(kv_store="device", gpus="2"), 0, 1, num_gpus=2,
                       environ={"CUDA_VISIBLE_DEVICES": "0,1"})


def test_gpus_selects_each_horovod_ranks_gpu(data_root):
    env, argv = planned_train_argv(["-n", 2, "--gpus", "4,6", "--data-root", data_root])
    assert "CUDA_VISIBLE_DEVICES" not in env  # every rank sees the node's GPUs
    cfg = fit_cfg(kv_store="horovod", gpus=train.parse_args(argv).gpus)
    assert [train.contexts(cfg, rank, 2, num_gpus=8, environ=env) for rank in range(2)] == [[mx.gpu(4)], [mx.gpu(6)]]
    with pytest.raises(runner.UsageError, match="-n 4 but --gpus 4,6 names 2"):
        planned_train_argv(["-n", 4, "--gpus", "4,6", "--data-root", data_root])
    assert train.contexts(fit_cfg(kv_store="horovod"), 3, 8, num_gpus=8, environ={}) == [mx.gpu(3)]


# --- 6: the mxnet backend copies to the device first, then casts, pads and transposes there ----------------

def test_mxnet_backend_converts_on_the_device(monkeypatch):
    seen = []
    real = loaders.to_layout

    def to_layout(batch, *rest):
        seen.append(batch.context)
        return real(batch, *rest)

    class Records:  # ImageRecordIter's batches: float32 NCHW in host memory
        def next(self):
            return mx.io.DataBatch(data=[mx.nd.ones((2, 3, 8, 8))], label=[mx.nd.zeros((2,))])

        def reset(self):
            pass

    monkeypatch.setattr(loaders, "to_layout", to_layout)
    device = mx.cpu(1)  # a context other than the reader's, standing in for the GPU
    iterator = loaders.RecordIterator(Records(), 4, 2, device, channels=4, dtype="float16", layout="NHWC", wrap=True)
    batch = next(iter(iterator))
    assert seen == [device]
    assert batch.data[0].shape == (2, 8, 8, 4) and batch.data[0].dtype == np.float16
    assert batch.data[0].context == device


# --- 8: DALI's threads from the affinity mask -----------------------------------------------------------------

def test_pipeline_threads_follow_the_affinity_mask(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert loaders.default_threads(1) == 4 and loaders.default_threads(2) == 2


# --- 3: resuming a checkpoint of another dtype, layout or channel count is refused in one line ---------------

import gc  # noqa: E402
import weakref  # noqa: E402

from rn50kit.config import train_config  # noqa: E402
import fit  # noqa: E402
from rn50kit.training.state import RunInfo  # noqa: E402
from rn50kit.scoring import scoring  # noqa: E402
from rn50kit.training.distributed import Distributed  # noqa: E402


def run_info(**args):
    return RunInfo(model_name="resnet50_v1.5", arch="resnetv15", command=[], report_path="report.json",
                   record={"args": args, "given": [], "derived": {}})


FLOAT32_RUN = dict(dtype="float32", conv_layout="NCHW", input_layout="NCHW", image_shape=[3, 224, 224])
FLOAT16_RUN = dict(dtype="float16", conv_layout="NHWC", input_layout="NHWC", image_shape=[4, 224, 224])


def test_rn50_fp32_then_fp16_in_one_workspace_is_refused_before_anything_loads():
    """RN50_FP32_8.sh, then RN50_FP16_8.sh in the same default workspace: --resume auto finds the float32
    checkpoint. The refusal comes before any file is read (the paths here do not exist)."""
    saved = {"model": "resnet50_v1.5", "state_path": "runs/resnet50_v1.5/model-0003.state.json",
             "paths": {"params": "/nonexistent.params", "states": "/nonexistent.states"}, "args": FLOAT32_RUN}
    with pytest.raises(fit.TrainingError) as refused:
        fit.resume(None, saved, run_info(**FLOAT16_RUN), None, [mx.cpu()], Distributed(None))
    message = str(refused.value)
    assert "\n" not in message and "--resume none" in message and "--workspace" in message
    assert "--dtype float32 --conv-layout NCHW, 3 input channels" in message
    assert "--dtype float16 --conv-layout NHWC, 4 input channels" in message


def test_resume_settings_that_do_not_shape_the_state_are_not_refused():
    from rn50kit.config import settings as settings_module
    other_size = dict(FLOAT16_RUN, image_shape=[4, 160, 160], input_layout="NCHW")  # size and input layout
    assert settings_module.resume_problem(FLOAT16_RUN, other_size, "x") is None
    assert settings_module.resume_problem({}, FLOAT16_RUN, "x") is None  # an older state without the records
    assert settings_module.resume_problem(dict(FLOAT32_RUN, dtype="bfloat16"), FLOAT32_RUN, "x") is None


# --- 5: evaluation queues every device's forward before reading any result ----------------------------------

@pytest.mark.slow  # a heavier in-process test (the fast lane stays under a minute)
def test_evaluate_queues_every_devices_forward_before_reading(monkeypatch):
    events = []
    ctxs = [mx.cpu(0), mx.cpu(1)]

    def net(data):
        events.append(("forward", data.context))
        logits = mx.nd.zeros((data.shape[0], 10), ctx=data.context)
        logits[:, 3] = 1
        return logits

    real_asscalar, real_wait = mx.nd.NDArray.asscalar, mx.nd.NDArray.wait_to_read
    monkeypatch.setattr(mx.nd.NDArray, "asscalar", lambda self: events.append(("read",)) or real_asscalar(self))
    monkeypatch.setattr(mx.nd.NDArray, "wait_to_read", lambda self: events.append(("read",)) or real_wait(self))
    batch = mx.io.DataBatch(data=[mx.nd.ones((4, 3, 8, 8))], label=[mx.nd.array([3, 3, 1, 3])], pad=0)
    metrics = scoring.evaluate(net, [batch, batch], ctxs, Distributed(None))
    assert metrics["top1"] == pytest.approx(0.75) and metrics["samples"] == 8
    first_read = events.index(("read",))
    assert events[:first_read] == [("forward", ctxs[0]), ("forward", ctxs[1])]
    events.clear()
    scoring.evaluate(net, [batch], ctxs, Distributed(None), no_metrics=True)
    assert events[:2] == [("forward", ctxs[0]), ("forward", ctxs[1])]


# --- 7: the epoch-0 training pipeline is let go once used, or at once after a resume -------------------------

class Pipeline:
    pass


def test_epoch_0_pipeline_is_not_kept_for_the_run(monkeypatch):
    monkeypatch.setattr(loaders, "get_data_iterators_per_device", lambda *args: (Pipeline(), None))
    cfg = train_config.RunConfig().replace(fit__seed=1)
    dist = Distributed(None)
    first = Pipeline()
    gone = weakref.ref(first)
    make = train.train_iterator_factory(cfg, dist, [mx.cpu()], first)
    del first
    epoch0 = make(0)
    assert epoch0 is gone()
    del epoch0  # the loop drops each epoch's iterator when the epoch ends
    make(1)
    gc.collect()
    assert gone() is None


def test_a_resumed_run_lets_the_unused_epoch_0_pipeline_go(monkeypatch):
    monkeypatch.setattr(loaders, "get_data_iterators_per_device", lambda *args: (Pipeline(), None))
    cfg = train_config.RunConfig().replace(fit__seed=1)
    first = Pipeline()
    gone = weakref.ref(first)
    make = train.train_iterator_factory(cfg, Distributed(None), [mx.cpu()], first)
    del first
    assert isinstance(make(3), Pipeline)
    gc.collect()
    assert gone() is None


# --- 8: MXNet's errors at the entry point: one line saying what to do --------------------------------------

OOM = ("Traceback (most recent call last):\n  File \"src/storage/./pooled_storage_manager.h\", line 161\n"
       "MXNetError: cudaMalloc retry failed: out of memory")
BAD_DEVICE = ("Traceback (most recent call last):\n  File \"src/engine/threaded_engine.cc\", line 331\n"
              "MXNetError: [10:00:00] ../include/mxnet/base.h:427: Check failed: e == cudaSuccess (101 vs. 0) : "
              "CUDA: invalid device ordinal")


@pytest.mark.parametrize("text,expected", [(OOM, "ran out of memory; use a smaller batch (runner's -b"),
                                           (BAD_DEVICE, "a GPU id that does not exist was asked for: this process "
                                                        "sees GPUs none; check --gpus")])
def test_train_py_ends_an_mxnet_error_in_one_line(monkeypatch, capsys, text, expected):
    def main(*args, **kwargs):
        raise mx.base.MXNetError(text)

    monkeypatch.setattr(train, "main", main)
    with pytest.raises(SystemExit) as ended:
        train.run(["--data-backend", "synthetic"])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("train.py: error: ") and expected in err


def test_benchmark_reports_the_layout_a_float16_gpu_run_computes_in(data_root):
    """benchmark.py reads the layout from runner's plan: runner no longer types the float16 defaults."""
    import benchmark
    _, env, command = runner.plan_launch(["-n", "8", "-b", "208", "--data-root", str(data_root)], EIGHT_GPUS, {})
    assert benchmark.run_settings(" ".join(command))["layout"] == {"input": "NHWC", "conv": "NHWC"}
    _, env, command = runner.plan_launch(["-n", "8", "--data-root", str(data_root), "--data-backend", "mxnet"],
                                         EIGHT_GPUS, {})
    assert benchmark.run_settings(" ".join(command))["layout"] == {"input": "NCHW", "conv": "NHWC"}
    _, env, command = runner.plan_launch(["-n", "8", "--dtype", "float32", "--data-root", str(data_root)],
                                         EIGHT_GPUS, {})
    assert benchmark.run_settings(" ".join(command))["layout"] == {"input": "NCHW", "conv": "NCHW"}
