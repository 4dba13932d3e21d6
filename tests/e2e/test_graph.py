"""rn50kit/graph: a network's files (export and back, float16 and float32, NCHW and NHWC, 3 and 4 input channels),
AMP's casts left out of the saved graph, and the inference graphs (oneDNN's fusions, bfloat16 rounding)."""
import json
import os

import mxnet as mx
import numpy as np

import models
from rn50kit.graph.batchnorm_fold import round_to_bfloat16
from rn50kit.graph.inference import optimize_for_inference
from rn50kit.graph.symbol_files import export, load_checkpoint, without_amp_casts
from support.networks import small_net


def test_export_import_round_trip_and_float16_interchange(tmp_path):
    net = small_net()
    net.hybridize(static_alloc=True, static_shape=True)
    x = mx.nd.random.uniform(-1, 1, shape=(2, 3, 32, 32))
    expected = net(x).asnumpy()
    prefix = str(tmp_path / "model")
    export(net, prefix, epoch=3)
    np.testing.assert_array_equal(load_checkpoint(prefix, 3)(x).asnumpy(), expected)
    again = models.get_model("resnet18_v1.5", num_classes=10, pretrained=f"{prefix}-0003.params")
    np.testing.assert_array_equal(again(x).asnumpy(), expected)

    # float16 checkpoint of the same model: same names, loads into float32 (values rounded to float16)
    half = models.get_model("resnet18_v1.5", num_classes=10, dtype="float16", pretrained=f"{prefix}-0003.params")
    assert np.dtype(half.collect_params()["conv0_weight"].dtype) == np.float16
    assert np.dtype(half.collect_params()["bn0_gamma"].dtype) == np.float32
    half.hybridize()
    half._build_cache(mx.nd.zeros((1, 3, 32, 32), dtype="float16"))  # trace only: no float16 conv on CPU
    half.export(str(tmp_path / "half"), epoch=3)
    sym32, sym16 = mx.sym.load(f"{prefix}-symbol.json"), mx.sym.load(str(tmp_path / "half-symbol.json"))
    assert sym16.list_arguments() == sym32.list_arguments()
    assert sym16.list_auxiliary_states() == sym32.list_auxiliary_states()
    saved16 = mx.nd.load(str(tmp_path / "half-0003.params"))
    assert set(saved16) == set(mx.nd.load(f"{prefix}-0003.params"))
    back = models.get_model("resnet18_v1.5", num_classes=10, pretrained=str(tmp_path / "half-0003.params"))
    weight = back.collect_params()["conv0_weight"].data()
    assert weight.dtype == np.float32
    np.testing.assert_array_equal(weight.asnumpy(),
                                  net.collect_params()["conv0_weight"].data().astype("float16").asnumpy())
    np.testing.assert_allclose(back(x).asnumpy(), expected, rtol=0.02, atol=0.02 * np.abs(expected).max())


def test_input_and_compute_layouts(tmp_path):
    nhwc = models.get_model("resnet50_v1.5", layout="NHWC", input_layout="NCHW")
    sym = nhwc(mx.sym.var("data")).tojson()
    assert sym.count('"transpose"') == 1  # one transpose at the input, none per layer
    assert models.get_model("resnet50_v1.5", layout="NHWC", input_layout="NHWC")(
        mx.sym.var("data")).tojson().count('"transpose"') == 0
    # NCHW checkpoint -> NHWC network -> NCHW network keeps every value (conv weights OIHW <-> OHWI)
    net = small_net()
    net.hybridize()
    x = mx.nd.random.uniform(shape=(1, 3, 32, 32))
    expected = net(x).asnumpy()
    export(net, str(tmp_path / "nchw"), 0)
    turned = models.get_model("resnet18_v1.5", num_classes=10, layout="NHWC",
                              pretrained=str(tmp_path / "nchw-0000.params"))
    assert turned.collect_params()["conv0_weight"].shape == (64, 7, 7, 3)
    turned.collect_params().save(str(tmp_path / "nhwc.params"))  # by parameter name
    back = models.get_model("resnet18_v1.5", num_classes=10, pretrained=str(tmp_path / "nhwc.params"))
    np.testing.assert_array_equal(back(x).asnumpy(), expected)


def test_four_channel_input():
    net = small_net()
    x = mx.nd.random.uniform(shape=(2, 3, 32, 32))
    expected = net(x).asnumpy()
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"rn-4ch-{os.getpid()}.params")
    net.save_parameters(path)
    try:
        four = models.get_model("resnet18_v1.5", num_classes=10, in_channels=4, pretrained=path)
    finally:
        os.remove(path)
    x4 = mx.nd.concat(x, mx.nd.zeros((2, 1, 32, 32)), dim=1)  # the zero padding channel
    np.testing.assert_allclose(four(x4).asnumpy(), expected, rtol=1e-5, atol=1e-5)


def test_round_to_bfloat16_is_nearest_even():
    """Against a float64 re-computation: of the two bfloat16 values around x (its upper 16 bits, and one step
    away from zero), the nearer; on a tie, the one whose last kept bit is 0."""
    rng = np.random.RandomState(3)
    values = np.concatenate([rng.normal(0, 1, 5000), rng.normal(0, 1e-3, 1000), [0.0, -0.0, 1.0, -2.5]])
    values = values.astype(np.float32)
    bits = values.view(np.uint32)
    halfway = (bits & 0xFFFF0000) | 0x8000  # exact ties, both parities of the kept bits
    values = np.concatenate([values, halfway.astype(np.uint32).view(np.float32)])
    got = round_to_bfloat16(values)
    bits = values.view(np.uint32)
    low = (bits & 0xFFFF0000).astype(np.uint32)
    high = (low + 0x10000).astype(np.uint32)
    low_f, high_f = low.view(np.float32).astype(np.float64), high.view(np.float32).astype(np.float64)
    x = values.astype(np.float64)
    d_low, d_high = np.abs(x - low_f), np.abs(high_f - x)
    even_low = ((low >> 16) & 1) == 0
    expected = np.where(d_low < d_high, low_f, np.where(d_high < d_low, high_f, np.where(even_low, low_f, high_f)))
    np.testing.assert_array_equal(got.astype(np.float64), expected)
    assert (got.view(np.uint32) & 0xFFFF == 0).all()


def test_onednn_fused_inference_matches():
    net = small_net("resnet50_v1.5")
    net.hybridize()
    x = mx.nd.random.uniform(shape=(2, 3, 32, 32))
    expected = net(x).asnumpy()
    fused = optimize_for_inference(net, x.shape)
    np.testing.assert_allclose(fused(x).asnumpy(), expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_without_amp_casts_gives_what_mxnet_saves():
    """The graph export saves is MXNet's own tojson() of it: AMP's casts gone, nothing else changed."""
    data = mx.sym.var("data")
    symbol = mx.sym.relu(mx.sym.FullyConnected(mx.sym.amp_cast(data, dtype="float16"), num_hidden=4, name="fc"))

    def ops(text):
        return [node["op"] for node in json.loads(text)["nodes"] if node["op"] != "null"]
    assert ops(symbol.tojson(remove_amp_cast=False)) == ["amp_cast", "FullyConnected", "relu"]
    cleaned = without_amp_casts(symbol).tojson(remove_amp_cast=False)
    assert cleaned == symbol.tojson() and ops(cleaned) == ["FullyConnected", "relu"]
