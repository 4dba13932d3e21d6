"""The Model flags: ModelConfig, their argparse group, and the names they stand for (the original kit's
--arch/--num-layers/--num-groups, or --model). The network they build is models.py's."""
import dataclasses

from rn50kit.config.cli import config_defaults, config_from

# depth -> (block kind, units per stage, channels: stem output then each stage's output)
RESNET_SPEC = {
    18: ("basic", [2, 2, 2, 2], [64, 64, 128, 256, 512]),
    34: ("basic", [3, 4, 6, 3], [64, 64, 128, 256, 512]),
    50: ("bottleneck", [3, 4, 6, 3], [64, 256, 512, 1024, 2048]),
    101: ("bottleneck", [3, 4, 23, 3], [64, 256, 512, 1024, 2048]),
    152: ("bottleneck", [3, 8, 36, 3], [64, 256, 512, 1024, 2048]),
}
# The original kit's --arch values: (family, version)
ARCHS = {"resnetv1": ("resnet", "1"), "resnetv15": ("resnet", "1.5"),
         "resnextv1": ("resnext", "1"), "resnextv15": ("resnext", "1.5")}
DTYPES = ("float32", "float16", "bfloat16")
LAYOUTS = ("NCHW", "NHWC")
RESNEXT_WIDTH = 4  # channels per group in the first stage (the "4d" of 32x4d)


def model_name(arch, num_layers, num_groups=32):
    """Map the original kit's ``--arch/--num-layers/--num-groups`` to a model name."""
    family, version = ARCHS[arch]
    if family == "resnet":
        return f"resnet{num_layers}_v{version}"
    suffix = "_v1" if version == "1" else ""
    return f"resnext{num_layers}_{num_groups}x{RESNEXT_WIDTH}d{suffix}"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The network: the Model flags' values (their defaults are these)."""
    arch: str = "resnetv15"
    num_layers: int = 50
    num_groups: int = 32
    model: str = None
    num_classes: int = 1000
    batchnorm_eps: float = 1e-5
    batchnorm_mom: float = 0.9
    zero_init_last_gamma: bool = True
    conv_layout: str = "NCHW"
    batchnorm_layout: str = None
    pooling_layout: str = None
    fuse_bn_relu: int = 0
    fuse_bn_add_relu: int = 0
    drop_path: float = 0.0

    @property
    def name(self):
        """``--model NAME``, else the name the original kit's ``--arch/--num-layers/--num-groups`` stand for."""
        return self.model or model_name(self.arch, self.num_layers, self.num_groups)


def add_model_args(parser):
    group = parser.add_argument_group("Model")
    group.add_argument("--arch", choices=sorted(ARCHS), help="model architecture")
    group.add_argument("--num-layers", type=int, choices=sorted(RESNET_SPEC), help="number of layers in the network")
    group.add_argument("--num-groups", type=int, help="ResNeXt cardinality (groups of 4 channels)")
    group.add_argument("--model", help="a model by name instead of --arch/--num-layers/--num-groups "
                       "(python models.py lists them)")
    group.add_argument("--num-classes", type=int, help="number of classes")
    group.add_argument("--batchnorm-eps", type=float, help="BatchNorm epsilon")
    group.add_argument("--batchnorm-mom", type=float, help="BatchNorm momentum")
    group.add_argument("--no-zero-init-last-gamma", dest="zero_init_last_gamma", action="store_false",
                       help="initialise the last BatchNorm gamma of each residual block to 1 instead of 0")
    group.add_argument("--conv-layout", choices=LAYOUTS,
                       help="layout the network computes in (NHWC: float16 on GPU); one transpose at the input "
                       "when it differs from --input-layout")
    group.add_argument("--batchnorm-layout", choices=LAYOUTS,
                       help="accepted for the original kit's command lines; must equal --conv-layout")
    group.add_argument("--pooling-layout", choices=LAYOUTS,
                       help="accepted for the original kit's command lines; must equal --conv-layout")
    group.add_argument("--fuse-bn-relu", type=int, choices=[0, 1],
                       help="fused BatchNorm+ReLU where this MXNet has it: NVIDIA's builds (GPUs; on by default "
                       "for float16 NHWC there), upstream's nn.BatchNormReLU (CPU, oneDNN, NCHW only); plain ops "
                       "otherwise")
    group.add_argument("--fuse-bn-add-relu", type=int, choices=[0, 1],
                       help="fused BatchNorm+add+ReLU where this MXNet has it (NVIDIA's builds; on by default for "
                       "float16 NHWC on GPUs there), plain ops otherwise")
    group.add_argument("--drop-path", type=float,
                       help="stochastic depth: the largest chance a residual branch is dropped in training (the last "
                            "block's, rising linearly from 0 at the first); 0 = off. Scoring builds the network "
                            "without it")
    parser.set_defaults(**config_defaults(ModelConfig))
    return group


def model_name_from_args(args):
    """The model name of parsed flags (a Namespace, for the tools and tests that parse flags themselves)."""
    return config_from(ModelConfig, args).name
