"""Our DALI-to-MXNet iterator on real DALI CPU pipelines."""
import collections
import subprocess
import sys

import mxnet as mx
import pytest

import dali
from rn50kit.data import loaders
from conftest import HANG_S, ROOT, venv_env


def val_labels(rec, idx, shard_id, num_shards, batch_size):
    pipe = dali.val_pipeline(rec_path=rec, idx_path=idx, shard_id=shard_id, num_shards=num_shards,
                             image_shape=(3, 16, 16), mean=[0, 0, 0], std=[1, 1, 1], resize_shorter=16,
                             batch_size=batch_size, num_threads=1, device_id=None, seed=1)
    pipe.build()
    total = dali.reader_epoch_size(pipe)
    iterator = loaders.DaliIterator(dali.DaliBatches(pipe, mx.cpu()), loaders.shard_size(total, shard_id, num_shards))
    epochs = []
    for _ in range(2):  # a second epoch must give the same samples again
        labels = []
        for batch in iterator:
            assert batch.data[0].shape == (batch_size, 3, 16, 16)
            valid = batch_size - batch.pad
            labels += batch.label[0][:valid].asnumpy().astype(int).tolist()
        epochs.append(labels)
    return epochs


@pytest.mark.parametrize("batch_size", [4, 7, 32])
def test_validation_sees_every_sample_exactly_once_over_two_ranks(unique_label_rec, batch_size):
    rec, idx, count = unique_label_rec
    per_rank = [val_labels(rec, idx, rank, 2, batch_size) for rank in range(2)]
    for epoch in range(2):
        seen = collections.Counter(per_rank[0][epoch] + per_rank[1][epoch])
        assert sorted(seen) == list(range(count))
        assert set(seen.values()) == {1}


def test_shard_size_matches_reader_split():
    assert sum(loaders.shard_size(53, s, 2) for s in range(2)) == 53
    assert [loaders.shard_size(10, s, 3) for s in range(3)] == [3, 3, 4]


def test_cpu_batches_are_shared_not_copied_and_outlive_later_batches(unique_label_rec):
    """A dali-cpu batch for mx.cpu() is DALI's own output memory (no copy on the step's thread): the same pixels as
    the copied path's (another CPU context copies), still intact 20 batches later, and freed by MXNet's engine when
    the last operation reading it ends, not while one is still pending."""
    import numpy as np
    rec, idx, _ = unique_label_rec

    def batches(ctx):
        pipe = dali.val_pipeline(rec_path=rec, idx_path=idx, shard_id=0, num_shards=1, image_shape=(3, 16, 16),
                                 mean=[0, 0, 0], std=[1, 1, 1], resize_shorter=16, batch_size=4, num_threads=1,
                                 device_id=None, seed=1)
        pipe.build()
        return dali.DaliBatches(pipe, ctx)
    shared, copied = batches(mx.cpu()), batches(mx.cpu(1))
    assert shared.share and not copied.share
    kept, pending = [], []
    slow = mx.nd.ones((400, 400))
    for step in range(24):
        (images, labels), (ref_images, ref_labels) = shared.next(), copied.next()
        assert images.context == mx.cpu() and ref_images.context == mx.cpu(1)
        np.testing.assert_array_equal(images.asnumpy(), ref_images.asnumpy())
        np.testing.assert_array_equal(labels.asnumpy(), ref_labels.asnumpy())
        if step < 4:
            kept.append((images, labels, images.asnumpy().copy(), labels.asnumpy().copy()))
        # reads still queued (behind a chain of matrix products) when our last reference goes: MXNet's engine
        # must free DALI's memory after them, not before
        delay = slow
        for _ in range(6):
            delay = mx.nd.dot(delay, slow) / 400
        gate = 1 + mx.nd.sum(delay) * 0  # 1, ready only when the chain is done
        pending.append((mx.nd.sum(mx.nd.broadcast_mul(images, gate.reshape((1, 1, 1, 1)))) * 2 +
                        mx.nd.sum(mx.nd.broadcast_mul(labels, gate)),
                        float(ref_images.asnumpy().sum()) * 2 + float(ref_labels.asnumpy().sum())))
        del images, labels
    for images, labels, image_copy, label_copy in kept:  # not overwritten by the 20 batches since
        np.testing.assert_array_equal(images.asnumpy(), image_copy)
        np.testing.assert_array_equal(labels.asnumpy(), label_copy)
    for total, expected in pending:
        assert abs(total.asscalar() - expected) <= 1e-4 * max(1.0, abs(expected))


FINALIZED_OFF_MAIN = r'''
import gc, sys
sys.path.insert(0, sys.argv[1])
import mxnet as mx
import dali
from nvidia.dali import Pipeline, fn, pipeline_def

gc.disable()  # collections only where collect() runs them: on DALI's threads

off_main = []


def collect(x):  # a collection on DALI's thread, as an allocation in the OpenCV resize may start one
    gc.collect()
    return x


@pipeline_def(batch_size=2, num_threads=2, device_id=None, prefetch_queue_depth=3)
def working():
    return fn.python_function(fn.random.uniform(range=[0, 1], shape=[4]), function=collect)


@pipeline_def(batch_size=2, num_threads=1, device_id=None)
def plain():
    return fn.random.uniform(range=[0, 1], shape=[4]), fn.random.uniform(range=[0, 1], shape=[1])


for _ in range(4):
    pipe = working()
    pipe.build()
    pipe.run()  # it goes on working ahead
    cycle = {"pipe": pipe}
    cycle["self"] = cycle  # dropped into a reference cycle, as a traceback's frames hold one
    del pipe, cycle
kept = [p for p in dali._finalized_off_main if isinstance(p, Pipeline) and p._pipe is not None]  # not stubs
batches = dali.DaliBatches(plain(), mx.cpu())
batches.pipeline.build()
batches.next()  # the main thread shuts down what was finalized elsewhere
print("kept", len(kept), "shut", sum(p._pipe is None for p in kept))
'''


@pytest.mark.slow  # a process of its own, collecting on every python_function call
def test_a_pipeline_collected_on_its_own_thread_does_not_abort_the_process(tmp_path):
    """DALI's Pipeline.__del__ joins the pipeline's threads: run by a collection on one of them (a pipeline in a
    reference cycle, dropped while its python_function works ahead) it aborted the process ("terminate called",
    Resource deadlock avoided). dali.py keeps such a pipeline and the main thread shuts it down at its next batch."""
    script = tmp_path / "finalized_off_main.py"
    script.write_text(FINALIZED_OFF_MAIN)
    result = subprocess.run([sys.executable, str(script), ROOT], env=venv_env(), capture_output=True, text=True,
                            timeout=HANG_S)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Resource deadlock" not in result.stderr and "Exception ignored" not in result.stderr, result.stderr
    kept, shut = (int(word) for word in result.stdout.split()[1::2])
    assert kept >= 1 and shut == kept  # running pipelines collected off the main thread, then shut down by it


def test_a_resize_pool_finalized_off_the_main_thread_ends_on_it():
    """The OpenCV resize pool ends with its pipeline; finalized on another thread (a collection inside
    pool.submit there would hold the lock shutdown takes) it is shut down by the main thread's next call."""
    import concurrent.futures
    import threading
    pool = concurrent.futures.ThreadPoolExecutor(1)
    worker = threading.Thread(target=dali._shut_down_pool, args=(pool,))
    worker.start()
    worker.join()
    assert pool.submit(int, "1").result() == 1  # still open
    dali.shut_down_finalized_pipelines()
    with pytest.raises(RuntimeError, match="shutdown"):
        pool.submit(int, "1")
