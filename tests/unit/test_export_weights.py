"""tools/export_weights.py (rn50kit/weights/export.py) on the light networks: a kit checkpoint exported to
torchvision's names gives the kit's logits through the independent numpy ResNet on torchvision's names
(tests/resnet_reference.py), and importing the export back (--pretrained) gives its arrays bit for bit. The deep
networks, ResNeXt and a bare .params file (it needs --version): e2e/test_weights_to_pytorch.py."""
from support.weights import export_and_check_logits, export_and_check_round_trip


def test_a_basic_block_network_gives_the_kits_logits(tmp_path):
    export_and_check_logits("resnet18_v1.5", tmp_path)


def test_importing_the_export_back_gives_the_same_arrays_bit_for_bit(tmp_path):
    export_and_check_round_trip("resnet18_v1", None, tmp_path)
