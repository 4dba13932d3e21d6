"""pretrained: the 50-layer sources (torchvision's ResNeXt-50 safetensors, GluonCV's resnetv1b, resnet_v1 with its
1x1 biases, resnext) and the legacy auto-numbered names (18 and 50 layers) give the kit's network the logits of the
independent reference forward pass (support/resnet_reference.py); the other 18-layer cases and the refusals are
unit/test_pretrained.py's. Here for their time: each builds and loads a 25 M-parameter network."""
import mxnet as mx
import pytest

from support import resnet_reference as ref
from support.weights import Weights, assert_logits, load, logits, save_safetensors

pytestmark = pytest.mark.slow


def save_params(weights, path):
    mx.nd.save(str(path), {k: mx.nd.array(v) for k, v in weights.items()})
    return path


@pytest.fixture(scope="module")
def gluon50_v1(tmp_path_factory):
    """GluonCV resnet50_v1: stride on the first 1x1, biases on the 1x1 convolutions of the residual branch."""
    return Weights(tmp_path_factory.mktemp("g50"), "resnet50_v1", 50, 6, seed=2, conv_bias_1x1=True)


def test_torchvision_resnext_safetensors_give_reference_logits(resnext50):
    path = save_safetensors(resnext50.sd, resnext50.path(".safetensors"))
    net, info = load("resnext50_32x4d", path, 5)
    assert_logits(logits(net), resnext50.expected)
    assert info.model == "resnext50_32x4d" and info.params_loaded == info.params_total


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
