"""Export a kit checkpoint's weights to PyTorch: torchvision's ResNet state-dict names in a .safetensors file.

    python tools/export_weights.py runs/demo/model-best.params resnet18_demo.safetensors

In PyTorch: ``model = torchvision.models.resnet18(num_classes=N);
model.load_state_dict(safetensors.torch.load_file(FILE))`` (timm's resnet/resnext models take the same names). A v1
network (stride in the first 1x1) prints the line that moves torchvision's stride there. The stride placement comes
from the checkpoint's -symbol.json or .state.json; --version gives it for a bare .params file.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rn50kit.common import supported  # loads on the Pythons it refuses

if __name__ == "__main__":
    supported.require_supported_python("export_weights")  # before the imports a Python it refuses could fail on


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a kit .params checkpoint (or any file --pretrained reads)")
    parser.add_argument("out", help="the .safetensors file to write")
    parser.add_argument("--version", choices=("1", "1.5"),
                        help="where the bottlenecks stride, when the checkpoint does not record it: 1.5 (the 3x3, "
                             "torchvision's) or 1 (the first 1x1)")
    args = parser.parse_args(argv)
    if not args.out.endswith(".safetensors"):
        parser.error(f"{args.out}: the output is a .safetensors file")
    from rn50kit.weights import export, pretrained
    try:
        architecture = export.export(args.checkpoint, args.out, args.version)
    except (pretrained.PretrainedError, export.ExportError) as error:
        sys.exit(f"error: {error}")
    print(f"Wrote {args.out}: {architecture.describe('kit')} in torchvision's names "
          f"(torchvision.models.{architecture.family_name()}(num_classes={architecture.num_classes}))")
    fix = export.stride_fix_for_torch(architecture)
    if fix:
        print(f"v1 network: torchvision strides in the 3x3; after loading, move the stride: {fix}")


if __name__ == "__main__":
    main()
