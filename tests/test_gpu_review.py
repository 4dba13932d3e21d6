"""Issue 21 (the second review of the GPU paths): each defect reproduced on CPU, with a described 8-GPU machine,
the float16 structures built on CPU, several CPU contexts, or device contexts that allocate nothing
(``mx.gpu(i)`` objects exist on a CPU build)."""
import mxnet as mx
import pytest

import backends
import dali
import data


# --- 1: a CPU pipeline's batch for a GPU is staged in pinned host memory, then copied to the GPU -------------

CONTEXTS = [mx.cpu(), mx.cpu(1), mx.gpu(0), mx.gpu(3)]


@pytest.mark.parametrize("backend", [name for name in backends.NAMES if backends.get(name).builder.endswith("dali_iterators")])
@pytest.mark.parametrize("ctx", CONTEXTS, ids=str)
def test_every_dali_copy_has_source_and_destination_of_one_memory_kind(backend, ctx):
    source = backends.get(backend).pipeline_device
    if source == "gpu" and ctx.device_type != "gpu":
        with pytest.raises(ValueError, match="dali-cpu"):  # get_dali_iterators refuses it before, too
            dali.staging_context(source, ctx)
        return
    staging = dali.staging_context(source, ctx)
    dali.check_copy(source, staging)  # the guard every copy_to_external passes
    assert dali.memory_kind(staging) == source
    if source == "cpu" and ctx.device_type == "gpu":
        assert staging == mx.cpu_pinned(ctx.device_id)


def test_the_guard_refuses_a_host_copy_into_device_memory():
    with pytest.raises(AssertionError, match="cpu output copied into gpu"):
        dali.check_copy("cpu", mx.gpu(0))
    with pytest.raises(AssertionError):
        dali.check_copy("gpu", mx.cpu_pinned(0))


def test_dali_cpu_batches_for_a_gpu_rank_go_through_pinned_memory(unique_label_rec, monkeypatch):
    """A real dali-cpu pipeline handed a GPU context (mx.gpu(0): allocations for it are made on the CPU here, and
    recorded): every copy out of DALI writes host memory, then the batch is copied to the arrays made for gpu(0)."""
    rec, idx, _ = unique_label_rec
    pipe = dali.val_pipeline(rec_path=rec, idx_path=idx, shard_id=0, num_shards=1, image_shape=(3, 16, 16),
                             mean=[0, 0, 0], std=[1, 1, 1], resize_shorter=16, batch_size=4, num_threads=1,
                             device_id=None, seed=1)
    pipe.build()
    made_for, copies = {}, []
    real_matching, real_copy = dali._matching, dali._copy_into

    def matching(out, tensor, ctx):
        array = real_matching(None, tensor, mx.cpu() if ctx.device_type == "gpu" else ctx)
        made_for[id(array)] = ctx
        return array

    def copy_into(tensor, out):
        copies.append((dali.source_kind(tensor), made_for[id(out)]))
        dali.check_copy(dali.source_kind(tensor), made_for[id(out)])
        real_copy(tensor, out)

    monkeypatch.setattr(dali, "_matching", matching)
    monkeypatch.setattr(dali, "_copy_into", copy_into)
    batches = dali.DaliBatches(pipe, mx.gpu(0))
    images, labels = batches.next()
    assert copies == [("cpu", mx.cpu_pinned(0)), ("cpu", mx.cpu_pinned(0))]
    assert made_for[id(images)] == mx.gpu(0)
    assert images.shape == (4, 3, 16, 16) and labels.shape == (4,)
    reference = dali.DaliBatches(pipe, mx.cpu())
    assert reference.next()[0].shape == images.shape
