"""pretrained.py: published weights, in each source's exact names and layout, give the kit's network the logits of an
independent reference forward pass (tests/resnet_reference.py, numpy, torchvision's semantics) on fixed inputs."""
import argparse
import os
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

import models
from rn50kit.weights import pretrained
import resnet_reference as ref

import safetensors.numpy as safetensors_numpy

X = np.random.RandomState(1).normal(size=(2, 3, 32, 32)).astype(np.float32)


def assert_logits(actual, expected):
    """float32 precision: the kit computes in float32, the reference in float64."""
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def kit_net(name, num_classes, **kwargs):
    net = models.get_model(name, num_classes=num_classes, **kwargs)
    net.initialize()
    return net


def load(name, path, num_classes, **kwargs):
    net = kit_net(name, num_classes, **kwargs)
    info = pretrained.load_pretrained(net, str(path), [mx.cpu()], num_classes)
    return net, info


def logits(net, x=X):
    return net(mx.nd.array(x)).asnumpy()


def save_safetensors(sd, path):
    safetensors_numpy.save_file(sd, str(path))
    return path


def save_params(weights, path):
    mx.nd.save(str(path), {k: mx.nd.array(v) for k, v in weights.items()})
    return path


class Weights:
    """One random state dict in torchvision's names, its reference logits and its files."""

    def __init__(self, folder, name, depth, num_classes, seed, **kwargs):
        self.sd = ref.torchvision_state_dict(depth, num_classes, seed=seed, **kwargs)
        self.stride_in_1x1 = kwargs.get("conv_bias_1x1", False)  # GluonCV's resnet_v1
        self.expected = ref.forward(self.sd, X, stride_in_1x1=self.stride_in_1x1)
        self.folder, self.name, self.num_classes = folder, name, num_classes

    def path(self, suffix):
        return self.folder / f"{self.name}{suffix}"


@pytest.fixture(scope="module")
def tv18(tmp_path_factory):
    weights = Weights(tmp_path_factory.mktemp("tv18"), "resnet18", 18, 7, seed=0)
    save_safetensors(weights.sd, weights.path(".safetensors"))
    return weights


@pytest.fixture(scope="module")
def tv50(tmp_path_factory):
    weights = Weights(tmp_path_factory.mktemp("tv50"), "resnet50", 50, 7, seed=1)
    save_safetensors(weights.sd, weights.path(".safetensors"))
    return weights


@pytest.fixture(scope="module")
def gluon50_v1(tmp_path_factory):
    """GluonCV resnet50_v1: stride on the first 1x1, biases on the 1x1 convolutions of the residual branch."""
    return Weights(tmp_path_factory.mktemp("g50"), "resnet50_v1", 50, 6, seed=2, conv_bias_1x1=True)


@pytest.fixture(scope="module")
def resnext50(tmp_path_factory):
    return Weights(tmp_path_factory.mktemp("rx50"), "resnext50_32x4d", 50, 5, seed=3, groups=32, width_per_group=4)


# ---------------------------------------------------------------------------------------------------------
# each source gives the reference's logits

@pytest.mark.slow  # a heavier in-process test (the fast lane stays under a minute)
@pytest.mark.parametrize("fixture, kit_name", [("tv18", "resnet18_v1.5"), ("tv50", "resnet50_v1.5")])
def test_torchvision_safetensors_give_reference_logits(request, fixture, kit_name):
    weights = request.getfixturevalue(fixture)
    net, info = load(kit_name, weights.path(".safetensors"), weights.num_classes)
    assert_logits(logits(net), weights.expected)
    assert (info.source, info.file_format, info.model, info.file_classes) == \
        ("torchvision/timm", "safetensors", kit_name, 7)
    assert not info.head_reinitialized and info.params_loaded == info.params_total


def test_torchvision_resnext_safetensors_give_reference_logits(resnext50):
    path = save_safetensors(resnext50.sd, resnext50.path(".safetensors"))
    net, info = load("resnext50_32x4d", path, 5)
    assert_logits(logits(net), resnext50.expected)
    assert info.model == "resnext50_32x4d" and info.params_loaded == info.params_total


def test_wrapper_prefix_and_bfloat16_safetensors(tv18, tmp_path):
    """DistributedDataParallel's ``module.`` prefix is dropped; bfloat16 tensors (which numpy cannot hold) are
    decoded from the file's bytes: the logits are those of the bfloat16-rounded weights."""
    import json
    import struct
    rounded = {}
    header, blobs, offset = {}, [], 0
    for key, value in tv18.sd.items():
        if value.dtype == np.float32:
            bits = (value.view(np.uint32) + 0x8000) >> 16  # round to the nearest bfloat16
            rounded[key] = (bits << 16).astype(np.uint32).view(np.float32)
            blob, dtype = bits.astype("<u2").tobytes(), "BF16"
        else:
            rounded[key], blob, dtype = value, value.astype("<i8").tobytes(), "I64"
        header["module." + key] = {"dtype": dtype, "shape": list(value.shape), "data_offsets": [offset,
                                                                                               offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    path = tmp_path / "bf16.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    net, info = load("resnet18_v1.5", path, 7)
    assert_logits(logits(net), ref.forward(rounded, X))
    assert info.params_loaded == info.params_total


def test_gluoncv_resnetv1b_params_give_reference_logits(tv50):
    path = save_params(ref.to_gluoncv_v1b(tv50.sd), tv50.path("_v1b.params"))
    net, info = load("resnet50_v1.5", path, 7)
    assert_logits(logits(net), tv50.expected)
    assert info.source == "GluonCV resnetv1b" and info.file_format == "params"


def test_gluoncv_resnet_v1_params_give_reference_logits(gluon50_v1):
    """Stride in the first 1x1 (v1) and conv biases folded into the BatchNorm means."""
    path = save_params(ref.to_gluoncv_features(gluon50_v1.sd), gluon50_v1.path(".params"))
    net, info = load("resnet50_v1", path, 6)
    assert_logits(logits(net), gluon50_v1.expected)
    assert info.source == "GluonCV resnet_v1" and info.model == "resnet50_v1"
    assert any("biases folded" in note for note in info.notes)


def test_gluoncv_resnext_params_give_reference_logits(resnext50):
    path = save_params(ref.to_gluoncv_features(resnext50.sd), resnext50.path(".params"))
    net, info = load("resnext50_32x4d", path, 5)
    assert_logits(logits(net), resnext50.expected)
    assert info.source == "GluonCV resnext"


@pytest.mark.parametrize("fixture, kit_name, prefix", [("tv18", "resnet18_v1", "resnetv10_"),
                                                       ("gluon50_v1", "resnet50_v1", "")])
def test_gluoncv_legacy_names_give_reference_logits(request, fixture, kit_name, prefix, tmp_path):
    """Files of the old save_params: auto-numbered names, with or without the network's prefix."""
    weights = request.getfixturevalue(fixture)
    path = save_params(ref.to_gluoncv_legacy(weights.sd, prefix), tmp_path / "legacy.params")
    net, info = load(kit_name, path, weights.num_classes)
    assert_logits(logits(net), weights.expected)
    assert info.source == "GluonCV resnet_v1" and info.params_loaded == info.params_total


def test_gluoncv_resnet18_v1_structural_names(tv18, tmp_path):
    path = save_params(ref.to_gluoncv_features(tv18.sd), tmp_path / "resnet18_v1.params")
    net, info = load("resnet18_v1", path, 7)
    assert_logits(logits(net), tv18.expected)


@pytest.mark.slow  # a heavier in-process test (the fast lane stays under a minute)
def test_kit_checkpoint_round_trip_and_stride_placement_from_symbol(tv50, tmp_path):
    """A kit export (of a 4-channel network here) loads into a 3-channel one; the -symbol.json beside it tells
    v1 from v1.5."""
    net, _ = load("resnet50_v1.5", tv50.path(".safetensors"), 7, in_channels=4)
    net.hybridize()
    net(mx.nd.zeros((1, 4, 32, 32)))
    _, params_file = models.export(net, str(tmp_path / "model"), epoch=3)
    again, info = load("resnet50_v1.5", params_file, 7)
    assert_logits(logits(again), tv50.expected)
    assert info.source == "kit" and info.model == "resnet50_v1.5"
    assert info.notes == ("stem cut from 4 to 3 input channels (the padding channel dropped)",)
    with pytest.raises(pretrained.PretrainedError, match=r"model-0003\.params holds a kit resnet50 \(v1\.5.*"
                       r"this run builds resnet50_v1: give --model resnet50_v1\.5$"):
        load("resnet50_v1", params_file, 7)
    os.remove(tmp_path / "model-symbol.json")
    _, info = load("resnet50_v1", params_file, 7)  # nothing tells the stride placement: loaded, and said so
    assert any("stride placement not recorded" in note for note in info.notes)


@pytest.mark.slow  # a heavier in-process test (the fast lane stays under a minute)
def test_kit_nhwc_parameters_load_into_nchw(tv18, tmp_path):
    """Parameters saved by name from an NHWC network ((O, kH, kW, I) convolutions) load into an NCHW one."""
    net, _ = load("resnet18_v1.5", tv18.path(".safetensors"), 7, layout="NHWC")
    net.collect_params().save(str(tmp_path / "nhwc.params"))
    again, info = load("resnet18_v1.5", tmp_path / "nhwc.params", 7)
    assert_logits(logits(again), tv18.expected)
    assert info.source == "kit"


# ---------------------------------------------------------------------------------------------------------
# refusals: one line saying what the file holds

def refusal(name, path, num_classes=7, **kwargs):
    with pytest.raises(pretrained.PretrainedError) as caught:
        load(name, path, num_classes, **kwargs)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_other_depth_is_refused_in_one_line(tv18):
    assert refusal("resnet50_v1.5", tv18.path(".safetensors")) == (
        "resnet18.safetensors holds a torchvision/timm resnet18 (7 classes); this run builds resnet50_v1.5: "
        "give --num-layers 18 (or --model resnet18_v1.5)")


def test_other_stride_placement_or_family_is_refused(tv50):
    path = tv50.path(".safetensors")
    assert refusal("resnet50_v1", path) == (
        "resnet50.safetensors holds a torchvision/timm resnet50 (v1.5: stride in the 3x3 convolutions, 7 classes); "
        "this run builds resnet50_v1: give --model resnet50_v1.5")
    assert refusal("resnext50_32x4d", path).endswith("this run builds resnext50_32x4d: give --model resnet50_v1.5")
    assert refusal("resnet101_v1.5", path).endswith("give --num-layers 50 (or --model resnet50_v1.5)")


@pytest.mark.slow  # a heavier in-process test (the fast lane stays under a minute)
def test_networks_the_kit_does_not_build_are_refused(tv18, tmp_path):
    # timm's resnet18d: a deep stem of three 3x3 convolutions (conv1.0 / conv1.3 / conv1.6)
    deep = {("conv1.0.weight" if k == "conv1.weight" else k): v for k, v in tv18.sd.items()}
    deep["conv1.3.weight"] = np.zeros((32, 32, 3, 3), np.float32)
    message = refusal("resnet18_v1.5", save_safetensors(deep, tmp_path / "resnet18d.safetensors"))
    assert message.startswith("resnet18d.safetensors holds a torchvision/timm deep-stem ResNet")
    se = dict(tv18.sd, **{"layer1.0.se.fc1.weight": np.zeros((4, 64, 1, 1), np.float32)})
    message = refusal("resnet18_v1.5", save_safetensors(se, tmp_path / "seresnet18.safetensors"))
    assert "squeeze-excitation" in message
    other = save_safetensors({"encoder.weight": np.zeros((3, 3), np.float32)}, tmp_path / "bert.safetensors")
    assert refusal("resnet18_v1.5", other).startswith("bert.safetensors holds no ResNet weights the kit knows")


def test_wide_resnet_is_named_and_refused():
    """torchvision's wide_resnet50_2: bottleneck width 128 for 256 outputs (the kit builds width 64)."""
    arch = pretrained.Architecture(kind="bottleneck", units=(3, 4, 6, 3), groups=1, width=128,
                                   out_channels=(64, 256, 512, 1024, 2048), version="1.5", num_classes=1000)
    assert arch.family_name() == "wide_resnet50_2" and arch.kit_name() is None
    net = kit_net("resnet50_v1.5", 10)
    message = str(pretrained._refusal("w.safetensors", arch, "torchvision/timm",
                                      pretrained.network_architecture(net), "resnet50_v1.5"))
    assert message == ("w.safetensors holds a torchvision/timm wide_resnet50_2 (v1.5: stride in the 3x3 "
                       "convolutions, 1000 classes); this run builds resnet50_v1.5: the kit builds no such network "
                       "(python models.py lists what it builds)")


def test_pth_without_pytorch_says_how_to_convert(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # as on a machine without PyTorch: `import torch` fails
    path = tmp_path / "resnet18.pth"
    path.write_bytes(b"not read")
    message = refusal("resnet18_v1.5", path)
    assert "PyTorch is not installed" in message and "safetensors" in message and "pip install torch" in message


def test_unknown_extension_and_missing_file(tmp_path):
    path = tmp_path / "weights.npz"
    path.write_bytes(b"")
    assert "unknown format" in refusal("resnet18_v1.5", path)
    assert "does not exist" in refusal("resnet18_v1.5", tmp_path / "missing.safetensors")


# ---------------------------------------------------------------------------------------------------------
# targets: a new head, NHWC, the 4-channel stem, float16

@pytest.mark.slow  # a heavier in-process test (the fast lane stays under a minute)
def test_new_head_when_classes_differ(tv18):
    net = kit_net("resnet18_v1.5", 4)
    head = {name: p.data().asnumpy().copy() for name, p in net.collect_params().items() if name.startswith("fc1_")}
    info = pretrained.load_pretrained(net, str(tv18.path(".safetensors")), [mx.cpu()], 4)
    assert info.head_reinitialized and (info.file_classes, info.num_classes) == (7, 4)
    assert info.params_loaded == info.params_total - 2
    assert "new 4-class classifier (the file has 7)" in info.summary()
    for name, value in head.items():  # the classifier keeps its fresh initialisation
        np.testing.assert_array_equal(net.collect_params()[name].data().asnumpy(), value)
    features = net.features(mx.nd.array(X)).asnumpy()
    expected = ref.features(tv18.sd, X)
    np.testing.assert_allclose(features, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize("channels", [3, 4])
def test_four_channel_stem_gives_the_same_logits(tv18, channels):
    net, info = load("resnet18_v1.5", tv18.path(".safetensors"), 7, in_channels=channels)
    x = np.concatenate([X, np.zeros_like(X[:, :1])], axis=1) if channels == 4 else X  # 4th channel: zero padding
    assert_logits(logits(net, x), tv18.expected)
    assert any("padded from 3 to 4" in note for note in info.notes) == (channels == 4)


@pytest.mark.slow  # a heavier in-process test (the fast lane stays under a minute)
@pytest.mark.parametrize("input_layout, channels", [("NCHW", 3), ("NHWC", 4)])
def test_nhwc_targets_hold_the_transposed_weights(tv18, input_layout, channels):
    """MXNet's CPU build runs no NHWC convolution, so the loaded values are checked against the layout NHWC
    networks compute in on GPU: convolutions (O, kH, kW, I), everything else as in the file."""
    net, _ = load("resnet18_v1.5", tv18.path(".safetensors"), 7, layout="NHWC", input_layout=input_layout,
                  in_channels=channels)
    params = net.collect_params()
    renamed = {"conv0_weight": "conv1.weight", "bn0_running_var": "bn1.running_var", "fc1_weight": "fc.weight",
               "stage2_unit1_conv1_weight": "layer2.0.conv1.weight", "stage2_unit1_bnsc_gamma":
               "layer2.0.downsample.1.weight", "stage3_unit1_conv1sc_weight": "layer3.0.downsample.0.weight"}
    for kit, tv in renamed.items():
        value = tv18.sd[tv]
        if value.ndim == 4:
            value = value.transpose(0, 2, 3, 1)
        if kit == "conv0_weight" and channels == 4:
            value = np.concatenate([value, np.zeros_like(value[..., :1])], axis=3)
        np.testing.assert_array_equal(params[kit].data().asnumpy(), value)


def test_every_device_gets_the_weights(tv18):
    """A network initialised on several devices gets the same values on each (Trainer needs them equal)."""
    ctxs = [mx.cpu(0), mx.cpu(1)]
    net = models.get_model("resnet18_v1.5", num_classes=7)
    net.initialize(ctx=ctxs)
    pretrained.load_pretrained(net, str(tv18.path(".safetensors")), ctxs, 7)
    for name in ("conv0_weight", "stage4_unit2_bn2_running_var", "fc1_bias"):
        copies = net.collect_params()[name].list_data()
        assert [c.context for c in copies] == ctxs
        for copy in copies:
            np.testing.assert_array_equal(copy.asnumpy(), net.collect_params()[name].data(ctxs[0]).asnumpy())
    assert_logits(net(mx.nd.array(X, ctx=ctxs[1])).asnumpy(), tv18.expected)


@pytest.mark.slow  # a heavier in-process test (the fast lane stays under a minute)
def test_grouped_convolutions_in_nhwc(resnext50, tmp_path):
    """MXNet's CPU build cannot run grouped NHWC convolutions, so the loaded values are checked instead."""
    path = save_safetensors(resnext50.sd, tmp_path / "rx.safetensors")
    net, _ = load("resnext50_32x4d", path, 5, layout="NHWC")
    params = net.collect_params()
    for kit, tv in (("stage1_unit1_conv2_weight", "layer1.0.conv2.weight"),
                    ("stage3_unit1_conv1sc_weight", "layer3.0.downsample.0.weight"), ("conv0_weight", "conv1.weight")):
        np.testing.assert_array_equal(params[kit].data().asnumpy(), resnext50.sd[tv].transpose(0, 2, 3, 1))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_reduced_precision_targets_load(tv18, dtype):
    """float16 networks get float16 weights (BatchNorm float32); bfloat16 networks keep float32 for MXNet's AMP."""
    net, info = load("resnet18_v1.5", tv18.path(".safetensors"), 7, dtype=dtype)
    params = net.collect_params()
    weight_dtype = np.float16 if dtype == "float16" else np.float32
    assert params["stage2_unit1_conv1_weight"].data().dtype == weight_dtype
    assert params["stage2_unit1_bn1_running_var"].data().dtype == np.float32
    np.testing.assert_array_equal(params["stage2_unit1_conv1_weight"].data().asnumpy(),
                                  tv18.sd["layer2.0.conv1.weight"].astype(weight_dtype))
    np.testing.assert_array_equal(params["fc1_weight"].data().asnumpy(), tv18.sd["fc.weight"].astype(weight_dtype))
    assert any("cast to float16" in note for note in info.notes) == (dtype == "float16")


# ---------------------------------------------------------------------------------------------------------
# fine-tuning options

def test_pretrained_flags():
    parser = argparse.ArgumentParser()
    pretrained.add_pretrained_args(parser)
    args = parser.parse_args([])
    assert (args.pretrained, args.backbone_lr_mult, args.freeze_backbone_epochs) == (None, 1.0, 0)
    args = parser.parse_args(["--backbone-lr-mult", "0.1", "--freeze-backbone-epochs", "2"])
    assert [pretrained.backbone_lr_mult(e, args.backbone_lr_mult, args.freeze_backbone_epochs)
            for e in range(4)] == [0.0, 0.0, 0.1, 0.1]
    with pytest.raises(ValueError, match="--backbone-lr-mult"):
        pretrained.check_pretrained_args(parser.parse_args(["--backbone-lr-mult", "-1"]))
    with pytest.raises(ValueError, match="--pretrained nowhere.safetensors does not exist"):
        pretrained.check_pretrained_args(parser.parse_args(["--pretrained", "nowhere.safetensors"]))


def test_backbone_lr_mult_freezes_then_releases_the_backbone(tv18):
    """lr_mult 0 leaves every backbone weight exactly as loaded (SGD with momentum and weight decay, as the kit
    trains) while the head learns; set back, the backbone learns too."""
    net, _ = load("resnet18_v1.5", tv18.path(".safetensors"), 7)
    params = net.collect_params()
    trainer = gluon.Trainer(params, "sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    trained = [name for name, p in params.items() if p.grad_req != "null"]

    def step():
        before = {name: params[name].data().asnumpy().copy() for name in trained}
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(X)), mx.nd.array([1, 3]))
        loss.backward()
        trainer.step(2)
        return {name for name in trained if not np.array_equal(params[name].data().asnumpy(), before[name])}

    assert pretrained.set_backbone_lr_mult(net, 0.0) == len(list(params.keys())) - 2
    for _ in range(2):
        assert step() == {"fc1_weight", "fc1_bias"}
    pretrained.set_backbone_lr_mult(net, 0.5)
    changed = step()
    assert {"fc1_weight", "conv0_weight", "stage4_unit2_conv2_weight"} <= changed
