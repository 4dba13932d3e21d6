"""PyTorch's worker's steps: the same ResNet-50 v1.5 in channels_last, float32 and autocast bfloat16, training
step and inference, and its matrix products' ceilings."""
from model_workers.timing import CEILING_SIZE, bfloat16_missing, matmul_rate


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


def torch_steps(batch_size, image_size):
    import contextlib

    import torch
    data = torch.rand(batch_size, 3, image_size, image_size).to(memory_format=torch.channels_last)
    label = torch.arange(batch_size) % 1000
    steps = {}
    precisions = ("float32",) if bfloat16_missing() else ("float32", "bfloat16")
    for precision in precisions:
        autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if precision == "bfloat16" \
            else contextlib.nullcontext
        train_net = torch_resnet50(torch).to(memory_format=torch.channels_last)
        optimizer = torch.optim.SGD(train_net.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-5)
        loss_fn = torch.nn.CrossEntropyLoss()
        infer_net = torch_resnet50(torch).to(memory_format=torch.channels_last).eval()

        def step(net=train_net, optimizer=optimizer, autocast=autocast, loss_fn=loss_fn):
            net.train()
            optimizer.zero_grad(set_to_none=True)
            with autocast():
                loss = loss_fn(net(data), label)
            loss.backward()
            optimizer.step()

        def inference(net=infer_net, autocast=autocast):
            with torch.inference_mode(), autocast():
                net(data)
        steps[f"PyTorch {precision} training step"] = step
        steps[f"PyTorch {precision} inference"] = inference
    size = CEILING_SIZE
    ceilings = {}
    for precision, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16))[:len(precisions)]:
        a, b = torch.rand(size, size, dtype=dtype), torch.rand(size, size, dtype=dtype)
        ceilings[precision] = lambda a=a, b=b: matmul_rate(lambda: torch.mm(a, b), size)
    return steps, ceilings, torch.__version__, bfloat16_missing() and f"PyTorch {bfloat16_missing()}"
