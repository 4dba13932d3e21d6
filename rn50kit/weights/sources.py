"""Which ecosystem a weights file comes from (the kit, torchvision/timm, GluonCV's three families), told by its key
names, and where its bottlenecks stride when the file or the checkpoint beside it says so."""
import json
import os
import re

from rn50kit.weights.errors import PretrainedError
from rn50kit.weights.key_maps import (
    GLUON_BN,
    TORCH_BN,
    check_unknown,
    fold_conv_biases,
    from_gluon_features,
    from_gluon_legacy,
    from_torch_style,
    is_head,
    strip_wrapper_prefix,
    unsupported,
)
from rn50kit.weights.safetensors_file import recorded_version


def _kit_version(path):
    """The stride placement of a kit checkpoint's bottlenecks, from the ``<prefix>-symbol.json`` beside its
    params file (the stride of stage 2's first 1x1 convolution); None without one or for basic blocks."""
    match = re.fullmatch(r"(.*)-(\d{4}(-step\d{6})?(-ema)?|best)\.params", path)
    symbol = f"{match[1]}-symbol.json" if match else None
    if not symbol or not os.path.isfile(symbol):
        return None
    try:
        with open(symbol) as f:
            nodes = json.load(f)["nodes"]
    except (OSError, ValueError, KeyError):
        return None
    convs = {node.get("name", ""): node for node in nodes if node.get("op") == "Convolution"}
    if not any(name.startswith("stage2_unit1_conv3") for name in convs):
        return None
    for name, node in convs.items():
        if name.startswith("stage2_unit1_conv1") and not name.startswith("stage2_unit1_conv1sc"):
            stride = node.get("attrs", {}).get("stride", "(1, 1)")
            return "1" if "2" in stride else "1.5"
    return None


def identify(weights, path):
    """(source, name -> array in the kit's names with (O, I, kH, kW) convs, version, notes) of a file's tensors."""
    weights = strip_wrapper_prefix(weights)
    keys = set(weights)
    notes = []
    if "conv0_weight" in keys and "fc1_weight" in keys and "bn0_gamma" in keys:
        source, version = "kit", _kit_version(path)
        canon = dict(weights)
        stem = canon["conv0_weight"]
        if stem.ndim == 4 and stem.shape[1] == stem.shape[2] == 7 and stem.shape[3] != 7:  # NHWC file
            canon = {k: v.transpose(0, 3, 1, 2) if v.ndim == 4 else v for k, v in canon.items()}
        unknown = [k for k in canon if not re.fullmatch(r"(conv0|bn0|fc1|stage\d_unit\d+_(conv\d|bn\d|conv1sc|bnsc))"
                                                         r"_\w+", k)]
        check_unknown(path, source, unknown)
    elif any(k.startswith(("layer1.", "layers1.")) for k in keys) or "conv1.0.weight" in keys:
        gluon = any(k.endswith((".gamma", ".beta")) for k in keys)
        source = "GluonCV resnetv1b" if gluon else "torchvision/timm"
        canon = from_torch_style(weights, path, source, GLUON_BN if gluon else TORCH_BN)
        version = recorded_version(path) or "1.5"  # a kit v1 network exported (export.py) says so
    elif "features.0.weight" in keys or any(k.startswith("features.") for k in keys):
        if any(re.fullmatch(r"features\.\d+\.\d+\.bn1\.\w+", k) for k in keys) or \
                any(re.fullmatch(r"features\.0\.(gamma|beta|running_mean)", k) for k in keys):
            raise unsupported(path, "a GluonCV resnet_v2 (pre-activation: BatchNorm before each convolution)")
        canon = from_gluon_features(weights, path, "GluonCV")
        conv2 = canon.get("stage1_unit1_conv2_weight")
        grouped = conv2 is not None and conv2.shape[0] != conv2.shape[1]
        has_bias = any(k.endswith("_bias") and not is_head(k) for k in canon)
        bottleneck = "stage1_unit1_conv3_weight" in canon
        # resnet_v1's bottleneck: stride and bias on the first 1x1; resnext: stride in the 3x3, no biases
        source = "GluonCV resnext" if grouped or (bottleneck and not has_bias) else "GluonCV resnet_v1"
        version = ("1.5" if source == "GluonCV resnext" else "1") if bottleneck else None
    elif any(k.startswith("resnet.embedder") or k.startswith("embedder.") for k in keys):
        raise unsupported(path, "a Hugging Face transformers ResNet (resnet.embedder.*, not the timm/torchvision "
                                "naming); use the timm or torchvision weights of the same model")
    elif any(re.match(r"^([a-z]+\d+_)?(stage\d_)?(conv|batchnorm|dense)\d+_", k) for k in keys):
        canon = from_gluon_legacy(weights, path)
        conv2 = canon.get("stage1_unit1_conv2_weight")
        grouped = conv2 is not None and conv2.shape[0] != conv2.shape[1]
        bottleneck = "stage1_unit1_conv3_weight" in canon
        source = "GluonCV resnext" if grouped else "GluonCV resnet_v1"
        version = ("1.5" if grouped else "1") if bottleneck else None
    else:
        sample = ", ".join(sorted(keys)[:3])
        raise PretrainedError(f"{os.path.basename(path)} holds no ResNet weights the kit knows (keys {sample}, ...): "
                              "give torchvision/timm, GluonCV or kit ResNet weights")
    folded = fold_conv_biases(canon)
    if folded:
        notes.append(f"{folded} convolution biases folded into the BatchNorm means")
    return source, canon, version, notes
