"""The ResNet family as Gluon HybridBlocks: ResNet v1 / v1.5 (depth 18-152) and ResNeXt.

v1 puts the stride of a downsampling bottleneck on its first 1x1 convolution, v1.5 on the 3x3 one
(NVIDIA's "ResNet50 v1.5"). Basic blocks (depth 18/34) are the same in both versions. ResNeXt uses
v1.5 stride placement unless its name ends in `_v1`.

Parameter names are fixed (`conv0_weight`, `stage1_unit1_bn3_gamma`, `fc1_weight`, ...), independent of how
many networks the process built, of the precision and of BN+ReLU fusion: exported files of a float16 and a
float32 model, fused or not, are interchangeable.

`python models.py` lists the models; `python models.py --summary` prints parameters, GMACs and images/s.
"""
import argparse
import json
import logging
import os
import re
import sys
import time

import mxnet as mx
import numpy as np
from mxnet.gluon import nn

from rn50kit.config.cli import config_from

# the Model flags and the tables they choose from live in the configuration home; read here too
from rn50kit.config.model_flags import (  # noqa: F401
    ARCHS,
    DTYPES,
    LAYOUTS,
    RESNET_SPEC,
    RESNEXT_WIDTH,
    ModelConfig,
    add_model_args,
    model_name,
    model_name_from_args,
)

# The graph transforms and loaders live in rn50kit/graph; their names stay reachable as models.* for the scripts
# that call them so (docs/training.md's inference helpers, the checkpoint writer, the loop's BatchNorm checks).
from rn50kit.graph.inference import optimize_for_inference, to_bfloat16  # noqa: F401 -- see above
from rn50kit.graph.parameters import load_parameters, running_stats  # noqa: F401 -- see above
from rn50kit.graph.symbol_files import export, load_checkpoint, without_amp_casts  # noqa: F401 -- see above
from rn50kit.hardware import devices

log = logging.getLogger("rn50")

_NAME_RE = re.compile(r"^resnet(\d+)_v(1|1\.5)$|^resnext(\d+)_(\d+)x(\d+)d(?:_v(1|1\.5))?$")


def fused_bn_relu_available():
    """A fused BatchNorm+ReLU: NVIDIA's builds' BatchNorm(act_type='relu') (any axis; GPUs), or upstream MXNet's
    (1.6+) `nn.BatchNormReLU` (the `contrib.BatchNormWithReLU` op: oneDNN, axis 1)."""
    return devices.nvidia_bn_relu() or (hasattr(nn, "BatchNormReLU") and hasattr(mx.sym.contrib, "BatchNormWithReLU"))


def fused_bn_add_relu_available():
    """`BatchNormAddRelu` is registered only in NVIDIA's container builds of MXNet, never upstream."""
    return devices.nvidia_bn_add_relu()


def he_normal():
    # He et al. 2015: N(0, 2/fan_in). MXNet's Xavier takes fan_in from the weight shape, (C_in/groups)*k*k,
    # which is already right for grouped convolutions (the original kit's extra sqrt(groups) is not needed).
    return mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2)


class Transpose(nn.HybridBlock):
    def __init__(self, axes, **kwargs):
        super().__init__(**kwargs)
        self.axes = axes

    def hybrid_forward(self, F, x):
        return F.transpose(x, axes=self.axes)


class BatchNormActReLU(nn.BatchNorm):
    """BatchNorm and ReLU in one op, as NVIDIA's kit builds it (nn.BatchNorm(act_type='relu') in its builds): the
    BatchNorm op of NVIDIA's MXNet takes act_type. The parameters are nn.BatchNorm's, so names and checkpoints are
    those of BatchNorm + Activation."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._kwargs["act_type"] = "relu"


class BatchNormAddReLU(nn.BatchNorm):
    """relu(bn(x) + addend): one op in NVIDIA's builds, three ops elsewhere, same numbers.

    ``drop_path`` > 0 (stochastic depth): in training each sample's residual branch bn(x) is dropped with that
    probability and scaled by 1 / (1 - p) otherwise (a Dropout whose mask is shared over C, H and W, so the
    expected value is kept); outside training the Dropout passes its input through. With 0 no op is added."""

    def __init__(self, fused=False, drop_path=0.0, **kwargs):
        super().__init__(**kwargs)
        self.drop_path = drop_path
        self.fused = fused and not drop_path

    def hybrid_forward(self, F, x, addend, gamma, beta, running_mean, running_var):
        if self.drop_path:
            branch = F.Dropout(super().hybrid_forward(F, x, gamma, beta, running_mean, running_var),
                               p=self.drop_path, axes=(1, 2, 3))
            return F.Activation(branch + addend, act_type="relu")
        if self.fused:
            # by keyword, as NVIDIA's kit calls it (its models.py): the op's inputs by their names
            return F.BatchNormAddRelu(data=x, addend=addend, gamma=gamma, beta=beta, moving_mean=running_mean,
                                      moving_var=running_var, name="fwd", **self._kwargs)
        # Activation, not F.relu: oneDNN runs Activation in bfloat16, `relu` falls back to a slow kernel
        return F.Activation(super().hybrid_forward(F, x, gamma, beta, running_mean, running_var) + addend,
                            act_type="relu")


class Builder:
    """Holds the choices every layer shares (layout, BN settings, fusion), so blocks never read flags."""

    def __init__(self, layout="NCHW", bn_eps=1e-5, bn_mom=0.9, zero_init_last_gamma=True,
                 fuse_bn_relu=False, fuse_bn_add_relu=False):
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        self.layout = layout
        self.bn_eps = bn_eps
        self.bn_mom = bn_mom
        self.zero_init_last_gamma = zero_init_last_gamma
        self.fuse_bn_relu = fuse_bn_relu and fused_bn_relu_available()
        self.nvidia_bn_relu = self.fuse_bn_relu and devices.nvidia_bn_relu()  # else upstream's (oneDNN, axis 1)
        self.fuse_bn_add_relu = fuse_bn_add_relu and fused_bn_add_relu_available()

    @property
    def channel_axis(self):
        return 3 if self.layout == "NHWC" else 1

    def conv(self, channels, kernel, stride=1, in_channels=0, groups=1, prefix=None, layer=nn.Conv2D):
        return layer(channels, kernel, strides=stride, padding=kernel // 2, groups=groups, use_bias=False,
                     layout=self.layout, in_channels=in_channels, weight_initializer=he_normal(), prefix=prefix)

    def _bn_kwargs(self, last, in_channels):
        # Zero gamma on the last BN of a residual branch: every block starts as the identity (Goyal et al.).
        gamma = "zeros" if last and self.zero_init_last_gamma else "ones"
        return dict(axis=self.channel_axis, momentum=self.bn_mom, epsilon=self.bn_eps,
                    gamma_initializer=gamma, in_channels=in_channels)

    def batchnorm(self, in_channels, last=False, prefix=None):
        return nn.BatchNorm(prefix=prefix, **self._bn_kwargs(last, in_channels))

    def batchnorm_relu(self, in_channels, prefix):
        """BN then ReLU, as one block; the parameters are named `<prefix>gamma` etc. either way."""
        if self.nvidia_bn_relu:
            return [BatchNormActReLU(prefix=prefix, **self._bn_kwargs(False, in_channels))]
        if self.fuse_bn_relu:
            return [nn.BatchNormReLU(prefix=prefix, **self._bn_kwargs(False, in_channels))]
        return [self.batchnorm(in_channels, prefix=prefix), nn.Activation("relu")]

    def batchnorm_add_relu(self, in_channels, prefix, drop_path=0.0):
        return BatchNormAddReLU(fused=self.fuse_bn_add_relu, drop_path=drop_path, prefix=prefix,
                                **self._bn_kwargs(True, in_channels))

    def max_pool(self):
        return nn.MaxPool2D(3, 2, 1, layout=self.layout)

    def global_avg_pool(self):
        return nn.GlobalAvgPool2D(layout=self.layout)


class EvenChannelStem(nn.Conv2D):
    """The stem convolution computed over an even number of input channels: a zero channel after the image's and
    after the weight's (the parameter itself keeps its shape and name, so checkpoints do not change).

    oneDNN's bfloat16 convolutions take input channels in pairs. Over 3 channels MXNet's bfloat16 stem falls back
    to a GEMM kernel with a plain-layout output, which sends the stem's BatchNorm, forward and backward, to oneDNN's
    slowest (ncsp) kernel: 166 ms of the stem's conv+BN+ReLU+pool per training step against 70 ms over 4 channels
    (batch 16, 224 px, 2 cores with AVX-512 BF16).
    """

    def hybrid_forward(self, F, x, weight, bias=None):
        zero_image = F.zeros_like(F.slice_axis(x, axis=1, begin=0, end=1))
        zero_weight = F.zeros_like(F.slice_axis(weight, axis=1, begin=0, end=1))
        return F.Convolution(F.concat(x, zero_image, dim=1), F.concat(weight, zero_weight, dim=1), name="fwd",
                             **self._kwargs)


class BasicBlock(nn.HybridBlock):
    """Two 3x3 convolutions (ResNet-18/34); the version does not matter here."""

    def __init__(self, builder, channels, stride, in_channels, drop_path=0.0, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.body = nn.HybridSequential(prefix="")
            self.body.add(builder.conv(channels, 3, stride, in_channels, prefix="conv1_"),
                          *builder.batchnorm_relu(channels, "bn1_"),
                          builder.conv(channels, 3, 1, channels, prefix="conv2_"))
            self.bn_add_relu = builder.batchnorm_add_relu(channels, "bn2_", drop_path)
            self.downsample = _shortcut(builder, channels, stride, in_channels)

    def hybrid_forward(self, F, x):
        residual = x if self.downsample is None else self.downsample(x)
        return self.bn_add_relu(self.body(x), residual)


class Bottleneck(nn.HybridBlock):
    """1x1 -> 3x3 -> 1x1; the stride sits on the first 1x1 (v1) or on the 3x3 (v1.5)."""

    def __init__(self, builder, channels, stride, in_channels, version="1.5", groups=1, width=None, drop_path=0.0,
                 **kwargs):
        super().__init__(**kwargs)
        width = width or channels // 4
        stride_1x1, stride_3x3 = (stride, 1) if version == "1" else (1, stride)
        with self.name_scope():
            self.body = nn.HybridSequential(prefix="")
            self.body.add(builder.conv(width, 1, stride_1x1, in_channels, prefix="conv1_"),
                          *builder.batchnorm_relu(width, "bn1_"),
                          builder.conv(width, 3, stride_3x3, width, groups=groups, prefix="conv2_"),
                          *builder.batchnorm_relu(width, "bn2_"),
                          builder.conv(channels, 1, 1, width, prefix="conv3_"))
            self.bn_add_relu = builder.batchnorm_add_relu(channels, "bn3_", drop_path)
            self.downsample = _shortcut(builder, channels, stride, in_channels)

    def hybrid_forward(self, F, x):
        residual = x if self.downsample is None else self.downsample(x)
        return self.bn_add_relu(self.body(x), residual)


def _shortcut(builder, channels, stride, in_channels):
    """Projection shortcut (1x1 convolution with the block's stride, then BN) where the shape changes."""
    if stride == 1 and channels == in_channels:
        return None
    shortcut = nn.HybridSequential(prefix="")
    shortcut.add(builder.conv(channels, 1, stride, in_channels, prefix="conv1sc_"),
                 builder.batchnorm(channels, prefix="bnsc_"))
    return shortcut


class ResNet(nn.HybridBlock):
    """Stem, four stages, global pooling and the classifier.

    `input_layout` is the layout of the batches fed in; the network computes in `builder.layout`, with one
    transpose at the input where they differ. `dtype` is the precision of the computation: float16 casts the
    input (BatchNorm parameters stay float32), float16 and bfloat16 cast the logits back to float32.
    """

    def __init__(self, depth=50, version="1.5", num_classes=1000, builder=None, groups=1, group_width=0,
                 in_channels=3, input_layout="NCHW", dtype="float32", drop_path=0.0, **kwargs):
        kwargs.setdefault("prefix", "")  # fixed parameter names, see the module docstring
        super().__init__(**kwargs)
        if depth not in RESNET_SPEC:
            raise ValueError(f"ResNet depth {depth} is not one of {sorted(RESNET_SPEC)}")
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
        builder = builder or Builder()
        kind, units, channels = RESNET_SPEC[depth]
        if groups > 1 and kind == "basic":
            raise ValueError(f"ResNeXt needs bottleneck blocks (depth 50, 101 or 152), got depth {depth}")
        self.dtype = dtype
        self.layout = builder.layout
        self.input_layout = input_layout  # of the batches fed in (scoring.with_tta mirrors their width axis)
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            if input_layout != builder.layout:
                self.features.add(Transpose((0, 2, 3, 1) if builder.layout == "NHWC" else (0, 3, 1, 2)))
            even = dtype == "bfloat16" and in_channels % 2 and builder.layout == "NCHW"
            self.features.add(builder.conv(channels[0], 7, 2, in_channels, prefix="conv0_",
                                           layer=EvenChannelStem if even else nn.Conv2D),
                              *builder.batchnorm_relu(channels[0], "bn0_"), builder.max_pool())
            in_ch = channels[0]
            # Stochastic depth grows linearly from 0 (first block) to drop_path (last block), as timm's ResNet.
            rates = iter(np.linspace(0, drop_path, sum(units)) if drop_path else [0.0] * sum(units))
            for stage, (num_units, out_ch) in enumerate(zip(units, channels[1:])):
                # ResNeXt CxWd: C groups of W channels in the first stage, doubling with every stage.
                width = groups * group_width * 2 ** stage if groups > 1 else None
                for unit in range(num_units):
                    stride = 2 if stage > 0 and unit == 0 else 1
                    prefix = f"stage{stage + 1}_unit{unit + 1}_"
                    if kind == "basic":
                        block = BasicBlock(builder, out_ch, stride, in_ch, float(next(rates)), prefix=prefix)
                    else:
                        block = Bottleneck(builder, out_ch, stride, in_ch, version, groups, width, float(next(rates)),
                                           prefix=prefix)
                    self.features.add(block)
                    in_ch = out_ch
            self.features.add(builder.global_avg_pool(), nn.Flatten())
            self.output = nn.Dense(num_classes, in_units=in_ch, weight_initializer=he_normal(), prefix="fc1_")

    def hybrid_forward(self, F, x):
        if self.dtype == "float16":
            x = F.cast(x, dtype="float16")
        logits = self.output(self.features(x))
        if self.dtype != "float32":
            logits = F.cast(logits, dtype="float32")
        return logits


def parse_name(name):
    """``resnet50_v1.5`` -> dict(depth=50, version='1.5', groups=1, group_width=0); ValueError if unknown."""
    match = _NAME_RE.match(name)
    if not match:
        raise ValueError(f"unknown model '{name}'; choose one of: {', '.join(list_models())}")
    if match.group(1):
        depth, version, groups, width = int(match.group(1)), match.group(2), 1, 0
    else:
        depth, groups, width = int(match.group(3)), int(match.group(4)), int(match.group(5))
        version = match.group(6) or "1.5"
    if depth not in RESNET_SPEC or (groups > 1 and RESNET_SPEC[depth][0] == "basic") or groups < 1 or width < 1 \
            and groups > 1:
        raise ValueError(f"unknown model '{name}'; choose one of: {', '.join(list_models())}")
    return dict(depth=depth, version=version, groups=groups, group_width=width)


def list_models():
    names = []
    for depth in sorted(RESNET_SPEC):
        names += [f"resnet{depth}_v1", f"resnet{depth}_v1.5"]
    return names + ["resnext50_32x4d", "resnext101_32x4d", "resnext101_32x4d_v1"]


def get_model(name, num_classes=1000, bn_eps=1e-5, bn_mom=0.9, zero_init_last_gamma=True, layout="NCHW",
              input_layout="NCHW", in_channels=3, dtype="float32", fuse_bn_relu=False, fuse_bn_add_relu=False,
              pretrained=None, ctx=None, drop_path=0.0):
    """Build a network by name, e.g. ``resnet50_v1.5`` or ``resnext101_32x4d``.

    Uninitialised unless ``pretrained`` names a params file (or a ``<prefix>-NNNN.params`` checkpoint written by
    ``net.export``), which is then loaded, cast to ``dtype``, on ``ctx``. For float16 the network is cast
    (BatchNorm parameters stay float32); bfloat16 keeps float32 parameters for MXNet's AMP (see ``to_bfloat16``).
    """
    spec = parse_name(name)
    if num_classes < 1:
        raise ValueError(f"num_classes must be positive, got {num_classes}")
    builder = Builder(layout=layout, bn_eps=bn_eps, bn_mom=bn_mom, zero_init_last_gamma=zero_init_last_gamma,
                      fuse_bn_relu=fuse_bn_relu, fuse_bn_add_relu=fuse_bn_add_relu)
    net = ResNet(spec["depth"], spec["version"], num_classes, builder, groups=spec["groups"],
                 group_width=spec["group_width"], in_channels=in_channels, input_layout=input_layout, dtype=dtype,
                 drop_path=drop_path)
    if dtype == "float16":
        net.cast("float16")  # nn.BatchNorm.cast keeps its parameters float32
    if pretrained:
        load_parameters(net, pretrained, ctx or mx.cpu())
    return net


def model_kwargs(cfg, in_channels=3, input_layout="NCHW", dtype="float32"):
    """The keyword arguments of ``get_model`` for a ModelConfig and the input it gets (ValueError, with the flag,
    on bad combinations)."""
    for flag in ("batchnorm_layout", "pooling_layout"):
        value = getattr(cfg, flag)
        if value is not None and value != cfg.conv_layout:
            raise ValueError(f"--{flag.replace('_', '-')} {value} differs from --conv-layout {cfg.conv_layout}: "
                             "the network computes in one layout; set them equal")
    if not 0 <= cfg.drop_path < 1:
        raise ValueError(f"--drop-path must be in [0, 1), got {cfg.drop_path:g}")
    if cfg.fuse_bn_relu and cfg.conv_layout != "NCHW" and not devices.nvidia_bn_relu():
        raise ValueError(f"--fuse-bn-relu 1 needs --conv-layout NCHW: MXNet's BatchNormWithReLU takes the channel "
                         f"axis 1 only (got {cfg.conv_layout}); leave the fusion out")
    return dict(num_classes=cfg.num_classes, bn_eps=cfg.batchnorm_eps, bn_mom=cfg.batchnorm_mom,
                zero_init_last_gamma=cfg.zero_init_last_gamma, layout=cfg.conv_layout, input_layout=input_layout,
                in_channels=in_channels, dtype=FLOAT_NETWORK.get(dtype, dtype), fuse_bn_relu=bool(cfg.fuse_bn_relu),
                fuse_bn_add_relu=bool(cfg.fuse_bn_add_relu), drop_path=cfg.drop_path)


# --dtype int8 builds the float32 network; quantize.py turns the loaded checkpoint into the INT8 graph.
FLOAT_NETWORK = {"int8": "float32"}


def build_network(cfg, in_channels=3, input_layout="NCHW", dtype="float32"):
    """The network ``cfg`` (a ModelConfig) describes, uninitialised; its logits are float32 whatever ``dtype`` is.

    float16: parameters float16 except BatchNorm's. bfloat16: parameters float32, for MXNet AMP
    (``amp.init(target_dtype='bfloat16')`` before the first forward) or ``to_bfloat16`` for inference.
    """
    if (cfg.fuse_bn_relu and not fused_bn_relu_available()) or \
            (cfg.fuse_bn_add_relu and not fused_bn_add_relu_available()):
        log.info("fused BatchNorm ops asked for but not in this MXNet build: using the plain ops")
    return get_model(cfg.name, **model_kwargs(cfg, in_channels, input_layout, dtype))


def get_model_from_args(args):
    """build_network for parsed flags (a Namespace with the Model flags, and --image-shape, --input-layout and
    --dtype when the parser has them)."""
    image_shape = getattr(args, "image_shape", None) or [3]
    return build_network(config_from(ModelConfig, args), image_shape[0], getattr(args, "input_layout", "NCHW"),
                         getattr(args, "dtype", None) or "float32")


# ---------------------------------------------------------------------------------------------------------
# Cost and summary

def trainable_parameters(net):
    """Number of trainable values (BatchNorm running statistics excluded); shapes must be known."""
    params = [p for p in net.collect_params().values() if p.grad_req != "null"]
    unknown = [p.name for p in params if not p.shape or 0 in p.shape]
    if unknown:
        raise ValueError(f"shapes not known yet for {unknown[:3]}: run one forward pass first")
    return sum(int(np.prod(p.shape)) for p in params)


def count_macs(net, image_shape=(3, 224, 224)):
    """Multiply-accumulates of one forward pass for one image, from the symbol's inferred shapes.

    Counts convolutions and fully connected layers (everything else is < 1 % of a ResNet).
    """
    sym = net(mx.sym.var("data"))
    internals = sym.get_internals()
    _, out_shapes, _ = internals.infer_shape(data=(1,) + tuple(image_shape))
    shapes = dict(zip(internals.list_outputs(), out_shapes))
    nodes = json.loads(without_amp_casts(sym).tojson(remove_amp_cast=False))["nodes"]
    macs = 0
    for node in nodes:
        if node["op"] not in ("Convolution", "FullyConnected"):
            continue
        out = shapes[node["name"] + "_output"]
        weight = shapes[nodes[node["inputs"][1][0]]["name"]]  # a variable: listed under its own name
        # each output value sums over weight.shape[1:] products: (C_in / groups) * kh * kw, or C_in for FC
        macs += int(np.prod(out)) * int(np.prod(weight[1:]))
    return macs


def measure_forward(net, batch_size, image_shape=(3, 224, 224), iters=3, warmup=1, ctx=None):
    """Forward images/s of an initialised, hybridized network on random input."""
    ctx = ctx or mx.cpu()
    data = mx.nd.random.uniform(shape=(batch_size,) + tuple(image_shape), ctx=ctx)
    for _ in range(warmup):
        net(data).wait_to_read()
    start = time.perf_counter()
    for _ in range(iters):
        net(data).wait_to_read()
    return batch_size * iters / (time.perf_counter() - start)


def summary(names, batch_sizes=(1, 32), iters=3, out=sys.stdout):
    """Print (and return) parameters, GMACs per 224x224 image and forward images/s for each model."""
    header = f"{'model':<22}{'params':>14}{'GMACs':>8}" + "".join(f"{f'img/s bs{b}':>13}" for b in batch_sizes)
    print(header, file=out, flush=True)
    rows = []
    for name in names:
        net = get_model(name)
        net.initialize()
        params = trainable_parameters(net)
        macs = count_macs(net)
        net.hybridize(static_alloc=True, static_shape=True)
        speeds = [measure_forward(net, b, iters=iters) for b in batch_sizes]
        rows.append({"model": name, "params": params, "gmacs": macs / 1e9,
                     "images_per_s": dict(zip(batch_sizes, speeds))})
        print(f"{name:<22}{params:>14,}{macs / 1e9:>8.2f}" + "".join(f"{s:>13.1f}" for s in speeds),
              file=out, flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description="List the models, or print their summary table")
    parser.add_argument("--summary", action="store_true",
                        help="parameters, GMACs per 224x224 image and forward images/s (batch 1 and 32)")
    parser.add_argument("--models", default=None, help="comma-separated model names (default: all)")
    parser.add_argument("--iters", type=int, default=3, help="timed forward passes per batch size")
    parser.add_argument("--batch-sizes", default="1,32", help="comma-separated batch sizes to time")
    args = parser.parse_args(argv)
    names = args.models.split(",") if args.models else list_models()
    unknown = [n for n in names if n not in list_models()]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from: {', '.join(list_models())}")
    if not args.summary:
        print("\n".join(names))
        return
    try:
        batch_sizes = tuple(int(b) for b in args.batch_sizes.split(","))
    except ValueError:
        parser.error(f"--batch-sizes must be integers separated by commas, got {args.batch_sizes!r}")
    print(f"# forward images/s on this machine ({os.cpu_count()} CPUs), float32, {args.iters} timed batches",
          flush=True)
    summary(names, batch_sizes, args.iters)


if __name__ == "__main__":
    main()
