"""memory: the estimate refuses a batch that cannot fit and names one that does."""
from support.networks import built


def test_memory_estimate_refuses_a_batch_that_cannot_fit_and_names_one_that_does():
    """Found by the second newcomer walk (issue 26)."""
    from rn50kit.hardware import memory
    net = built(50, 224)
    gib = 2 ** 30
    # The run: ResNet-50, 224 px, batch 192 on a 24 GB machine (it grew to 21 GB resident).
    problem, need = memory.check(net, (1, 3, 224, 224), "float32", 192, 1, 1, 16 * gib, "this machine")
    assert need > 16 * gib and problem.startswith("training needs about")
    fits = int(problem.split("--batch-size ")[1].split()[0])
    assert 0 < fits < 192 and memory.check(net, (1, 3, 224, 224), "float32", fits, 1, 1, 16 * gib, "m")[0] is None
    assert memory.check(net, (1, 3, 224, 224), "float32", fits + 8, 1, 1, 16 * gib, "m")[0] is not None
    # The original's batches on a 16 GB V100 (15.8 GiB usable): float16 208 and float32 96 fit, float32 208 does not.
    v100 = 15.78 * gib
    assert memory.check(net, (1, 3, 224, 224), "float16", 208, 1, 1, v100, "GPU 0")[0] is None
    assert memory.check(net, (1, 3, 224, 224), "float32", 96, 1, 1, v100, "GPU 0")[0] is None
    assert memory.check(net, (1, 3, 224, 224), "float32", 208, 1, 1, v100, "GPU 0")[0] is not None
    # Activations scale with the image and the batch, by layer: ResNet-18 at 32 px holds 1/49 of 224 px's.
    small = built(18, 32)
    assert memory.activation_elements(small, (1, 3, 32, 32)) * 40 < memory.activation_elements(built(18, 224),
                                                                                                (1, 3, 224, 224))
