"""The kit's ResNet weights out to PyTorch: a checkpoint's parameters under torchvision's ResNet state-dict names,
as a ``.safetensors`` file (tools/export_weights.py). The inverse of pretrained.py's torchvision import.

timm's ResNet and ResNeXt (``resnet50``, ``resnext50_32x4d``, ...) use torchvision's names (conv1, bn1,
layer1.0.conv1, layer1.0.downsample.0/1, fc), so the one file loads in both. torchvision's and timm's bottlenecks
stride in the 3x3 convolution (v1.5); a v1 network (stride in the first 1x1) keeps the same names and its file says
so in its metadata (``resnet_version``): PyTorch must move the stride (``stride_fix_for_torch`` prints how), and
``--pretrained`` reads it back as v1. Every BatchNorm gets the ``num_batches_tracked`` buffer PyTorch's strict
loading expects (0: unused with the default momentum).
"""
import re

import numpy as np

from rn50kit.weights import checkpoint
from rn50kit.weights.architecture import from_shapes
from rn50kit.weights.readers import read_weights
from rn50kit.weights.sources import identify

_BN_FIELDS = {"gamma": "weight", "beta": "bias", "running_mean": "running_mean", "running_var": "running_var"}


class ExportError(ValueError):
    """Weights that cannot be exported: one line for the user."""


def torchvision_name(kit_name):
    """The torchvision state-dict key of a kit parameter name (``stage2_unit1_conv1sc_weight`` ->
    ``layer2.0.downsample.0.weight``); None for a name no torchvision ResNet has."""
    rules = [
        (r"conv0_weight", lambda m: "conv1.weight"),
        (r"bn0_(\w+)", lambda m: f"bn1.{_BN_FIELDS[m[1]]}"),
        (r"stage(\d)_unit(\d+)_conv(\d)_weight", lambda m: f"layer{m[1]}.{int(m[2]) - 1}.conv{m[3]}.weight"),
        (r"stage(\d)_unit(\d+)_bn(\d)_(\w+)", lambda m: f"layer{m[1]}.{int(m[2]) - 1}.bn{m[3]}.{_BN_FIELDS[m[4]]}"),
        (r"stage(\d)_unit(\d+)_conv1sc_weight", lambda m: f"layer{m[1]}.{int(m[2]) - 1}.downsample.0.weight"),
        (r"stage(\d)_unit(\d+)_bnsc_(\w+)", lambda m: f"layer{m[1]}.{int(m[2]) - 1}.downsample.1.{_BN_FIELDS[m[3]]}"),
        (r"fc1_(weight|bias)", lambda m: f"fc.{m[1]}"),
    ]
    for pattern, name in rules:
        match = re.fullmatch(pattern, kit_name)
        if match:
            try:
                return name(match)
            except KeyError:  # a BatchNorm field torchvision has not
                return None
    return None


def to_torchvision(canon):
    """The state dict (torchvision's names, float32 arrays, convs (O, I, kH, kW)) of kit-named weights as
    sources.identify gives them, with every BatchNorm's num_batches_tracked."""
    out, unknown = {}, []
    for key, value in canon.items():
        name = torchvision_name(key)
        if name is None:
            unknown.append(key)
            continue
        out[name] = np.ascontiguousarray(value, dtype=np.float32)
        if name.endswith(".running_mean"):
            out[name[:-len("running_mean")] + "num_batches_tracked"] = np.array(0, np.int64)
    if unknown:
        raise ExportError(f"parameters no torchvision ResNet has: {', '.join(sorted(unknown)[:3])}")
    return out


def stride_fix_for_torch(architecture):
    """For a v1 bottleneck network: the PyTorch lines that move torchvision's stride to the first 1x1 convolution
    (else None)."""
    if architecture.kind != "bottleneck" or architecture.version != "1":
        return None
    return ("for layer in (model.layer2, model.layer3, model.layer4): "
            "layer[0].conv1.stride, layer[0].conv2.stride = (2, 2), (1, 1)")


def export(params_path, out_path, version=None):
    """Write ``params_path`` (a kit checkpoint, or any file --pretrained reads) to ``out_path`` in torchvision's
    names; ``version`` ("1" or "1.5") when the file does not record its stride placement. Returns the
    architecture.Architecture written."""
    from safetensors.numpy import save_file
    weights, _ = read_weights(params_path)
    source, canon, found_version, _ = identify(weights, params_path)
    version = found_version or version or trained_version(params_path)
    shapes = {key: value.shape for key, value in canon.items()}
    architecture = from_shapes(shapes, version)
    if architecture is None or architecture.kit_name() is None:
        raise ExportError(f"{params_path} holds no ResNet the kit builds")
    if architecture.kind == "bottleneck" and architecture.version is None:
        raise ExportError(f"{params_path} does not record where its bottlenecks stride (no -symbol.json or "
                          ".state.json beside it): give --version 1.5 (stride in the 3x3, torchvision's) or 1")
    metadata = {"format": "pt", "source": f"rn50kit export of {source} weights",
                "kit_model": architecture.kit_name(), "resnet_version": architecture.version or "1.5"}
    save_file(to_torchvision(canon), out_path, metadata=metadata)
    return architecture


def trained_version(params_path):
    """The stride placement of a checkpoint's model as its saved state names it (``resnet50_v1`` -> "1"), or
    None."""
    import models
    try:
        state = checkpoint.trained_settings(params_path) or {}
    except (OSError, ValueError):
        return None
    name = (state.get("args") or {}).get("model") or state.get("model")
    try:
        return models.parse_name(name)["version"] if name else None
    except ValueError:
        return None
