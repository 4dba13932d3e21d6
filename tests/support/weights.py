"""Published weights against the reference forward pass (unit/test_pretrained, e2e/test_published_weights,
interop_pretrained.py), and kit checkpoints exported to torchvision's names (unit/test_export_weights,
e2e/test_weights_to_pytorch). The reference is resnet_reference, a numpy ResNet that does not import the kit."""
import contextlib
import io

import mxnet as mx
import numpy as np
import pytest
import safetensors.numpy as safetensors_numpy

import models
from rn50kit.weights import pretrained

from . import resnet_reference as ref

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


class Weights:
    """One random state dict in torchvision's names, its reference logits and its files (conftest's session
    fixtures tv18, tv50 and resnext50 make them once for every file)."""

    def __init__(self, folder, name, depth, num_classes, seed, **kwargs):
        self.sd = ref.torchvision_state_dict(depth, num_classes, seed=seed, **kwargs)
        self.stride_in_1x1 = kwargs.get("conv_bias_1x1", False)  # GluonCV's resnet_v1
        self.expected = ref.forward(self.sd, X, stride_in_1x1=self.stride_in_1x1)
        self.folder, self.name, self.num_classes = folder, name, num_classes

    def path(self, suffix):
        return self.folder / f"{self.name}{suffix}"


def refusal(name, path, num_classes=7, **kwargs):
    """pretrained.load_pretrained's one-line refusal of the file at ``path`` for network ``name``."""
    with pytest.raises(pretrained.PretrainedError) as caught:
        load(name, path, num_classes, **kwargs)
    message = str(caught.value)
    assert "\n" not in message
    return message


# --- kit checkpoints exported to torchvision's names ---------------------------------------------------------------

EXPORT_CLASSES = 7


def trained_like(name, seed=0):
    """A kit network whose every parameter (BatchNorm statistics too) is random, as after training."""
    net = kit_net(name, EXPORT_CLASSES)
    net(mx.nd.array(X))
    rng = np.random.RandomState(seed)
    for key, param in net.collect_params().items():
        shape = param.shape
        if key.endswith(("running_var", "gamma")):
            value = rng.uniform(0.5, 1.5, shape)
        elif len(shape) == 4:
            value = rng.normal(0, np.sqrt(2.0 / np.prod(shape[1:])), shape)
        else:
            value = rng.normal(0, 0.1, shape)
        param.set_data(mx.nd.array(value.astype(np.float32)))
    return net


def exported_checkpoint(net, folder):
    """The files of a checkpoint, as checkpoint.py writes them with net.export: <prefix>-symbol.json and
    <prefix>-0001.params; returns the .params path."""
    net.hybridize()
    net(mx.nd.array(X))
    net.export(str(folder / "model"), epoch=1)
    return folder / "model-0001.params"


def parameter_arrays(net):
    return {key: param.data().asnumpy() for key, param in net.collect_params().items()}


def export_and_check_round_trip(name, other, folder):
    """Export a random ``name`` checkpoint, import the file back into a new ``name`` network: every array equal
    bit for bit; ``other`` (the same network with the other stride placement, or None) refuses it."""
    import export_weights
    net = trained_like(name, seed=1)
    out = folder / "out.safetensors"
    export_weights.main([str(exported_checkpoint(net, folder)), str(out)])
    back, info = load(name, out, EXPORT_CLASSES)
    assert info.source == "torchvision/timm" and not info.head_reinitialized
    original, loaded = parameter_arrays(net), parameter_arrays(back)
    assert set(loaded) == set(original)
    for key, value in loaded.items():
        assert np.array_equal(value, original[key]), key
    if other:  # the file says where its network strides: the other placement is refused
        with pytest.raises(pretrained.PretrainedError, match=f"give --model {name}"):
            load(other, out, EXPORT_CLASSES)


def export_and_check_logits(name, folder):
    """Export a random ``name`` checkpoint: the file through the reference ResNet (the v1 stride moved, as the
    tool prints) gives the kit's logits."""
    import export_weights
    net = trained_like(name)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        export_weights.main([str(exported_checkpoint(net, folder)), str(folder / "out.safetensors")])
    state = safetensors_numpy.load_file(str(folder / "out.safetensors"))
    v1 = name.endswith("_v1")
    assert ("move the stride" in printed.getvalue()) == v1
    assert all(state[key].dtype == np.int64 for key in state if key.endswith("num_batches_tracked"))
    assert_logits(logits(net), ref.forward(state, X, stride_in_1x1=v1))
