"""Checkpoint files as checkpoint.save names them: real ones of a small network, and complete-looking ones whose
contents do not matter (unit/test_settings, test_checkpoint, test_launcher, e2e/test_fault_recovery)."""
import json


def touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    return path


def save_tiny(prefix, epochs):
    """Real checkpoints of a small network (one per epoch, their files' sizes and SHA-256 recorded); returns
    (net, trainer)."""
    import mxnet as mx

    from rn50kit.weights import checkpoint
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(64, in_units=256))
    net.initialize()
    net.hybridize()
    net(mx.nd.zeros((1, 256)))
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    for epoch in epochs:
        checkpoint.save(str(prefix), net, trainer, {"epoch": epoch, "step": 0})
    return net, trainer


def fake_checkpoint(workspace, epoch, step=0, **args):
    """The files of a complete checkpoint (contents do not matter here) and its state, as checkpoint.save names
    them."""
    from rn50kit.weights import checkpoint
    tag = checkpoint.tag_for(epoch, step)
    files = {"symbol": "model-symbol.json", "params": f"model-{tag}.params", "states": f"model-{tag}.states"}
    for name in files.values():
        touch(workspace / name)
    state = {"epoch": epoch, "step": step, "model": args.pop("model", "resnet18_v1.5"), "files": files,
             "args": args}
    (workspace / f"model-{tag}{checkpoint.STATE_SUFFIX}").write_text(json.dumps(state))
    return workspace / files["params"]
