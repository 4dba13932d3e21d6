"""tools/export_weights.py on every depth and stride placement the importer knows (the heavier cases; the light
ones are in unit/test_export_weights.py): the export gives the kit's logits through the independent numpy ResNet
on torchvision's names, and importing it back gives the checkpoint's arrays bit for bit, a network with the other
stride placement refusing it; a bare .params file needs --version."""
import export_weights
import pytest
from safetensors.numpy import load_file

from support import resnet_reference as ref
from support.weights import (
    X,
    assert_logits,
    export_and_check_logits,
    export_and_check_round_trip,
    exported_checkpoint,
    logits,
    trained_like,
)

pytestmark = pytest.mark.slow  # full-size networks in process


@pytest.mark.parametrize("name", ["resnet50_v1.5", "resnet50_v1", "resnext50_32x4d"])
def test_the_export_gives_the_kits_logits_through_the_reference_resnet(name, tmp_path):
    export_and_check_logits(name, tmp_path)


# each network and the same one with the other stride placement (basic blocks and resnext50: none)
@pytest.mark.parametrize("name,other", [("resnet34_v1.5", None), ("resnet50_v1", "resnet50_v1.5"),
                                        ("resnet101_v1.5", "resnet101_v1"), ("resnet152_v1", "resnet152_v1.5"),
                                        ("resnext50_32x4d", None), ("resnext101_32x4d_v1", "resnext101_32x4d")])
def test_importing_the_export_back_gives_the_same_arrays_bit_for_bit(name, other, tmp_path):
    export_and_check_round_trip(name, other, tmp_path)


def test_a_bare_v1_params_file_exports_with_its_stride_given(tmp_path):
    net = trained_like("resnet50_v1")
    bare = tmp_path / "weights.params"  # a checkpoint's parameters copied alone: no -symbol.json or state beside
    bare.write_bytes(exported_checkpoint(net, tmp_path).read_bytes())
    out = tmp_path / "out.safetensors"
    with pytest.raises(SystemExit) as refused:
        export_weights.main([str(bare), str(out)])
    assert "give --version 1.5" in str(refused.value) and "\n" not in str(refused.value)
    export_weights.main([str(bare), str(out), "--version", "1"])
    assert_logits(logits(net), ref.forward(load_file(str(out)), X, stride_in_1x1=True))
