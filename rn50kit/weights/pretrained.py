"""Published ImageNet ResNet weights into the kit's network (``--pretrained FILE``), for fine-tuning.
This module loads; the steps before are modules of their own: readers.py (a file's tensors), sources.py (whose
weights they are) and key_maps.py (their names in the kit's), architecture.py (what network they are).

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
import os

import mxnet as mx
import numpy as np

import models
from rn50kit.weights.architecture import from_shapes, network_architecture
from rn50kit.weights.errors import PretrainedError
from rn50kit.weights.key_maps import is_head
from rn50kit.weights.readers import read_weights
from rn50kit.weights.sources import identify


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


# fine-tuning: the backbone's LR

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
    file_arch = from_shapes({k: v.shape for k, v in canon.items()}, version)
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
