"""Benchmark (not a test): ResNet-50 v1.5 images/s on this CPU, ours beside a reference measured in the same run.

Ours: float32 inference (plain and with oneDNN's conv+BN+ReLU fusion), bfloat16 inference (MXNet AMP), and a
float32 training step (forward, backward, SGD update) on synthetic data. Reference: PyTorch's ResNet-50 v1.5
in channels_last when PyTorch is installed, otherwise Gluon's model-zoo resnet50_v1. Prints a table and, with
--json, writes the numbers. Timings are noisy on a shared machine: compare the ratios of one run.

    python tools/bench_models.py --batch-size 16 --iters 5
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mxnet as mx  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402

import models  # noqa: E402


def timed(step, batch_size, iters, warmup):
    for _ in range(warmup):
        step()
    start = time.perf_counter()
    for _ in range(iters):
        step()
    return batch_size * iters / (time.perf_counter() - start)


def mxnet_inference(net, data):
    return lambda: net(data).wait_to_read()


def mxnet_training(net, data, label):
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9, "wd": 1e-5})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def step():
        with autograd.record():
            loss = loss_fn(net(data), label)
        loss.backward()
        trainer.step(data.shape[0])
        loss.wait_to_read()
        mx.nd.waitall()
    return step


def ours(name, batch_size):
    data = mx.nd.random.uniform(shape=(batch_size, 3, 224, 224))
    label = mx.nd.array(list(range(batch_size)))
    results = {}
    net = models.get_model(name)
    net.initialize()
    net.hybridize(static_alloc=True, static_shape=True)
    results["ours float32 inference"] = mxnet_inference(net, data)
    results["ours float32 training step"] = mxnet_training(net, data, label)
    fused = models.optimize_for_inference(net, data.shape)
    results["ours float32 inference (oneDNN fused)"] = mxnet_inference(fused, data)
    bf16 = models.to_bfloat16(net, data.shape)
    results["ours bfloat16 inference"] = mxnet_inference(bf16, data)
    return results


def gluon_zoo(batch_size):
    data = mx.nd.random.uniform(shape=(batch_size, 3, 224, 224))
    label = mx.nd.array(list(range(batch_size)))
    net = gluon.model_zoo.vision.resnet50_v1()
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True, static_shape=True)
    return {"model-zoo resnet50_v1 float32 inference": mxnet_inference(net, data),
            "model-zoo resnet50_v1 float32 training step": mxnet_training(net, data, label)}


def torch_resnet50(torch):
    """ResNet-50 v1.5 in plain PyTorch (torchvision's layout: stride on the 3x3 convolution)."""
    nn = torch.nn

    class Bottleneck(nn.Module):
        def __init__(self, in_ch, width, stride):
            super().__init__()
            out_ch = width * 4
            self.body = nn.Sequential(
                nn.Conv2d(in_ch, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, out_ch, 1, bias=False), nn.BatchNorm2d(out_ch))
            self.down = None
            if stride != 1 or in_ch != out_ch:
                self.down = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride, bias=False), nn.BatchNorm2d(out_ch))

        def forward(self, x):
            return torch.relu(self.body(x) + (x if self.down is None else self.down(x)))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
              nn.MaxPool2d(3, 2, 1)]
    in_ch = 64
    for stage, units in enumerate([3, 4, 6, 3]):
        width = 64 * 2 ** stage
        for unit in range(units):
            layers.append(Bottleneck(in_ch, width, 2 if stage > 0 and unit == 0 else 1))
            in_ch = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000)]
    return nn.Sequential(*layers)


def pytorch(batch_size):
    import torch
    net = torch_resnet50(torch).to(memory_format=torch.channels_last)
    data = torch.rand(batch_size, 3, 224, 224).to(memory_format=torch.channels_last)
    label = torch.arange(batch_size) % 1000
    def inference():
        net.eval()
        with torch.no_grad():
            net(data)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-5)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        net.train()
        optimizer.zero_grad(set_to_none=True)
        loss_fn(net(data), label).backward()
        optimizer.step()
    return {f"PyTorch {torch.__version__} channels_last float32 inference": inference,
            f"PyTorch {torch.__version__} channels_last float32 training step": step}


def main(argv=None):
    from helptext import HelpFormatter
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    parser.add_argument("--model", default="resnet50_v1.5", choices=models.list_models(), help="our model")
    parser.add_argument("--batch-size", type=int, default=16, help="images per batch")
    parser.add_argument("--iters", type=int, default=5, help="timed batches per measurement")
    parser.add_argument("--warmup", type=int, default=2, help="untimed batches before each measurement")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds; the best of each is kept")
    parser.add_argument("--reference", default="auto", choices=["auto", "pytorch", "gluon-zoo", "none"],
                        help="what to measure beside ours (auto: PyTorch if installed, else the model zoo)")
    parser.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    args = parser.parse_args(argv)
    if args.batch_size < 1 or args.iters < 1 or args.warmup < 0 or args.rounds < 1:
        parser.error("--batch-size, --iters and --rounds must be positive, --warmup not negative")
    reference = args.reference
    if reference == "auto":
        try:
            import torch  # noqa: F401
            reference = "pytorch"
        except ImportError:
            reference = "gluon-zoo"
    steps = {}
    if reference == "pytorch":
        steps.update(pytorch(args.batch_size))
    elif reference == "gluon-zoo":
        steps.update(gluon_zoo(args.batch_size))
    steps.update(ours(args.model, args.batch_size))
    # Interleaved rounds, best round kept: load from other processes hits every variant alike.
    results = {key: 0.0 for key in steps}
    for _ in range(args.rounds):
        for key, step in steps.items():
            results[key] = max(results[key], timed(step, args.batch_size, args.iters, args.warmup))
    ours_fp32 = results["ours float32 inference"]
    print(f"# {args.model}, batch {args.batch_size}, {args.iters} timed batches, {os.cpu_count()} CPUs "
          f"(images/s; noisy on a shared machine)")
    for key, value in results.items():
        print(f"{key:<60}{value:>8.2f}")
    print(f"{'bfloat16 / float32 inference (ours)':<60}{results['ours bfloat16 inference'] / ours_fp32:>8.2f}x")
    if args.json:
        with open(args.json + ".tmp", "w") as out:
            json.dump({"model": args.model, "batch_size": args.batch_size, "images_per_s": results}, out, indent=2)
        os.replace(args.json + ".tmp", args.json)


if __name__ == "__main__":
    main()
