"""Published ImageNet ResNet weights into the kit's network (``--pretrained FILE``), for fine-tuning.

Sources, told apart by the file's extension and key names:
  torchvision / timm   ``.safetensors`` (read with the safetensors package's numpy API, no PyTorch) or a ``.pth``
                       state dict (needs PyTorch): ``conv1.weight``, ``bn1.weight``, ``layer1.0.conv1.weight``,
                       ``layer1.0.downsample.0.weight``, ``fc.weight``. Bottlenecks stride in the 3x3 (v1.5).
  GluonCV model zoo    ``.params``: resnetv1b (``resnet50_v1b``: the torchvision layout with gamma/beta names, v1.5),
                       resnet_v1 (``resnet50_v1``: ``features.4.0.body.0.weight``, the stride in the first 1x1 (v1),
                       biases on the bottleneck's 1x1 convolutions) and resnext (``resnext50_32x4d``, v1.5), in
                       the structural names of ``save_parameters`` or the older prefixed names of ``save_params``.
  the kit              ``.params`` from ``net.export`` / a checkpoint (``arg:conv0_weight``, ...); the stride
                       placement is read from the ``-symbol.json`` beside it when there is one.

Every key is mapped to one of the kit's parameters (``conv0_weight``, ``stage2_unit1_conv1sc_weight``,
``fc1_weight``, ...); a key that maps nowhere, or a network the kit does not build (deep stems, average-pool
shortcuts, squeeze-excitation, wide ResNets, pre-activation v2) is refused, and so is a file of another depth,
stride placement or ResNeXt shape than the network built: a PretrainedError (a ValueError) with one line that
says what the file holds and which flag builds it. Conv weights are kept as (O, I, kH, kW) and transposed to
(O, kH, kW, I) for an NHWC network; a 3-channel stem is zero-padded for a 4-channel network (the fourth input
channel is zero padding); values are cast to each parameter's dtype (float16 networks keep BatchNorm in float32).
A conv bias followed by BatchNorm (GluonCV's resnet_v1) is folded into the running mean: BN(Wx + b) with mean m
equals BN(Wx) with mean m - b, in inference and in training (batch statistics cancel it).
When the number of classes differs from the file's, the classifier (``fc1_``) keeps its fresh initialisation.
BatchNorm epsilon is not stored in these files: all of the sources use 1e-5, the kit's default.
"""
import dataclasses
import json
import os
import re
import struct

import mxnet as mx
import numpy as np

from rn50kit.common.cli import config_defaults
import models


HEAD_PREFIX = "fc1_"  # the classifier's parameters: fc1_weight, fc1_bias
BN_FIELDS = ("gamma", "beta", "running_mean", "running_var")
TORCH_EXTENSIONS = (".pth", ".pt", ".bin", ".ckpt", ".tar")
SAFETENSORS_PIN = "safetensors==0.8.0"


class PretrainedError(ValueError):
    """A file that cannot be loaded into the network built: the message is one line for the user."""


@dataclasses.dataclass(frozen=True)
class Architecture:
    """What a set of ResNet weights (or a network) is, as far as the weights and the file tell."""
    kind: str                # "basic" or "bottleneck"
    units: tuple             # residual units per stage
    groups: int              # groups of the 3x3 convolutions (ResNeXt cardinality), 1 for ResNet
    width: int               # channels of the first stage's 3x3 convolution
    out_channels: tuple      # output channels of the stem and of each stage
    version: str = None      # "1" (stride in the first 1x1), "1.5" (in the 3x3), None: unknown or irrelevant
    num_classes: int = 0
    in_channels: int = 3     # input channels of the stem

    @property
    def depth(self):
        for depth, (kind, units, channels) in models.RESNET_SPEC.items():
            if kind == self.kind and tuple(units) == tuple(self.units) and \
                    tuple(channels) == tuple(self.out_channels):
                return depth
        return None

    @property
    def wide(self):
        return self.kind == "bottleneck" and self.groups == 1 and self.width != self.out_channels[1] // 4

    def kit_name(self, default_version="1.5"):
        """The kit's model name that builds this network (``resnet50_v1.5``), or None if the kit builds none."""
        depth = self.depth
        if depth is None or self.wide or self.groups < 1 or self.width % self.groups:
            return None
        version = self.version or default_version
        if self.groups == 1:
            return f"resnet{depth}_v{version}"
        return f"resnext{depth}_{self.groups}x{self.width // self.groups}d" + ("_v1" if version == "1" else "")

    def family_name(self):
        """The name the ecosystem uses: resnet50, resnext101_32x8d, wide_resnet50_2, or a description."""
        depth = self.depth
        if depth is None:
            return f"ResNet-like network with {'+'.join(map(str, self.units))} {self.kind} units per stage"
        if self.groups > 1:
            return f"resnext{depth}_{self.groups}x{self.width // self.groups}d"
        if self.wide:
            return f"wide_resnet{depth}_{self.width * 4 // self.out_channels[1]}"
        return f"resnet{depth}"

    def describe(self, source=None):
        """``torchvision/timm resnet50 (v1.5: stride in the 3x3 convolutions, 1000 classes)``"""
        details = []
        if self.kind == "bottleneck" and self.version:
            details.append(f"v{self.version}: stride in the {'first 1x1' if self.version == '1' else '3x3'} "
                           "convolutions")
        if self.num_classes:
            details.append(f"{self.num_classes} classes")
        if self.in_channels != 3:
            details.append(f"{self.in_channels}-channel stem")
        text = f"{source} {self.family_name()}" if source else self.family_name()
        return text + (f" ({', '.join(details)})" if details else "")

    def matches(self, other):
        """Same network up to the classifier (and the stem's input channels, adapted on loading)."""
        same = (self.kind, tuple(self.units), self.groups, self.width, tuple(self.out_channels)) == \
            (other.kind, tuple(other.units), other.groups, other.width, tuple(other.out_channels))
        stride_known = self.kind == "bottleneck" and self.version and other.version
        return same and (not stride_known or self.version == other.version)


@dataclasses.dataclass(frozen=True)
class PretrainedInfo:
    """What ``load_pretrained`` loaded."""
    path: str
    file_format: str          # "safetensors", "pth" or "params"
    source: str               # "torchvision/timm", "GluonCV resnetv1b", "GluonCV resnet_v1", "GluonCV resnext", "kit"
    architecture: str         # the file's network, e.g. "resnet50 (v1.5: stride in the 3x3 convolutions, ...)"
    model: str                # the kit's name for it, e.g. "resnet50_v1.5"
    file_classes: int
    num_classes: int
    head_reinitialized: bool  # True: the classifier was not loaded (class counts differ) and keeps its fresh init
    params_loaded: int        # parameters of the network set from the file
    params_total: int
    notes: tuple = ()         # adaptations made: folded conv biases, padded stem, cast dtypes

    def summary(self):
        """One line for the log."""
        head = (f"new {self.num_classes}-class classifier (the file has {self.file_classes or 'none'})"
                if self.head_reinitialized else f"classifier loaded ({self.file_classes} classes)")
        notes = f"; {'; '.join(self.notes)}" if self.notes else ""
        return (f"pretrained: {os.path.basename(self.path)}: {self.source} {self.architecture} -> {self.model}, "
                f"{self.params_loaded}/{self.params_total} parameters loaded, {head}{notes}")


# ---------------------------------------------------------------------------------------------------------
# command line and fine-tuning

@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    """The Fine-tuning flags' values."""
    pretrained: str = None
    backbone_lr_mult: float = 1.0
    freeze_backbone_epochs: int = 0

    @property
    def changes_lr(self):
        return self.backbone_lr_mult != 1.0 or self.freeze_backbone_epochs > 0


def add_pretrained_args(parser):
    group = parser.add_argument_group(
        "Fine-tuning", "start from published ImageNet weights (torchvision, timm, GluonCV or the kit's own)")
    group.add_argument("--pretrained", metavar="FILE",
                       help="initial weights: a torchvision/timm ResNet state dict (.safetensors; .pth needs "
                            "PyTorch), a GluonCV model-zoo .params, or a .params checkpoint of this kit; the "
                            "classifier is new when --num-classes differs from the file's")
    group.add_argument("--backbone-lr-mult", type=float,
                       help="learning-rate multiplier of every parameter but the classifier (e.g. 0.1: the "
                            "backbone learns 10x slower than the new head)")
    group.add_argument("--freeze-backbone-epochs", type=int, metavar="N",
                       help="train only the classifier for the first N epochs (backbone learning rate 0; its "
                            "BatchNorm statistics still follow the data)")
    parser.set_defaults(**config_defaults(FinetuneConfig))
    return group


def check_pretrained_args(cfg):
    """ValueError (naming the flag) for values of a FinetuneConfig that cannot work."""
    if cfg.pretrained and not os.path.isfile(cfg.pretrained):
        raise ValueError(f"--pretrained {cfg.pretrained} does not exist")
    if cfg.backbone_lr_mult < 0:
        raise ValueError(f"--backbone-lr-mult must be 0 or more, got {cfg.backbone_lr_mult}")
    if cfg.freeze_backbone_epochs < 0:
        raise ValueError(f"--freeze-backbone-epochs must be 0 or more, got {cfg.freeze_backbone_epochs}")


def is_head(name):
    return name.startswith(HEAD_PREFIX)


def backbone_lr_mult(epoch, lr_mult=1.0, freeze_epochs=0):
    """The backbone's LR multiplier in ``epoch`` (0-based): 0 while frozen, then ``lr_mult``."""
    return 0.0 if epoch < freeze_epochs else float(lr_mult)


def set_backbone_lr_mult(net, mult):
    """Set ``lr_mult`` of every parameter but the classifier; the optimizer reads it at every update (Gluon's
    Trainer and Horovod's DistributedTrainer hand it the Parameter objects). With SGD/NAG, a multiplier of 0
    leaves the weights and their momentum exactly unchanged (weight decay is scaled by the LR too).
    Returns the number of parameters changed."""
    changed = 0
    for name, param in net.collect_params().items():
        if not is_head(name):
            param.lr_mult = float(mult)
            changed += 1
    return changed


# ---------------------------------------------------------------------------------------------------------
# reading files

def read_weights(path):
    """(name -> float32 numpy array, file format) of a .safetensors, PyTorch or MXNet .params file."""
    if not os.path.isfile(path):
        raise PretrainedError(f"--pretrained {path} does not exist")
    lower = path.lower()
    if lower.endswith(".safetensors"):
        weights, fmt = _read_safetensors(path), "safetensors"
    elif lower.endswith(TORCH_EXTENSIONS):
        weights, fmt = _read_torch(path), "pth"
    elif lower.endswith(".params"):
        weights, fmt = _read_params(path), "params"
    else:
        raise PretrainedError(f"--pretrained {path}: unknown format; give a .safetensors, .pth or .params file")
    if not weights:
        raise PretrainedError(f"--pretrained {path} holds no tensors")
    return weights, fmt


def _read_safetensors(path):
    try:
        from safetensors import SafetensorError
        from safetensors.numpy import load_file
    except ImportError:
        raise PretrainedError(f"reading {os.path.basename(path)} needs the safetensors package: "
                              f"pip install {SAFETENSORS_PIN}") from None
    try:
        tensors = load_file(path)
    except (SafetensorError, TypeError, ValueError, KeyError) as error:
        # numpy has no bfloat16, so the package cannot hand those over: decode such files here.
        if "BF16" not in _safetensors_dtypes(path):
            raise PretrainedError(f"--pretrained {path} is not a readable safetensors file: {error}") from None
        tensors = _read_safetensors_raw(path)
    return {key: np.asarray(value, dtype=np.float32) for key, value in tensors.items()
            if np.issubdtype(np.asarray(value).dtype, np.floating)}


def _header_json(f, path):
    """The JSON header of the open safetensors file ``f``, and its length; ValueError when its stated length
    runs past the file's end (a damaged file: reading it would ask for up to 2**64 bytes)."""
    size = struct.unpack("<Q", f.read(8))[0]
    if size > os.path.getsize(path) - 8:
        raise ValueError(f"header length {size} runs past the file's end")
    header = json.loads(f.read(size))
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    return header, size


def _safetensors_header(path):
    with open(path, "rb") as f:
        header, size = _header_json(f, path)
    header.pop("__metadata__", None)
    return header, 8 + size


def _recorded_version(path):
    """The stride placement a .safetensors file's metadata records ("resnet_version": "1" or "1.5", as
    export.py writes it), or None."""
    if not path.lower().endswith(".safetensors"):
        return None
    try:
        with open(path, "rb") as f:
            metadata = _header_json(f, path)[0].get("__metadata__") or {}
    except (OSError, ValueError, struct.error, RecursionError):
        return None
    if not isinstance(metadata, dict):
        return None
    version = metadata.get("resnet_version")
    return version if version in ("1", "1.5") else None


def _safetensors_dtypes(path):
    try:
        return {entry["dtype"] for entry in _safetensors_header(path)[0].values()}
    except (OSError, ValueError, KeyError, TypeError, struct.error, RecursionError):  # entries not objects
        return set()


def _read_safetensors_raw(path):
    """The float tensors of a safetensors file, bfloat16 included (as float32): the format is an 8-byte header
    length, a JSON header (dtype, shape, data_offsets per tensor) and the raw little-endian data."""
    header, start = _safetensors_header(path)
    dtypes = {"F64": "<f8", "F32": "<f4", "F16": "<f2"}
    tensors = {}
    with open(path, "rb") as f:
        for name, entry in header.items():
            begin, end = entry["data_offsets"]
            f.seek(start + begin)
            raw = f.read(end - begin)
            if entry["dtype"] == "BF16":  # the top 16 bits of a float32
                value = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
            elif entry["dtype"] in dtypes:
                value = np.frombuffer(raw, dtypes[entry["dtype"]]).astype(np.float32)
            else:
                continue
            tensors[name] = value.reshape(entry["shape"])
    return tensors


def _read_torch(path):
    try:
        import torch
    except ImportError:
        stem = os.path.splitext(path)[0]
        raise PretrainedError(
            f"{os.path.basename(path)} is a PyTorch file and PyTorch is not installed here: pip install torch, or "
            f"convert it once where PyTorch is: python -c \"import torch, safetensors.torch as s; "
            f"d = torch.load('{path}', map_location='cpu', weights_only=True); d = d.get('state_dict', d); "
            f"s.save_file({{k: v.contiguous() for k, v in d.items()}}, '{stem}.safetensors')\" "
            f"and give --pretrained {stem}.safetensors") from None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - torch raises many kinds; the user needs one line
        raise PretrainedError(f"--pretrained {path}: PyTorch cannot read it as a state dict: "
                              f"{str(error).splitlines()[0] if str(error) else type(error).__name__}") from None
    for wrapper in ("state_dict", "model", "model_state", "model_state_dict"):
        if isinstance(obj, dict) and isinstance(obj.get(wrapper), dict):
            obj = obj[wrapper]
            break
    if not isinstance(obj, dict):
        raise PretrainedError(f"--pretrained {path} holds a {type(obj).__name__}, not a state dict "
                              "(save model.state_dict())")
    return {key: value.detach().to(torch.float32).numpy() for key, value in obj.items()
            if isinstance(value, torch.Tensor) and value.is_floating_point()}


def _read_params(path):
    try:
        loaded = mx.nd.load(path)
    except mx.base.MXNetError as error:
        raise PretrainedError(f"--pretrained {path} is not an MXNet parameter file: "
                              f"{str(error).splitlines()[0]}") from None
    if not isinstance(loaded, dict):
        raise PretrainedError(f"--pretrained {path} holds a list of arrays without names; save a dict "
                              "(save_parameters or net.export)")
    return {key.split(":", 1)[-1]: value.astype("float32").asnumpy() for key, value in loaded.items()}


# ---------------------------------------------------------------------------------------------------------
# naming: every source's keys to the kit's parameter names (conv weights (O, I, kH, kW))

def _strip_wrapper_prefix(weights):
    """Drop a prefix that every key shares from training wrappers (DistributedDataParallel's ``module.``,
    ``model.``)."""
    for prefix in ("module.", "model.", "_orig_mod."):
        if weights and all(key.startswith(prefix) for key in weights):
            weights = {key[len(prefix):]: value for key, value in weights.items()}
    return weights


def _unsupported(path, what):
    return PretrainedError(f"{os.path.basename(path)} holds {what}, which the kit does not build (its ResNets have "
                           "a 7x7 stem and 1x1-convolution shortcuts; python models.py lists them): use plain "
                           "ResNet/ResNeXt weights")


def _check_unknown(path, source, unknown):
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
    raise _unsupported(path, what)


_TORCH_BN = {"weight": "gamma", "bias": "beta", "running_mean": "running_mean", "running_var": "running_var"}
_GLUON_BN = {name: name for name in BN_FIELDS}


def _from_torch_style(weights, path, source, bn_names):
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
    _check_unknown(path, source, unknown)
    return out


# GluonCV resnet_v1 / resnext: features.<4+stage>.<unit>.body.<index>; the body's layers by index
_GLUON_BODY = {"basic": {0: "conv1", 1: "bn1", 3: "conv2", 4: "bn2"},
               "bottleneck": {0: "conv1", 1: "bn1", 3: "conv2", 4: "bn2", 6: "conv3", 7: "bn3"}}


def _from_gluon_features(weights, path, source):
    """GluonCV resnet_v1 and resnext in save_parameters' structural names. Conv biases (resnet_v1's bottleneck
    1x1 convolutions) are returned under ``<conv>_bias`` for folding."""
    kind = "bottleneck" if any(re.fullmatch(r"features\.\d+\.\d+\.body\.6\.weight", k) for k in weights) \
        else "basic"
    body = _GLUON_BODY[kind]
    out, unknown = {}, []
    if "features.0.weight" in weights and weights["features.0.weight"].shape[-1] != 7:
        if "features.3.weight" in weights:
            raise _unsupported(path, f"a {source} deep-stem ResNet/ResNeXt (three 3x3 stem convolutions)")
        raise _unsupported(path, f"a {source} CIFAR-style ResNet (a 3x3 stem without max pooling)")
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
    _check_unknown(path, source, unknown)
    return out


def _from_gluon_legacy(weights, path):
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
    _check_unknown(path, "GluonCV", unknown)
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


def _fold_conv_biases(canon):
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
    weights = _strip_wrapper_prefix(weights)
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
        _check_unknown(path, source, unknown)
    elif any(k.startswith(("layer1.", "layers1.")) for k in keys) or "conv1.0.weight" in keys:
        gluon = any(k.endswith((".gamma", ".beta")) for k in keys)
        source = "GluonCV resnetv1b" if gluon else "torchvision/timm"
        canon = _from_torch_style(weights, path, source, _GLUON_BN if gluon else _TORCH_BN)
        version = _recorded_version(path) or "1.5"  # a kit v1 network exported (export.py) says so
    elif "features.0.weight" in keys or any(k.startswith("features.") for k in keys):
        if any(re.fullmatch(r"features\.\d+\.\d+\.bn1\.\w+", k) for k in keys) or \
                any(re.fullmatch(r"features\.0\.(gamma|beta|running_mean)", k) for k in keys):
            raise _unsupported(path, "a GluonCV resnet_v2 (pre-activation: BatchNorm before each convolution)")
        canon = _from_gluon_features(weights, path, "GluonCV")
        conv2 = canon.get("stage1_unit1_conv2_weight")
        grouped = conv2 is not None and conv2.shape[0] != conv2.shape[1]
        has_bias = any(k.endswith("_bias") and not is_head(k) for k in canon)
        bottleneck = "stage1_unit1_conv3_weight" in canon
        # resnet_v1's bottleneck: stride and bias on the first 1x1; resnext: stride in the 3x3, no biases
        source = "GluonCV resnext" if grouped or (bottleneck and not has_bias) else "GluonCV resnet_v1"
        version = ("1.5" if source == "GluonCV resnext" else "1") if bottleneck else None
    elif any(k.startswith("resnet.embedder") or k.startswith("embedder.") for k in keys):
        raise _unsupported(path, "a Hugging Face transformers ResNet (resnet.embedder.*, not the timm/torchvision "
                                 "naming); use the timm or torchvision weights of the same model")
    elif any(re.match(r"^([a-z]+\d+_)?(stage\d_)?(conv|batchnorm|dense)\d+_", k) for k in keys):
        canon = _from_gluon_legacy(weights, path)
        conv2 = canon.get("stage1_unit1_conv2_weight")
        grouped = conv2 is not None and conv2.shape[0] != conv2.shape[1]
        bottleneck = "stage1_unit1_conv3_weight" in canon
        source = "GluonCV resnext" if grouped else "GluonCV resnet_v1"
        version = ("1.5" if grouped else "1") if bottleneck else None
    else:
        sample = ", ".join(sorted(keys)[:3])
        raise PretrainedError(f"{os.path.basename(path)} holds no ResNet weights the kit knows (keys {sample}, ...): "
                              "give torchvision/timm, GluonCV or kit ResNet weights")
    folded = _fold_conv_biases(canon)
    if folded:
        notes.append(f"{folded} convolution biases folded into the BatchNorm means")
    return source, canon, version, notes


def _architecture(shapes, version=None):
    """The Architecture of kit-named weight shapes (convs (O, I, kH, kW)); None if they are not a ResNet."""
    if "conv0_weight" not in shapes or "stage1_unit1_conv1_weight" not in shapes or \
            "stage1_unit1_conv2_weight" not in shapes:
        return None
    units = []
    for stage in range(1, 5):
        count = 0
        while f"stage{stage}_unit{count + 1}_conv1_weight" in shapes:
            count += 1
        units.append(count)
    if 0 in units or any(re.fullmatch(r"stage[5-9]_.*", k) for k in shapes):
        return None
    kind = "bottleneck" if "stage1_unit1_conv3_weight" in shapes else "basic"
    last = "conv3" if kind == "bottleneck" else "conv2"
    conv2 = shapes["stage1_unit1_conv2_weight"]
    out_channels = (shapes["conv0_weight"][0],) + tuple(shapes[f"stage{s}_unit1_{last}_weight"][0]
                                                         for s in range(1, 5))
    fc = shapes.get("fc1_weight", (0,))
    return Architecture(kind=kind, units=tuple(units), groups=max(1, conv2[0] // max(1, conv2[1])), width=conv2[0],
                        out_channels=out_channels, version=version if kind == "bottleneck" else None,
                        num_classes=int(fc[0]), in_channels=int(shapes["conv0_weight"][1]))


def network_architecture(net):
    """The Architecture of a kit network (models.ResNet): shapes from its parameters, stride placement from its
    first downsampling bottleneck."""
    layout = getattr(net, "layout", "NCHW")
    shapes = {}
    for name, param in net.collect_params().items():
        shape = tuple(param.shape)
        shapes[name] = (shape[0], shape[3], shape[1], shape[2]) if len(shape) == 4 and layout == "NHWC" else shape
    version = None
    for block in net.features:
        if isinstance(block, models.Bottleneck) and block.prefix == "stage2_unit1_":
            stride = block.body[0]._kwargs["stride"]
            version = "1" if tuple(stride) != (1, 1) else "1.5"
    return _architecture(shapes, version)


# ---------------------------------------------------------------------------------------------------------
# loading

def _refusal(path, file_arch, source, net_arch, net_name):
    """The one line refusing a file of another network: what it holds, what the run builds, which flag fits."""
    try:
        net_version = net_arch.version or models.parse_name(net_name)["version"]
    except (ValueError, TypeError):
        net_version = net_arch.version
    file_name = file_arch.kit_name(default_version=net_version or "1.5")
    if file_name is None:
        hint = "the kit builds no such network (python models.py lists what it builds)"
    elif file_arch.groups == 1 and net_arch.groups == 1 and file_arch.depth != net_arch.depth and \
            (file_arch.kind == "basic" or file_arch.version == net_version):
        hint = f"give --num-layers {file_arch.depth} (or --model {file_name})"
    else:
        hint = f"give --model {file_name}"
    return PretrainedError(f"{os.path.basename(path)} holds a {file_arch.describe(source)}; this run builds "
                           f"{net_name}: {hint}")


def _stem_to(value, channels, notes):
    """Zero-pad (or cut) the stem's input channels (axis 1 of (O, I, kH, kW)): 3 -> 4 and back."""
    have = value.shape[1]
    if have == channels:
        return value
    if {have, channels} <= {3, 4}:
        how = "zero weights for the padding channel" if channels > have else "the padding channel dropped"
        notes.append(f"stem {'padded' if channels > have else 'cut'} from {have} to {channels} input channels ({how})")
        if channels < have:
            return value[:, :channels]
        pad = np.zeros((value.shape[0], channels - have) + value.shape[2:], value.dtype)
        return np.concatenate([value, pad], axis=1)
    return value  # refused with the shape check


def _dtype_name(dtype):
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype)


def load_pretrained(net, path, ctxs, num_classes=None, model_name=None):
    """Load the weights in ``path`` into ``net`` (a models.ResNet, initialised or not) on ``ctxs`` (a context or
    a list); returns a PretrainedInfo. ``num_classes``: the network's classes (checked against it); when the
    file's differ, the classifier is not loaded (it keeps its initialisation). ``model_name``: the kit's name of
    the network, for messages (default: derived from the network).

    Raises PretrainedError (a ValueError, one line) for a file that cannot be read or holds another network.
    Call it after ``net.initialize`` and before the weights are broadcast to the other workers (a new
    classifier must be the same on every worker); a later ``net.initialize()`` would not override it.
    """
    ctxs = ctxs if isinstance(ctxs, (list, tuple)) else [ctxs]
    weights, fmt = read_weights(path)
    source, canon, version, notes = identify(weights, path)
    net_arch = network_architecture(net)
    if net_arch is None:
        raise ValueError(f"load_pretrained needs a network of models.py, got {type(net).__name__}")
    if num_classes is not None and num_classes != net_arch.num_classes:
        raise ValueError(f"num_classes {num_classes} differs from the network's classifier ({net_arch.num_classes})")
    net_name = model_name or net_arch.kit_name()
    file_arch = _architecture({k: v.shape for k, v in canon.items()}, version)
    if file_arch is None:
        raise PretrainedError(f"{os.path.basename(path)} holds {source} weights without a complete ResNet "
                              f"(no stem or first stage); this run builds {net_name}")
    if not file_arch.matches(net_arch):
        raise _refusal(path, file_arch, source, net_arch, net_name)
    if file_arch.version is None and net_arch.kind == "bottleneck":
        notes.append("stride placement not recorded in the file (no -symbol.json beside it); assumed to match")
    params = net.collect_params()
    new_head = "fc1_weight" not in canon or file_arch.num_classes != net_arch.num_classes
    expected = {name for name in params.keys() if not (new_head and is_head(name))}
    present = set(canon) - ({k for k in canon if is_head(k)} if new_head else set())
    if expected != present:
        missing, extra = sorted(expected - present), sorted(present - expected)
        raise PretrainedError(f"{os.path.basename(path)} ({source}) does not fit {net_name}: "
                              f"missing {missing[:3]}, unexpected {extra[:3]}")
    layout = getattr(net, "layout", "NCHW")
    dtypes = set()
    for name in sorted(expected):
        param = params[name]
        value = canon[name]
        if name == "conv0_weight":
            value = _stem_to(value, net_arch.in_channels, notes)
        if value.ndim == 4 and layout == "NHWC":
            value = value.transpose(0, 2, 3, 1)
        if tuple(param.shape) != value.shape:
            raise PretrainedError(f"{os.path.basename(path)}: {name} has shape {value.shape}, {net_name} needs "
                                  f"{tuple(param.shape)}")
        dtypes.add(_dtype_name(param.dtype))
        # cast_dtype: MXNet casts the float32 values to the parameter's dtype (float16 networks, AMP)
        param._load_init(mx.nd.array(np.ascontiguousarray(value), dtype="float32"), ctxs, cast_dtype=True,
                         dtype_source="current")
    if dtypes - {"float32"}:
        kept = " (BatchNorm kept in float32)" if "float32" in dtypes else ""
        notes.append(f"cast to {'/'.join(sorted(dtypes - {'float32'}))}{kept}")
    return PretrainedInfo(path=path, file_format=fmt, source=source, architecture=file_arch.describe(),
                          model=file_arch.kit_name() or net_name, file_classes=file_arch.num_classes,
                          num_classes=net_arch.num_classes, head_reinitialized=new_head,
                          params_loaded=len(expected), params_total=len(list(params.keys())), notes=tuple(notes))
