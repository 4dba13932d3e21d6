"""--val-tta flip (scoring.FlipTTA): validation's top-1/top-5/loss, over one device or two, and --mode pred's
probabilities equal averaging by hand, in numpy, the softmax of two plain scorings: one of the images, one of
their mirrors; the training loop's validation scores so when asked."""
import json

import mxnet as mx
import numpy as np
import pytest

import fit
from rn50kit.scoring import predict, scoring
from rn50kit.training.distributed import Distributed
from support.loop import CPU, MICRO, RUN, TINY_CLASSES, AccumBatches, fit_config, tiny_accum_net
from support.weights import kit_net

CLASSES = 10


def softmax(logits):
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def by_hand(net, images, labels, width_axis):
    """Top-1, top-5 and mean cross-entropy of the mean of two plain scorings' softmax (images, mirrored images)."""
    plain = net(mx.nd.array(images)).asnumpy()
    mirrored = net(mx.nd.array(np.flip(images, axis=width_axis).copy())).asnumpy()
    probs = (softmax(plain.astype(np.float64)) + softmax(mirrored.astype(np.float64))) / 2
    top5 = np.argsort(-probs, axis=1)[:, :5]
    return {"top1": float(np.mean(top5[:, 0] == labels)), "top5": float(np.mean((top5 == labels[:, None]).any(1))),
            "loss": float(np.mean(-np.log(probs[np.arange(len(labels)), labels.astype(int)])))}


def batches(images, labels, size):
    return [mx.io.DataBatch(data=[mx.nd.array(images[i:i + size])], label=[mx.nd.array(labels[i:i + size])], pad=0)
            for i in range(0, len(images), size)]


@pytest.mark.parametrize("layout,devices", [("NCHW", 1), ("NHWC", 1), ("NCHW", 2)])
def test_validation_scores_the_mean_of_the_image_and_its_mirror(layout, devices):
    net = kit_net("resnet18_v1.5", CLASSES, input_layout=layout)
    rng = np.random.RandomState(0)
    shape = (24, 3, 32, 32) if layout == "NCHW" else (24, 32, 32, 3)
    images = rng.uniform(-1, 1, shape).astype(np.float32)
    net(mx.nd.array(images[:1]))
    # labels the network half gets right, so top-1 is neither 0 nor 1
    labels = np.where(np.arange(24) % 2, net(mx.nd.array(images)).asnumpy().argmax(1), rng.randint(0, CLASSES, 24))
    labels = labels.astype(np.float32)
    ctxs = [mx.cpu(i) for i in range(devices)]
    if devices > 1:
        net.collect_params().reset_ctx(ctxs)
    metrics = scoring.evaluate(scoring.with_tta(net, "flip"), batches(images, labels, 8), ctxs, Distributed(None))
    expected = by_hand(net, images, labels, 3 if layout == "NCHW" else 2)
    assert 0 < expected["top1"] < 1
    assert metrics["samples"] == 24
    for key in ("top1", "top5"):
        assert metrics[key] == expected[key], key
    np.testing.assert_allclose(metrics["loss"], expected["loss"], rtol=1e-5)
    plain = scoring.evaluate(net, batches(images, labels, 8), ctxs, Distributed(None))
    assert plain["loss"] != pytest.approx(metrics["loss"], rel=1e-4)  # the mirror changes the scores


def test_prediction_gives_the_averaged_probabilities(tmp_path):
    import cv2

    from rn50kit.config import train_config
    net = kit_net("resnet18_v1.5", CLASSES)
    image = tmp_path / "photo.png"
    cv2.imwrite(str(image), np.random.RandomState(1).randint(0, 255, (40, 56, 3), dtype=np.uint8))
    cfg = train_config.RunConfig().replace(data__image_shape=(3, 32, 32), data__data_val_resize=36,
                                           model__num_classes=CLASSES, fit__dtype="float32", fit__val_tta="flip",
                                           predict__data_pred=str(image), predict__pred_top_k=CLASSES)
    top = scoring.predict_image(cfg, scoring.Scorable(net), CPU)
    loaded = predict.load_image(str(image), (3, 32, 32), 36, cfg.data.rgb_mean, cfg.data.rgb_std, "NCHW")
    expected = (softmax(net(mx.nd.array(loaded)).asnumpy()) +
                softmax(net(mx.nd.array(loaded[..., ::-1].copy())).asnumpy()))[0] / 2
    np.testing.assert_allclose([p for p, _, _ in top], np.sort(expected)[::-1], rtol=1e-5)
    assert [index for _, index, _ in top] == list(np.argsort(-expected, kind="stable"))


def test_the_training_loops_validation_scores_with_the_mirror(tmp_path, keep_signal_handlers):
    cfg = fit_config(tmp_path, MICRO, 1, "--num-epochs", "1", "--ema-decay", "0", "--val-tta", "flip")
    net = tiny_accum_net(tmp_path / "init.params")
    val = AccumBatches(MICRO, 3, seed=1)
    fit.fit(cfg, RUN, net, lambda epoch: AccumBatches(MICRO, 3), val, CPU, Distributed(None), TINY_CLASSES)
    images = np.concatenate([b[0] for b in val.batches])
    labels = np.concatenate([b[1] for b in val.batches])
    metrics = json.load(open(tmp_path / "report.json"))["metrics"]
    expected = by_hand(net, images, labels, 3)
    assert metrics["val.top1"] == [expected["top1"]] and metrics["val.top5"] == [expected["top5"]]
    np.testing.assert_allclose(metrics["val.loss"], [expected["loss"]], rtol=1e-5)
