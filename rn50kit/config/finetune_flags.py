"""The Fine-tuning flags: FinetuneConfig, their argparse group and the check of their values; the loading of the
weights they name is rn50kit/weights'."""
import dataclasses
import os

from rn50kit.config.cli import config_defaults


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
