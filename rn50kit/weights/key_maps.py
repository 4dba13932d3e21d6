"""Every source's parameter names to the kit's (``conv0_weight``, ``stage2_unit1_conv1sc_weight``, ``fc1_weight``;
conv weights (O, I, kH, kW)): torchvision/timm and GluonCV resnetv1b, GluonCV resnet_v1/resnext in structural and
in the old auto-numbered names; keys no kit network has are refused with what they suggest the network is."""
import os
import re

from rn50kit.weights.errors import PretrainedError

HEAD_PREFIX = "fc1_"  # the classifier's parameters: fc1_weight, fc1_bias
BN_FIELDS = ("gamma", "beta", "running_mean", "running_var")


def is_head(name):
    """A parameter of the classifier (kept fresh when the file's classes differ from the network's)."""
    return name.startswith(HEAD_PREFIX)


def strip_wrapper_prefix(weights):
    """Drop a prefix that every key shares from training wrappers (DistributedDataParallel's ``module.``,
    ``model.``)."""
    for prefix in ("module.", "model.", "_orig_mod."):
        if weights and all(key.startswith(prefix) for key in weights):
            weights = {key[len(prefix):]: value for key, value in weights.items()}
    return weights


def unsupported(path, what):
    return PretrainedError(f"{os.path.basename(path)} holds {what}, which the kit does not build (its ResNets have "
                           "a 7x7 stem and 1x1-convolution shortcuts; python models.py lists them): use plain "
                           "ResNet/ResNeXt weights")


def check_unknown(path, source, unknown):
    """Refuse keys no kit parameter takes, saying what they suggest the network is."""
    if not unknown:
        return
    text = " ".join(unknown)
    if re.search(r"(^|\.)conv1\.\d+\.|features\.\d+\.\d+\.(gamma|running)|deep|stem\.", text):
        what = f"a {source} deep-stem ResNet (ResNet-C/D/S: three 3x3 stem convolutions, e.g. {unknown[0]})"
    elif re.search(r"downsample\.2\.", text):
        what = f"a {source} ResNet with average-pool shortcuts (ResNet-D, e.g. {unknown[0]})"
    elif re.search(r"(^|\.)se(_module)?\.|\.se\.|fc1\.weight|attn", text):
        what = f"a {source} ResNet with attention/squeeze-excitation modules (e.g. {unknown[0]})"
    else:
        what = f"keys no ResNet of the kit has ({', '.join(unknown[:3])}{', ...' if len(unknown) > 3 else ''})"
    raise unsupported(path, what)


TORCH_BN = {"weight": "gamma", "bias": "beta", "running_mean": "running_mean", "running_var": "running_var"}
GLUON_BN = {name: name for name in BN_FIELDS}


def from_torch_style(weights, path, source, bn_names):
    """torchvision/timm (bn weight/bias) and GluonCV resnetv1b (bn gamma/beta) names."""
    out, unknown = {}, []
    field = "|".join(bn_names)
    patterns = [
        (re.compile(r"conv1\.weight"), lambda m: "conv0_weight"),
        (re.compile(rf"bn1\.({field})"), lambda m: f"bn0_{bn_names[m[1]]}"),
        (re.compile(r"layers?(\d)\.(\d+)\.conv(\d)\.weight"),
         lambda m: f"stage{m[1]}_unit{int(m[2]) + 1}_conv{m[3]}_weight"),
        (re.compile(rf"layers?(\d)\.(\d+)\.bn(\d)\.({field})"),
         lambda m: f"stage{m[1]}_unit{int(m[2]) + 1}_bn{m[3]}_{bn_names[m[4]]}"),
        (re.compile(r"layers?(\d)\.(\d+)\.downsample\.0\.weight"),
         lambda m: f"stage{m[1]}_unit{int(m[2]) + 1}_conv1sc_weight"),
        (re.compile(rf"layers?(\d)\.(\d+)\.downsample\.1\.({field})"),
         lambda m: f"stage{m[1]}_unit{int(m[2]) + 1}_bnsc_{bn_names[m[3]]}"),
        (re.compile(r"fc\.(weight|bias)"), lambda m: f"fc1_{m[1]}"),
    ]
    for key, value in weights.items():
        if key.endswith("num_batches_tracked"):
            continue
        for pattern, name in patterns:
            match = pattern.fullmatch(key)
            if match:
                out[name(match)] = value
                break
        else:
            unknown.append(key)
    check_unknown(path, source, unknown)
    return out


# GluonCV resnet_v1 / resnext: features.<4+stage>.<unit>.body.<index>; the body's layers by index
_GLUON_BODY = {"basic": {0: "conv1", 1: "bn1", 3: "conv2", 4: "bn2"},
               "bottleneck": {0: "conv1", 1: "bn1", 3: "conv2", 4: "bn2", 6: "conv3", 7: "bn3"}}


def from_gluon_features(weights, path, source):
    """GluonCV resnet_v1 and resnext in save_parameters' structural names. Conv biases (resnet_v1's bottleneck
    1x1 convolutions) are returned under ``<conv>_bias`` for folding."""
    kind = "bottleneck" if any(re.fullmatch(r"features\.\d+\.\d+\.body\.6\.weight", k) for k in weights) \
        else "basic"
    body = _GLUON_BODY[kind]
    out, unknown = {}, []
    if "features.0.weight" in weights and weights["features.0.weight"].shape[-1] != 7:
        if "features.3.weight" in weights:
            raise unsupported(path, f"a {source} deep-stem ResNet/ResNeXt (three 3x3 stem convolutions)")
        raise unsupported(path, f"a {source} CIFAR-style ResNet (a 3x3 stem without max pooling)")
    for key, value in weights.items():
        match = re.fullmatch(r"features\.(\d+)\.(\d+)\.(body|downsample)\.(\d+)\.(\w+)", key)
        if match and int(match[1]) >= 4:
            stage, unit, part, index, field = int(match[1]) - 3, int(match[2]) + 1, match[3], int(match[4]), match[5]
            prefix = f"stage{stage}_unit{unit}_"
            layer = body.get(index) if part == "body" else {0: "conv1sc", 1: "bnsc"}.get(index)
            if layer and layer.startswith("conv") and field in ("weight", "bias"):
                out[f"{prefix}{layer}_{field}"] = value
                continue
            if layer and layer.startswith("bn") and field in BN_FIELDS:
                out[f"{prefix}{layer}_{field}"] = value
                continue
        elif key == "features.0.weight":
            out["conv0_weight"] = value
            continue
        elif re.fullmatch(r"features\.1\.(\w+)", key) and key.split(".")[-1] in BN_FIELDS:
            out[f"bn0_{key.split('.')[-1]}"] = value
            continue
        elif key in ("output.weight", "output.bias"):
            out[f"fc1_{key.split('.')[-1]}"] = value
            continue
        unknown.append(key)
    check_unknown(path, source, unknown)
    return out


def from_gluon_legacy(weights, path):
    """GluonCV / Gluon model zoo resnet_v1 and resnext saved with the old ``save_params``: auto-numbered names
    (``conv0_weight``, ``batchnorm0_gamma``, ``stage1_conv3_weight``, ``dense0_weight``), possibly behind the
    network's prefix (``resnetv10_``). Within each stage the layers are numbered in creation order: per unit
    conv, bn, conv, bn[, conv, bn], then the first unit's shortcut conv, bn."""
    prefixes = {(re.match(r"^[a-z]+\d+_", key) or [""])[0] for key in weights}
    prefix = prefixes.pop() if len(prefixes) == 1 else ""
    if prefix and not re.fullmatch(r"(stage|conv|batchnorm|dense)\d+_", prefix):
        weights = {key[len(prefix):]: value for key, value in weights.items()}
    out, unknown = {}, []
    stages = {}
    for key, value in weights.items():
        match = re.fullmatch(r"(?:stage(\d)_)?(conv|batchnorm|dense)(\d+)_(\w+)", key)
        if not match:
            unknown.append(key)
            continue
        stage, layer, number, field = match[1], match[2], int(match[3]), match[4]
        if stage is None:
            if (layer, number) == ("conv", 0) and field == "weight":
                out["conv0_weight"] = value
            elif (layer, number) == ("batchnorm", 0) and field in BN_FIELDS:
                out[f"bn0_{field}"] = value
            elif layer == "dense" and number == 0 and field in ("weight", "bias"):
                out[f"fc1_{field}"] = value
            else:
                unknown.append(key)
            continue
        stages.setdefault(int(stage), {}).setdefault((layer, number), {})[field] = value
    check_unknown(path, "GluonCV", unknown)
    for stage, layers in sorted(stages.items()):
        convs = [layers[("conv", n)] for n in range(len([k for k in layers if k[0] == "conv"]))
                 if ("conv", n) in layers]
        bns = [layers[("batchnorm", n)] for n in range(len([k for k in layers if k[0] == "batchnorm"]))
               if ("batchnorm", n) in layers]
        if len(convs) != len(bns) or not convs:
            raise PretrainedError(f"{os.path.basename(path)}: stage {stage} has {len(convs)} convolutions and "
                                  f"{len(bns)} BatchNorms; not a GluonCV ResNet the kit knows")
        # bottleneck units start with a 1x1 convolution, basic ones with a 3x3
        per_unit = 3 if convs[0]["weight"].shape[-1] == 1 else 2
        shortcut = len(convs) % per_unit == 1  # the first unit's projection shortcut
        units = (len(convs) - shortcut) // per_unit
        if units * per_unit + shortcut != len(convs):
            raise PretrainedError(f"{os.path.basename(path)}: stage {stage} has {len(convs)} convolutions; not a "
                                  "GluonCV ResNet the kit knows")
        sequence = []
        for unit in range(1, units + 1):
            sequence += [(unit, f"conv{i}", f"bn{i}") for i in range(1, per_unit + 1)]
            if unit == 1 and shortcut:
                sequence.append((1, "conv1sc", "bnsc"))
        for (unit, conv, bn), conv_params, bn_params in zip(sequence, convs, bns):
            for field, value in conv_params.items():
                out[f"stage{stage}_unit{unit}_{conv}_{field}"] = value
            for field, value in bn_params.items():
                out[f"stage{stage}_unit{unit}_{bn}_{field}"] = value
    return out


def fold_conv_biases(canon):
    """BN(Wx + b) = BN(Wx) with running mean m - b: fold ``<prefix>convK_bias`` into ``<prefix>bnK_running_mean``.
    Returns the number folded."""
    folded = 0
    for key in [k for k in canon if re.fullmatch(r".*_conv\w*_bias", k)]:
        bn = key.replace("_conv", "_bn", 1)[:-len("_bias")].replace("_bn1sc", "_bnsc") + "_running_mean"
        if bn not in canon:
            raise PretrainedError(f"convolution bias {key} is not followed by a BatchNorm; cannot fold it")
        canon[bn] = canon[bn] - canon.pop(key)
        folded += 1
    return folded
