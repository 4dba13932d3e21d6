"""checkpoint: damaged files named and refused, a save on a full disk, resumes across settings that shape the
state (refused) and those that do not, and what a bad resume says."""
import os
import resource
import struct

import mxnet as mx
import numpy as np
import pytest

import fit
from rn50kit.training import state
from rn50kit.training.distributed import Distributed
from support.checkpoints import fake_checkpoint, save_tiny


def test_every_kind_of_damage_is_named_and_all_damaged_is_refused(tmp_path):
    from rn50kit.weights import checkpoint
    prefix = tmp_path / "model"
    save_tiny(prefix, [1, 2])
    assert checkpoint.find_latest(str(prefix))["epoch"] == 2
    states = tmp_path / "model-0002.states"
    data = bytearray(states.read_bytes())
    data[len(data) // 2] ^= 1  # same size, one bit flipped: only the SHA-256 tells
    states.write_bytes(bytes(data))
    assert checkpoint.read_state(str(tmp_path / "model-0002.state.json")) is not None  # sizes agree
    warnings = []
    assert checkpoint.find_latest(str(prefix), warnings.append)["epoch"] == 1
    assert warnings == [f"skipping checkpoint model-0002: {states} is damaged (its contents differ from when it "
                        f"was saved); falling back to {tmp_path / 'model-0001.state.json'}"]
    (tmp_path / "model-0001.state.json").write_text("{\"epoch\": 1,")  # cut short
    with pytest.raises(checkpoint.CheckpointError, match="every checkpoint of .* is damaged or incomplete"):
        checkpoint.resume_point(str(prefix))
    assert checkpoint.named(str(tmp_path / "model-0001.params"))[1] == \
        f"{tmp_path / 'model-0001.state.json'} is damaged (not valid JSON)"


def test_a_save_on_a_full_disk_removes_its_part_and_says_so(tmp_path):
    from rn50kit.weights import checkpoint
    prefix = tmp_path / "model"
    net, trainer = save_tiny(prefix, [1])
    before = sorted(os.listdir(tmp_path))
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20000, hard))  # Python ignores SIGXFSZ: writes fail with EFBIG
    try:
        with pytest.raises(checkpoint.CheckpointError) as caught:
            checkpoint.save(str(prefix), net, trainer, {"epoch": 2, "step": 0})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert str(caught.value) == (
        f"the disk is full: cannot save checkpoint model-0002 in {tmp_path} (File too large); the last complete "
        f"checkpoint, {tmp_path / 'model-0001.state.json'}, is intact; free space there (or give another "
        "--workspace) and rerun the same command to resume")
    assert sorted(os.listdir(tmp_path)) == before


def run_info(**args):
    return state.RunInfo(model_name="resnet50_v1.5", arch="resnetv15", command=[], report_path="report.json",
                       record={"args": args, "given": [], "derived": {}})


FLOAT32_RUN = dict(dtype="float32", conv_layout="NCHW", input_layout="NCHW", image_shape=[3, 224, 224])


FLOAT16_RUN = dict(dtype="float16", conv_layout="NHWC", input_layout="NHWC", image_shape=[4, 224, 224])


def test_rn50_fp32_then_fp16_in_one_workspace_is_refused_before_anything_loads():
    """RN50_FP32_8.sh, then RN50_FP16_8.sh in the same default workspace: --resume auto finds the float32
    checkpoint. The refusal comes before any file is read (the paths here do not exist).
    Found by the second review of the GPU paths (issue 21)."""
    saved = {"model": "resnet50_v1.5", "state_path": "runs/resnet50_v1.5/model-0003.state.json",
             "paths": {"params": "/nonexistent.params", "states": "/nonexistent.states"}, "args": FLOAT32_RUN}
    with pytest.raises(fit.TrainingError) as refused:
        fit.resume(None, saved, run_info(**FLOAT16_RUN), None, [mx.cpu()], Distributed(None))
    message = str(refused.value)
    assert "\n" not in message and "--resume none" in message and "--workspace" in message
    assert "--dtype float32 --conv-layout NCHW, 3 input channels" in message
    assert "--dtype float16 --conv-layout NHWC, 4 input channels" in message


def test_resume_settings_that_do_not_shape_the_state_are_not_refused():
    """Found by the second review of the GPU paths (issue 21)."""
    from rn50kit.config import settings as settings_module
    other_size = dict(FLOAT16_RUN, image_shape=[4, 160, 160], input_layout="NCHW")  # size and input layout
    assert settings_module.resume_problem(FLOAT16_RUN, other_size, "x") is None
    assert settings_module.resume_problem({}, FLOAT16_RUN, "x") is None  # an older state without the records
    assert settings_module.resume_problem(dict(FLOAT32_RUN, dtype="bfloat16"), FLOAT32_RUN, "x") is None


def test_a_bad_resume_says_which_case_what_exists_and_what_is_accepted(tmp_path):
    """Found by the second newcomer walk (issue 26)."""
    from rn50kit.weights import checkpoint
    from support.checkpoints import touch
    fake_checkpoint(tmp_path, 2)
    touch(tmp_path / "model-best.params")
    touch(tmp_path / "model-0001.params")  # no state file beside it
    accepted = "give --resume auto (the latest), none (start afresh) or a <prefix>-NNNN.params"
    cases = {"model-0009.params": "no such file",
             "model-best.params": "a -best or -ema copy holds weights only",
             "model-0001.params": "no model-0001.state.json beside it"}
    for name, case in cases.items():
        message = checkpoint.why_not_resumable(str(tmp_path / name))
        assert f": {case}" in message and f"complete checkpoints in {tmp_path}: model-0002.params" in message
        assert accepted in message and "\n" not in message
    (tmp_path / "model-0002.states").unlink()
    message = checkpoint.why_not_resumable(str(tmp_path / "model-0002.params"))
    assert "its files model-0002.states are missing" in message and f"no complete checkpoint in {tmp_path}" in message


ITEM_SIZES = {0: 4, 1: 8, 2: 2, 3: 1, 4: 4, 5: 1, 6: 8}  # MXNet's type flags: float32, float64, float16, ...


def saved_devices(path):
    """The device each array of an mx.nd.save file was saved from, read from its bytes (mx.nd.load puts every
    host array on cpu(0), whatever it records): MXNet 1.9.1's NDArray::Save layout of dense arrays."""
    data = open(path, "rb").read()
    assert struct.unpack_from("<Q", data)[0] == 0x112
    count, offset, devices = struct.unpack_from("<Q", data, 16)[0], 24, []
    for _ in range(count):
        magic, storage, ndim = struct.unpack_from("<Iii", data, offset)
        assert magic == 0xF993FAC9 and storage == 0
        shape = struct.unpack_from(f"<{ndim}q", data, offset + 12)
        device_type, device_id, type_flag = struct.unpack_from("<iii", data, offset + 12 + 8 * ndim)
        devices.append(f"{ {1: 'cpu', 2: 'gpu'}[device_type]}({device_id})")
        offset += 24 + 8 * ndim + int(np.prod(shape)) * ITEM_SIZES[type_flag]
    return devices


def test_arrays_are_written_from_the_host_and_loaded_onto_each_device(tmp_path):
    """A checkpoint's optimizer state and EMA are written as host copies (MXNet records each array's device and
    loads it back there: every rank on GPU 0), and the state comes back onto each of the trainer's own devices.
    On CPU, devices that leave out cpu(0) stand for a rank's GPUs."""
    from rn50kit.weights import checkpoint, optimizer_state
    devices = [mx.cpu(1), mx.cpu(2)]

    def build():
        net = mx.gluon.nn.HybridSequential()
        net.add(mx.gluon.nn.Dense(8, in_units=16), mx.gluon.nn.Dense(4, in_units=8))
        net.initialize(ctx=devices)
        net.hybridize()
        trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9,
                                                                 "multi_precision": True},
                                   kvstore=mx.kvstore.create("local"), update_on_kvstore=False)
        return net, trainer

    net, trainer = build()
    for _ in range(2):
        with mx.autograd.record():
            losses = [net(mx.nd.ones((2, 16), ctx=device)).sum() for device in devices]
        mx.autograd.backward(losses)
        trainer.step(4)
    ema = {name: p.data(devices[0]).copy() for name, p in net.collect_params().items()}
    checkpoint.save(str(tmp_path / "model"), net, trainer, {"epoch": 1, "step": 0}, ema=ema)
    state = checkpoint.read_state(str(tmp_path / "model-0001.state.json"), verify=True)
    written = {kind: saved_devices(state["paths"][kind]) for kind in ("states", "ema")}
    assert written == {"states": ["cpu(0)"] * 4, "ema": ["cpu(0)"] * 4}  # a momentum per weight and bias

    resumed_net, resumed = build()
    optimizer_state.restore(resumed, state["paths"]["states"], state["optimizer_state"], state["state_path"])
    for updater, device in zip(resumed._updaters, devices):
        assert sorted(updater.states) == [0, 1, 2, 3]
        assert {str(s.context) for s in updater.states.values()} == {str(device)}
        for index, momentum in updater.states.items():
            np.testing.assert_array_equal(momentum.asnumpy(), trainer._updaters[0].states[index].asnumpy())
    first, second = (u.states[0] for u in resumed._updaters)
    first += 1  # each device's updater updates its own copy in place
    assert not np.array_equal(first.asnumpy(), second.asnumpy())


def test_load_of_a_checkpoints_other_files_or_an_export_says_what_it_is(tmp_path):
    """Issue 58: a .states file (NDArrays) loaded and was blamed on another architecture; an export was "damaged"."""
    from rn50kit.weights import checkpoint
    states = tmp_path / "model-0003.states"
    mx.nd.save(str(states), {"0": mx.nd.zeros((2,))})  # loads as NDArrays, as a real one does
    with pytest.raises(checkpoint.CheckpointError, match=r"model-0003.states is a checkpoint's optimizer state, "
                                                         r"not its weights: pass --load .*model-0003.params$"):
        checkpoint.check_loadable(str(states))
    export = tmp_path / "r18.safetensors"
    export.write_bytes(b"{}")
    with pytest.raises(checkpoint.CheckpointError, match="is exported weights") as refused:
        checkpoint.check_loadable(str(export))
    assert "damaged" not in str(refused.value) and f"--pretrained {export}" in str(refused.value)


def test_a_full_disk_at_the_report_is_one_line_naming_the_file(tmp_path):
    """The fault campaign, seeds 100054 and 100081: a disk full when rank 0 wrote the final report ended the run with
    an OSError's traceback; train.py tells it in one line (checkpoint.write_failure)."""
    from rn50kit.reporting import report
    from rn50kit.weights import checkpoint
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (10, hard))  # Python ignores SIGXFSZ: writes fail with EFBIG
    try:
        with pytest.raises(OSError) as caught:
            report.Report("resnet18", 1, ["train.py"]).save(str(tmp_path / "report.json"))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    line = checkpoint.write_failure(caught.value)
    assert line.startswith(f"the disk is full: cannot write {tmp_path / 'report.json'} (File too large); "), line
    assert os.listdir(tmp_path) == []  # no part left
    assert line.endswith("rerun the same command to resume") and "\n" not in line
    assert checkpoint.write_failure(PermissionError(13, "Permission denied", "x")) is None  # not a full disk
