"""pretrained: published weights, in each source's exact names and layout, give the kit's network the logits of an
independent reference forward pass (support/resnet_reference.py, numpy, torchvision's semantics) on fixed inputs.
The 50-layer sources (a second or more each) are e2e/test_pretrained_resnet50.py's."""
import argparse
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

import models
from rn50kit.config import finetune_flags
from rn50kit.weights import pretrained
from rn50kit.weights.architecture import Architecture, network_architecture
from support import resnet_reference as ref
from support.weights import X, assert_logits, kit_net, load, logits, refusal


def save_params(weights, path):
    mx.nd.save(str(path), {k: mx.nd.array(v) for k, v in weights.items()})
    return path


def test_wrapper_prefix_and_bfloat16_safetensors(tv18, tmp_path):
    """DistributedDataParallel's ``module.`` prefix is dropped; bfloat16 tensors (which numpy cannot hold) are
    decoded from the file's bytes: the logits are those of the bfloat16-rounded weights."""
    import json
    import struct
    rounded = {}
    header, blobs, offset = {}, [], 0
    for key, value in tv18.sd.items():
        if value.dtype == np.float32:
            bits = (value.view(np.uint32) + 0x8000) >> 16  # round to the nearest bfloat16
            rounded[key] = (bits << 16).astype(np.uint32).view(np.float32)
            blob, dtype = bits.astype("<u2").tobytes(), "BF16"
        else:
            rounded[key], blob, dtype = value, value.astype("<i8").tobytes(), "I64"
        header["module." + key] = {"dtype": dtype, "shape": list(value.shape), "data_offsets": [offset,
                                                                                               offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    path = tmp_path / "bf16.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    net, info = load("resnet18_v1.5", path, 7)
    assert_logits(logits(net), ref.forward(rounded, X))
    assert info.params_loaded == info.params_total


def test_gluoncv_resnet18_v1_structural_names(tv18, tmp_path):
    path = save_params(ref.to_gluoncv_features(tv18.sd), tmp_path / "resnet18_v1.params")
    net, info = load("resnet18_v1", path, 7)
    assert_logits(logits(net), tv18.expected)


def test_other_depth_is_refused_in_one_line(tv18):
    assert refusal("resnet50_v1.5", tv18.path(".safetensors")) == (
        "resnet18.safetensors holds a torchvision/timm resnet18 (7 classes); this run builds resnet50_v1.5: "
        "give --num-layers 18 (or --model resnet18_v1.5)")


def test_wide_resnet_is_named_and_refused():
    """torchvision's wide_resnet50_2: bottleneck width 128 for 256 outputs (the kit builds width 64)."""
    arch = Architecture(kind="bottleneck", units=(3, 4, 6, 3), groups=1, width=128,
                        out_channels=(64, 256, 512, 1024, 2048), version="1.5", num_classes=1000)
    assert arch.family_name() == "wide_resnet50_2" and arch.kit_name() is None
    net = kit_net("resnet50_v1.5", 10)
    message = str(pretrained._refusal("w.safetensors", arch, "torchvision/timm",
                                      network_architecture(net), "resnet50_v1.5"))
    assert message == ("w.safetensors holds a torchvision/timm wide_resnet50_2 (v1.5: stride in the 3x3 "
                       "convolutions, 1000 classes); this run builds resnet50_v1.5: the kit builds no such network "
                       "(python models.py lists what it builds)")


def test_pth_without_pytorch_says_how_to_convert(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # as on a machine without PyTorch: `import torch` fails
    path = tmp_path / "resnet18.pth"
    path.write_bytes(b"not read")
    message = refusal("resnet18_v1.5", path)
    assert "PyTorch is not installed" in message and "safetensors" in message and "pip install torch" in message


def test_unknown_extension_and_missing_file(tmp_path):
    path = tmp_path / "weights.npz"
    path.write_bytes(b"")
    assert "unknown format" in refusal("resnet18_v1.5", path)
    assert "does not exist" in refusal("resnet18_v1.5", tmp_path / "missing.safetensors")


@pytest.mark.parametrize("channels", [3, 4])
def test_four_channel_stem_gives_the_same_logits(tv18, channels):
    net, info = load("resnet18_v1.5", tv18.path(".safetensors"), 7, in_channels=channels)
    x = np.concatenate([X, np.zeros_like(X[:, :1])], axis=1) if channels == 4 else X  # 4th channel: zero padding
    assert_logits(logits(net, x), tv18.expected)
    assert any("padded from 3 to 4" in note for note in info.notes) == (channels == 4)


def test_every_device_gets_the_weights(tv18):
    """A network initialised on several devices gets the same values on each (Trainer needs them equal)."""
    ctxs = [mx.cpu(0), mx.cpu(1)]
    net = models.get_model("resnet18_v1.5", num_classes=7)
    net.initialize(ctx=ctxs)
    pretrained.load_pretrained(net, str(tv18.path(".safetensors")), ctxs, 7)
    for name in ("conv0_weight", "stage4_unit2_bn2_running_var", "fc1_bias"):
        copies = net.collect_params()[name].list_data()
        assert [c.context for c in copies] == ctxs
        for copy in copies:
            np.testing.assert_array_equal(copy.asnumpy(), net.collect_params()[name].data(ctxs[0]).asnumpy())
    assert_logits(net(mx.nd.array(X, ctx=ctxs[1])).asnumpy(), tv18.expected)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_reduced_precision_targets_load(tv18, dtype):
    """float16 networks get float16 weights (BatchNorm float32); bfloat16 networks keep float32 for MXNet's AMP."""
    net, info = load("resnet18_v1.5", tv18.path(".safetensors"), 7, dtype=dtype)
    params = net.collect_params()
    weight_dtype = np.float16 if dtype == "float16" else np.float32
    assert params["stage2_unit1_conv1_weight"].data().dtype == weight_dtype
    assert params["stage2_unit1_bn1_running_var"].data().dtype == np.float32
    np.testing.assert_array_equal(params["stage2_unit1_conv1_weight"].data().asnumpy(),
                                  tv18.sd["layer2.0.conv1.weight"].astype(weight_dtype))
    np.testing.assert_array_equal(params["fc1_weight"].data().asnumpy(), tv18.sd["fc.weight"].astype(weight_dtype))
    assert any("cast to float16" in note for note in info.notes) == (dtype == "float16")


# ---------------------------------------------------------------------------------------------------------
# fine-tuning options

def test_pretrained_flags():
    parser = argparse.ArgumentParser()
    finetune_flags.add_pretrained_args(parser)
    args = parser.parse_args([])
    assert (args.pretrained, args.backbone_lr_mult, args.freeze_backbone_epochs) == (None, 1.0, 0)
    args = parser.parse_args(["--backbone-lr-mult", "0.1", "--freeze-backbone-epochs", "2"])
    assert [pretrained.backbone_lr_mult(e, args.backbone_lr_mult, args.freeze_backbone_epochs)
            for e in range(4)] == [0.0, 0.0, 0.1, 0.1]
    with pytest.raises(ValueError, match="--backbone-lr-mult"):
        finetune_flags.check_pretrained_args(parser.parse_args(["--backbone-lr-mult", "-1"]))
    with pytest.raises(ValueError, match="--pretrained nowhere.safetensors does not exist"):
        finetune_flags.check_pretrained_args(parser.parse_args(["--pretrained", "nowhere.safetensors"]))


def test_backbone_lr_mult_freezes_then_releases_the_backbone(tv18):
    """lr_mult 0 leaves every backbone weight exactly as loaded (SGD with momentum and weight decay, as the kit
    trains) while the head learns; set back, the backbone learns too."""
    net, _ = load("resnet18_v1.5", tv18.path(".safetensors"), 7)
    params = net.collect_params()
    trainer = gluon.Trainer(params, "sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    trained = [name for name, p in params.items() if p.grad_req != "null"]

    def step():
        before = {name: params[name].data().asnumpy().copy() for name in trained}
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(X)), mx.nd.array([1, 3]))
        loss.backward()
        trainer.step(2)
        return {name for name in trained if not np.array_equal(params[name].data().asnumpy(), before[name])}

    assert pretrained.set_backbone_lr_mult(net, 0.0) == len(list(params.keys())) - 2
    for _ in range(2):
        assert step() == {"fc1_weight", "fc1_bias"}
    pretrained.set_backbone_lr_mult(net, 0.5)
    changed = step()
    assert {"fc1_weight", "conv0_weight", "stage4_unit2_conv2_weight"} <= changed
