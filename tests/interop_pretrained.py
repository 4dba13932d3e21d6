"""pretrained.py against the libraries that publish the weights, where they are installed (none is a dependency
of the kit, and this machine kind has no CPU build of torchvision): PyTorch's own .pth files, GluonCV's own model
definitions and torchvision's own forward pass. Not collected by the test suite (the file name does not start
with test_); run it where those libraries are:

    .venv/bin/pip install torch gluoncv   # or a separate environment with the kit on PYTHONPATH
    .venv/bin/python -m pytest tests/interop_pretrained.py

The suite checks the same loaders against tests/resnet_reference.py, an independent numpy forward pass on
torchvision's names, and GluonCV's names written by hand (tests/unit/test_pretrained.py). Last run: every test here
passed with torch 2.13.0 and the GluonCV 0.10.5 model files (see docs/own-images.md).
"""
import mxnet as mx
import numpy as np
import pytest

from support import resnet_reference as ref
from support.weights import X, assert_logits, load, logits, refusal  # tv18, a fixture, comes from conftest by name


def test_pth_with_pytorch_gives_reference_logits(tv18, tmp_path):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed: .pth files need it")
    path = tmp_path / "resnet18.pth"
    torch.save({"state_dict": {k: torch.from_numpy(np.array(v)) for k, v in tv18.sd.items()}}, path)
    net, info = load("resnet18_v1.5", path, 7)
    assert_logits(logits(net), tv18.expected)
    assert info.file_format == "pth"


# ---------------------------------------------------------------------------------------------------------
# GluonCV's own model definitions, where gluoncv is importable (it is not a dependency of the kit)

GLUONCV_LOADABLE = [("resnet18_v1", "resnet18_v1"), ("resnet50_v1", "resnet50_v1"), ("resnet50_v1b", "resnet50_v1.5"),
                    ("resnext50_32x4d", "resnext50_32x4d")]


def gluoncv_net(name, classes):
    model_zoo = pytest.importorskip("gluoncv.model_zoo", reason="gluoncv is not installed: GluonCV's own model "
                                    "definitions are checked only where it is")
    net = getattr(model_zoo, name)(classes=classes)
    net.initialize(mx.init.Xavier(magnitude=2))
    net(mx.nd.array(X))  # shapes
    rng = np.random.RandomState(4)
    for pname, param in net.collect_params().items():  # non-trivial BatchNorm statistics, biases, gammas
        shape = param.shape
        if pname.endswith("running_var") or pname.endswith("gamma"):
            param.set_data(mx.nd.array(rng.uniform(0.5, 1.5, shape)))
        elif pname.endswith(("running_mean", "beta", "bias")):
            param.set_data(mx.nd.array(rng.normal(0, 0.1, shape)))
    return net


@pytest.mark.parametrize("gluon_name, kit_name", GLUONCV_LOADABLE)
@pytest.mark.parametrize("naming", ["save_parameters", "legacy save_params"])
def test_gluoncv_models_give_their_own_logits(gluon_name, kit_name, naming, tmp_path):
    net = gluoncv_net(gluon_name, 6)
    expected = net(mx.nd.array(X)).asnumpy()
    path = str(tmp_path / f"{gluon_name}.params")
    if naming == "save_parameters":
        net.save_parameters(path)
    elif gluon_name.endswith("v1b"):
        pytest.skip("resnetv1b postdates save_params: its files have save_parameters names")
    else:
        net.collect_params().save(path, strip_prefix=net.prefix)  # what the old save_params wrote
    kit, info = load(kit_name, path, 6)
    assert_logits(logits(kit), expected)
    assert info.params_loaded == info.params_total


@pytest.mark.parametrize("gluon_name, what", [("resnet50_v1d", "deep-stem"), ("resnet18_v2", "resnet_v2"),
                                              ("se_resnet18_v1", "squeeze-excitation")])
def test_gluoncv_models_the_kit_does_not_build_are_refused(gluon_name, what, tmp_path):
    net = gluoncv_net(gluon_name, 6)
    net.save_parameters(str(tmp_path / f"{gluon_name}.params"))
    message = refusal("resnet50_v1.5" if "50" in gluon_name else "resnet18_v1", tmp_path / f"{gluon_name}.params", 6)
    assert what in message


@pytest.mark.parametrize("name, depth, groups, width_per_group", [("resnet18", 18, 1, 64),
                                                                  ("resnext50_32x4d", 50, 32, 4)])
def test_reference_and_kit_match_torchvision_itself(name, depth, groups, width_per_group, tmp_path):
    """Where PyTorch and torchvision are importable: the reference's key names and shapes are torchvision's, and
    torchvision's own forward gives the reference's logits and the kit's after loading its saved state dict."""
    try:
        import torch
        import torchvision
    except Exception as error:  # noqa: BLE001 - a torchvision built for another torch raises RuntimeError
        pytest.skip(f"PyTorch/torchvision not usable here ({type(error).__name__}): the reference is checked "
                    "against torchvision only where it is")
    model = getattr(torchvision.models, name)(num_classes=7).eval()
    sd = ref.torchvision_state_dict(depth, 7, groups=groups, width_per_group=width_per_group)
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == {k: v.shape for k, v in sd.items()}
    model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in sd.items()})
    with torch.no_grad():
        expected = model(torch.from_numpy(X)).double().numpy()
    assert_logits(ref.forward(sd, X), expected)
    torch.save(model.state_dict(), tmp_path / f"{name}.pth")
    net, _ = load("resnet18_v1.5" if depth == 18 else name, tmp_path / f"{name}.pth", 7)
    assert_logits(logits(net), expected)
