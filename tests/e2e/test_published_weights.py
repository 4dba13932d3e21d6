"""Published weights of full-size networks in process (the heavier cases): torchvision's ResNet-50, kit
checkpoints, NHWC targets, grouped convolutions, a new head."""
import os

import mxnet as mx
import numpy as np
import pytest

import models
from rn50kit.weights import pretrained
from support import resnet_reference as ref
from support.weights import X, assert_logits, kit_net, load, logits, refusal, save_safetensors

pytestmark = pytest.mark.slow  # launches processes, trains end to end or builds heavy data


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


@pytest.mark.slow  # a heavier in-process test (the fast lane stays under a minute)
def test_grouped_convolutions_in_nhwc(resnext50, tmp_path):
    """MXNet's CPU build cannot run grouped NHWC convolutions, so the loaded values are checked instead."""
    path = save_safetensors(resnext50.sd, tmp_path / "rx.safetensors")
    net, _ = load("resnext50_32x4d", path, 5, layout="NHWC")
    params = net.collect_params()
    for kit, tv in (("stage1_unit1_conv2_weight", "layer1.0.conv2.weight"),
                    ("stage3_unit1_conv1sc_weight", "layer3.0.downsample.0.weight"), ("conv0_weight", "conv1.weight")):
        np.testing.assert_array_equal(params[kit].data().asnumpy(), resnext50.sd[tv].transpose(0, 2, 3, 1))


def test_other_stride_placement_or_family_is_refused(tv50):
    path = tv50.path(".safetensors")
    assert refusal("resnet50_v1", path) == (
        "resnet50.safetensors holds a torchvision/timm resnet50 (v1.5: stride in the 3x3 convolutions, 7 classes); "
        "this run builds resnet50_v1: give --model resnet50_v1.5")
    assert refusal("resnext50_32x4d", path).endswith("this run builds resnext50_32x4d: give --model resnet50_v1.5")
    assert refusal("resnet101_v1.5", path).endswith("give --num-layers 50 (or --model resnet50_v1.5)")
