"""tools/export_weights.py (rn50kit/weights/export.py) on the light networks: a kit checkpoint exported to
torchvision's names gives the kit's logits through the independent numpy ResNet on torchvision's names
(tests/resnet_reference.py), and importing the export back (--pretrained) gives its arrays bit for bit; a bare
.params file needs --version. The deep networks and ResNeXt: e2e/test_weights_to_pytorch.py."""
import pytest
from safetensors.numpy import load_file

import export_weights
from conftest import (X, assert_logits, export_and_check_logits, export_and_check_round_trip, exported_checkpoint,
                      logits, trained_like)
import resnet_reference as ref


def test_a_basic_block_network_gives_the_kits_logits(tmp_path):
    export_and_check_logits("resnet18_v1.5", tmp_path)


def test_importing_the_export_back_gives_the_same_arrays_bit_for_bit(tmp_path):
    export_and_check_round_trip("resnet18_v1", None, tmp_path)


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
