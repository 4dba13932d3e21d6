"""ResNet v1 / v1.5 family as Gluon HybridBlocks.

v1 puts the stride of a downsampling bottleneck on its first 1x1 convolution, v1.5 on the 3x3 one
(NVIDIA's "ResNet50 v1.5"). Basic blocks (depth 18/34) are the same in both versions.
"""
import argparse

import mxnet as mx
from mxnet.gluon import nn

# depth -> (block kind, units per stage, channels: stem output then each stage's output)
RESNET_SPEC = {
    18: ("basic", [2, 2, 2, 2], [64, 64, 128, 256, 512]),
    34: ("basic", [3, 4, 6, 3], [64, 64, 128, 256, 512]),
    50: ("bottleneck", [3, 4, 6, 3], [64, 256, 512, 1024, 2048]),
    101: ("bottleneck", [3, 4, 23, 3], [64, 256, 512, 1024, 2048]),
    152: ("bottleneck", [3, 8, 36, 3], [64, 256, 512, 1024, 2048]),
}
ARCH_VERSIONS = {"resnetv1": "1", "resnetv15": "1.5"}


def he_normal():
    # He et al. 2015: N(0, 2/fan_in); MXNet spells it Xavier(gaussian, in, magnitude=2).
    return mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2)


class Builder:
    """Holds the choices every layer shares, so blocks never read flags."""

    def __init__(self, bn_eps=1e-5, bn_mom=0.9, zero_init_last_gamma=True):
        self.bn_eps = bn_eps
        self.bn_mom = bn_mom
        self.zero_init_last_gamma = zero_init_last_gamma

    def conv(self, channels, kernel, stride=1, in_channels=0):
        return nn.Conv2D(channels, kernel, strides=stride, padding=kernel // 2, use_bias=False,
                         in_channels=in_channels, weight_initializer=he_normal())

    def batchnorm(self, last=False):
        # Zero gamma on the last BN of a residual branch: every block starts as the identity (Goyal et al.).
        gamma = "zeros" if last and self.zero_init_last_gamma else "ones"
        return nn.BatchNorm(momentum=self.bn_mom, epsilon=self.bn_eps, gamma_initializer=gamma)


class BasicBlock(nn.HybridBlock):
    def __init__(self, builder, channels, stride, in_channels, **kwargs):
        super().__init__(**kwargs)
        self.body = nn.HybridSequential()
        self.body.add(builder.conv(channels, 3, stride, in_channels), builder.batchnorm(), nn.Activation("relu"),
                      builder.conv(channels, 3, 1, channels), builder.batchnorm(last=True))
        self.downsample = None
        if stride != 1 or channels != in_channels:
            self.downsample = nn.HybridSequential()
            self.downsample.add(builder.conv(channels, 1, stride, in_channels), builder.batchnorm())

    def hybrid_forward(self, F, x):
        residual = x if self.downsample is None else self.downsample(x)
        return F.relu(self.body(x) + residual)


class Bottleneck(nn.HybridBlock):
    def __init__(self, builder, channels, stride, in_channels, version="1.5", **kwargs):
        super().__init__(**kwargs)
        mid = channels // 4
        stride_1x1, stride_3x3 = (stride, 1) if version == "1" else (1, stride)
        self.body = nn.HybridSequential()
        self.body.add(builder.conv(mid, 1, stride_1x1, in_channels), builder.batchnorm(), nn.Activation("relu"),
                      builder.conv(mid, 3, stride_3x3, mid), builder.batchnorm(), nn.Activation("relu"),
                      builder.conv(channels, 1, 1, mid), builder.batchnorm(last=True))
        self.downsample = None
        if stride != 1 or channels != in_channels:
            self.downsample = nn.HybridSequential()
            self.downsample.add(builder.conv(channels, 1, stride, in_channels), builder.batchnorm())

    def hybrid_forward(self, F, x):
        residual = x if self.downsample is None else self.downsample(x)
        return F.relu(self.body(x) + residual)


class ResNet(nn.HybridBlock):
    def __init__(self, depth=50, version="1.5", num_classes=1000, builder=None, **kwargs):
        super().__init__(**kwargs)
        if depth not in RESNET_SPEC:
            raise ValueError(f"ResNet depth {depth} is not one of {sorted(RESNET_SPEC)}")
        builder = builder or Builder()
        kind, units, channels = RESNET_SPEC[depth]
        self.features = nn.HybridSequential()
        self.features.add(builder.conv(channels[0], 7, 2), builder.batchnorm(), nn.Activation("relu"),
                          nn.MaxPool2D(3, 2, 1))
        in_channels = channels[0]
        for stage, (num_units, out_channels) in enumerate(zip(units, channels[1:])):
            for unit in range(num_units):
                stride = 2 if stage > 0 and unit == 0 else 1
                if kind == "basic":
                    block = BasicBlock(builder, out_channels, stride, in_channels)
                else:
                    block = Bottleneck(builder, out_channels, stride, in_channels, version)
                self.features.add(block)
                in_channels = out_channels
        self.features.add(nn.GlobalAvgPool2D(), nn.Flatten())
        self.output = nn.Dense(num_classes, in_units=in_channels, weight_initializer=he_normal())

    def hybrid_forward(self, F, x):
        return self.output(self.features(x))


def list_models():
    names = []
    for depth in sorted(RESNET_SPEC):
        names += [f"resnet{depth}_v1", f"resnet{depth}_v1.5"]
    return names


def get_model(name, num_classes=1000, bn_eps=1e-5, bn_mom=0.9, zero_init_last_gamma=True):
    """Build an uninitialised network by name, e.g. ``resnet50_v1.5``."""
    if name not in list_models():
        raise ValueError(f"unknown model '{name}'; choose one of: {', '.join(list_models())}")
    depth, version = name[len("resnet"):].split("_v")
    builder = Builder(bn_eps=bn_eps, bn_mom=bn_mom, zero_init_last_gamma=zero_init_last_gamma)
    return ResNet(int(depth), version, num_classes, builder)


def model_name(arch, num_layers):
    """Map the original kit's ``--arch/--num-layers`` to a model name."""
    return f"resnet{num_layers}_v{ARCH_VERSIONS[arch]}"


def add_model_args(parser):
    group = parser.add_argument_group("Model")
    group.add_argument("--arch", default="resnetv15", choices=sorted(ARCH_VERSIONS),
                       help="model architecture")
    group.add_argument("--num-layers", type=int, default=50, choices=sorted(RESNET_SPEC),
                       help="number of layers in the network")
    group.add_argument("--num-classes", type=int, default=1000, help="number of classes")
    group.add_argument("--batchnorm-eps", type=float, default=1e-5, help="BatchNorm epsilon")
    group.add_argument("--batchnorm-mom", type=float, default=0.9, help="BatchNorm momentum")
    group.add_argument("--no-zero-init-last-gamma", dest="zero_init_last_gamma", action="store_false",
                       help="initialise the last BatchNorm gamma of each residual block to 1 instead of 0")
    return group


def get_model_from_args(args):
    return get_model(model_name(args.arch, args.num_layers), num_classes=args.num_classes,
                     bn_eps=args.batchnorm_eps, bn_mom=args.batchnorm_mom,
                     zero_init_last_gamma=args.zero_init_last_gamma)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="List the available models")
    parser.parse_args()
    print("\n".join(list_models()))
