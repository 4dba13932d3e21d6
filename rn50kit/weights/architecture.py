"""What a set of ResNet weights, or a built network, is: block kind, units per stage, groups and widths, stride
placement; the kit's name for it and the ecosystem's."""
import dataclasses
import re

import models
from rn50kit.config.model_flags import RESNET_SPEC


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
        for depth, (kind, units, channels) in RESNET_SPEC.items():
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


def from_shapes(shapes, version=None):
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
    return from_shapes(shapes, version)
