"""An independent ResNet for the pretrained-weights tests: state dicts in torchvision's exact key names and shapes,
a numpy forward pass (float64) that reads them as torchvision's ResNet does, and renamings into GluonCV's names.

Nothing here imports the kit: it is written from torchvision's and GluonCV's model definitions (torchvision
resnet.py: BasicBlock, Bottleneck with the stride on conv2 and width = int(planes * width_per_group / 64) * groups;
GluonCV resnet.py / resnetv1b.py / resnext.py), so the kit's mapping is checked against a second reading.
"""
import numpy as np

# depth -> (bottleneck?, blocks per layer), as torchvision's resnet18 ... resnet152
LAYERS = {18: (False, [2, 2, 2, 2]), 34: (False, [3, 4, 6, 3]), 50: (True, [3, 4, 6, 3]),
          101: (True, [3, 4, 23, 3]), 152: (True, [3, 8, 36, 3])}
EPS = 1e-5


def _bn(rng, prefix, channels, sd, last=False):
    sd[prefix + "weight"] = rng.uniform(0.1, 0.3, channels) if last else rng.uniform(0.6, 1.4, channels)
    sd[prefix + "bias"] = rng.normal(0, 0.1, channels)
    sd[prefix + "running_mean"] = rng.normal(0, 0.2, channels)
    sd[prefix + "running_var"] = rng.uniform(0.5, 2.0, channels)
    sd[prefix + "num_batches_tracked"] = np.array(1000, np.int64)


def _conv(rng, shape):
    fan_in = shape[1] * shape[2] * shape[3]
    return rng.normal(0, np.sqrt(2.0 / fan_in), shape)


def torchvision_state_dict(depth, num_classes, groups=1, width_per_group=64, seed=0, conv_bias_1x1=False,
                           in_channels=3):
    """Random weights under torchvision's ``resnet{depth}`` / ``resnext{depth}_{groups}x{w}d`` key names.
    ``conv_bias_1x1``: biases on the bottleneck's 1x1 convolutions (GluonCV's resnet_v1 has them)."""
    rng = np.random.RandomState(seed)
    bottleneck, blocks = LAYERS[depth]
    expansion = 4 if bottleneck else 1
    sd = {"conv1.weight": _conv(rng, (64, in_channels, 7, 7))}
    _bn(rng, "bn1.", 64, sd)
    inplanes = 64
    for layer, count in enumerate(blocks, 1):
        planes = 64 * 2 ** (layer - 1)
        for block in range(count):
            stride = 2 if layer > 1 and block == 0 else 1
            p = f"layer{layer}.{block}."
            if bottleneck:
                width = int(planes * (width_per_group / 64.0)) * groups
                sd[p + "conv1.weight"] = _conv(rng, (width, inplanes, 1, 1))
                _bn(rng, p + "bn1.", width, sd)
                sd[p + "conv2.weight"] = _conv(rng, (width, width // groups, 3, 3))
                _bn(rng, p + "bn2.", width, sd)
                sd[p + "conv3.weight"] = _conv(rng, (planes * 4, width, 1, 1))
                _bn(rng, p + "bn3.", planes * 4, sd, last=True)
                if conv_bias_1x1:
                    sd[p + "conv1.bias"] = rng.normal(0, 0.1, width)
                    sd[p + "conv3.bias"] = rng.normal(0, 0.1, planes * 4)
            else:
                sd[p + "conv1.weight"] = _conv(rng, (planes, inplanes, 3, 3))
                _bn(rng, p + "bn1.", planes, sd)
                sd[p + "conv2.weight"] = _conv(rng, (planes, planes, 3, 3))
                _bn(rng, p + "bn2.", planes, sd, last=True)
            if stride != 1 or inplanes != planes * expansion:
                sd[p + "downsample.0.weight"] = _conv(rng, (planes * expansion, inplanes, 1, 1))
                _bn(rng, p + "downsample.1.", planes * expansion, sd)
            inplanes = planes * expansion
    sd["fc.weight"] = rng.normal(0, 1.0 / np.sqrt(inplanes), (num_classes, inplanes))
    sd["fc.bias"] = rng.normal(0, 0.1, num_classes)
    return {k: (v.astype(np.float32) if v.dtype.kind == "f" else v) for k, v in sd.items()}


# ---------------------------------------------------------------------------------------------------------
# the forward pass, in float64

def conv2d(x, w, stride=1, padding=0, groups=1, bias=None):
    n, c, h, wd = x.shape
    out_ch, per_group, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    windows = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))[:, :, ::stride, ::stride]
    og = out_ch // groups
    outs = []
    for g in range(groups):
        cols = windows[:, g * per_group:(g + 1) * per_group]  # n, cg, ho, wo, kh, kw
        outs.append(np.tensordot(cols, w[g * og:(g + 1) * og], axes=([1, 4, 5], [1, 2, 3])))  # n, ho, wo, og
    out = np.concatenate(outs, axis=3).transpose(0, 3, 1, 2)
    if bias is not None:
        out = out + bias.reshape(1, -1, 1, 1)
    return out


def batchnorm(x, sd, prefix, gamma="weight", beta="bias"):
    shape = (1, -1, 1, 1)
    mean, var = sd[prefix + "running_mean"].astype(np.float64), sd[prefix + "running_var"].astype(np.float64)
    return (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + EPS) * \
        sd[prefix + gamma].astype(np.float64).reshape(shape) + sd[prefix + beta].astype(np.float64).reshape(shape)


def relu(x):
    return np.maximum(x, 0)


def maxpool3x3s2(x):
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    windows = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))[:, :, ::2, ::2]
    return windows.max(axis=(4, 5))


def features(sd, x, stride_in_1x1=False):
    """torchvision's ResNet up to the pooled features; ``stride_in_1x1``: ResNet v1 (Caffe/GluonCV) bottlenecks."""
    sd = {k: v.astype(np.float64) for k, v in sd.items() if v.dtype.kind == "f"}
    x = x.astype(np.float64)
    x = maxpool3x3s2(relu(batchnorm(conv2d(x, sd["conv1.weight"], 2, 3), sd, "bn1.")))
    for layer in range(1, 5):
        block = 0
        while f"layer{layer}.{block}.conv1.weight" in sd:
            p = f"layer{layer}.{block}."
            stride = 2 if layer > 1 and block == 0 else 1
            if p + "conv3.weight" in sd:
                w2 = sd[p + "conv2.weight"]
                groups = w2.shape[0] // w2.shape[1]
                s1, s3 = (stride, 1) if stride_in_1x1 else (1, stride)
                out = relu(batchnorm(conv2d(x, sd[p + "conv1.weight"], s1, 0, bias=sd.get(p + "conv1.bias")),
                                     sd, p + "bn1."))
                out = relu(batchnorm(conv2d(out, w2, s3, 1, groups), sd, p + "bn2."))
                out = batchnorm(conv2d(out, sd[p + "conv3.weight"], 1, 0, bias=sd.get(p + "conv3.bias")), sd,
                                p + "bn3.")
            else:
                out = relu(batchnorm(conv2d(x, sd[p + "conv1.weight"], stride, 1), sd, p + "bn1."))
                out = batchnorm(conv2d(out, sd[p + "conv2.weight"], 1, 1), sd, p + "bn2.")
            identity = x
            if p + "downsample.0.weight" in sd:
                identity = batchnorm(conv2d(x, sd[p + "downsample.0.weight"], stride, 0), sd, p + "downsample.1.")
            x = relu(out + identity)
            block += 1
    return x.mean(axis=(2, 3))


def forward(sd, x, stride_in_1x1=False):
    """Logits of torchvision's ResNet for NCHW ``x``, computed from the state dict ``sd``."""
    feats = features(sd, x, stride_in_1x1)
    return feats @ sd["fc.weight"].astype(np.float64).T + sd["fc.bias"].astype(np.float64)


# ---------------------------------------------------------------------------------------------------------
# the same weights under GluonCV's names

_GLUON_BN = {"weight": "gamma", "bias": "beta", "running_mean": "running_mean", "running_var": "running_var"}


def to_gluoncv_v1b(sd):
    """GluonCV resnetv1b (resnet50_v1b) save_parameters names: torchvision's, with BatchNorm gamma/beta."""
    out = {}
    for key, value in sd.items():
        if key.endswith("num_batches_tracked"):
            continue
        head, field = key.rsplit(".", 1)
        is_bn = head.endswith(("bn1", "bn2", "bn3", "downsample.1"))
        out[f"{head}.{_GLUON_BN[field] if is_bn else field}"] = value
    return out


def _gluon_layers(sd):
    """(layer, block, kind, torchvision prefix, GluonCV body/downsample index) for every conv and BN, in the
    order GluonCV creates them inside a stage: conv1, bn1, conv2, bn2[, conv3, bn3], then the shortcut."""
    for layer in range(1, 5):
        block = 0
        while f"layer{layer}.{block}.conv1.weight" in sd:
            p = f"layer{layer}.{block}."
            bottleneck = p + "conv3.weight" in sd
            body = [("conv1", 0), ("bn1", 1), ("conv2", 3), ("bn2", 4)] + \
                ([("conv3", 6), ("bn3", 7)] if bottleneck else [])
            for name, index in body:
                yield layer, block, p + name + ".", f"body.{index}"
            if p + "downsample.0.weight" in sd:
                yield layer, block, p + "downsample.0.", "downsample.0"
                yield layer, block, p + "downsample.1.", "downsample.1"
            block += 1


def _fields(sd, prefix, is_bn):
    for field in ("weight", "bias", "running_mean", "running_var"):
        if prefix + field in sd:
            yield (_GLUON_BN[field] if is_bn else field), sd[prefix + field]


def to_gluoncv_features(sd):
    """GluonCV resnet_v1 / resnext save_parameters names: features.0 (stem conv), features.1 (stem BN),
    features.<3+stage>.<unit>.body.<index>, .downsample.<0|1>, output."""
    out = {"features.0.weight": sd["conv1.weight"]}
    out.update({f"features.1.{name}": value for name, value in _fields(sd, "bn1.", True)})
    for layer, block, prefix, where in _gluon_layers(sd):
        is_bn = ".bn" in prefix or prefix.endswith("downsample.1.")
        for name, value in _fields(sd, prefix, is_bn):
            out[f"features.{3 + layer}.{block}.{where}.{name}"] = value
    out["output.weight"], out["output.bias"] = sd["fc.weight"], sd["fc.bias"]
    return out


def to_gluoncv_legacy(sd, prefix="resnetv10_"):
    """GluonCV / Gluon model zoo save_params names: auto-numbered per stage in creation order
    (``resnetv10_stage1_conv0_weight``, ``resnetv10_stage1_batchnorm0_gamma``, ...), stem conv0/batchnorm0, dense0."""
    out = {f"{prefix}conv0_weight": sd["conv1.weight"]}
    out.update({f"{prefix}batchnorm0_{name}": value for name, value in _fields(sd, "bn1.", True)})
    counters = {}
    for layer, block, tv_prefix, _ in _gluon_layers(sd):
        is_bn = ".bn" in tv_prefix or tv_prefix.endswith("downsample.1.")
        kind = "batchnorm" if is_bn else "conv"
        number = counters.get((layer, kind), 0)
        counters[(layer, kind)] = number + 1
        for name, value in _fields(sd, tv_prefix, is_bn):
            out[f"{prefix}stage{layer}_{kind}{number}_{name}"] = value
    out[f"{prefix}dense0_weight"], out[f"{prefix}dense0_bias"] = sd["fc.weight"], sd["fc.bias"]
    return out
