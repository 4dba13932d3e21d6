"""train.py in process: refusals in one line (class counts, batches the machine cannot hold, a negative lr,
scoring without a checkpoint, MXNet errors), and the epoch-0 pipeline let go."""
import gc
import weakref

import mxnet as mx
import pytest

import train
from rn50kit.common import backends
from rn50kit.config import cli, train_config
from rn50kit.data import loaders
from rn50kit.training import announce, epoch_data, start_checks
from rn50kit.training.distributed import Distributed
from support.datasets import labelled_records
from support.networks import built
from support.runs import plan_refusal, record_config, train_refusal

# --- 7: the epoch-0 training pipeline is let go once used, or at once after a resume -------------------------

class Pipeline:
    pass


def test_epoch_0_pipeline_is_not_kept_for_the_run(monkeypatch):
    """Found by the second review of the GPU paths (issue 21)."""
    monkeypatch.setattr(loaders, "get_data_iterators_per_device", lambda *args: (Pipeline(), None))
    cfg = train_config.RunConfig().replace(fit__seed=1)
    dist = Distributed(None)
    first = Pipeline()
    gone = weakref.ref(first)
    make = epoch_data.train_iterator_factory(cfg, dist, [mx.cpu()], first)
    del first
    epoch0 = make(0)
    assert epoch0 is gone()
    del epoch0  # the loop drops each epoch's iterator when the epoch ends
    make(1)
    gc.collect()
    assert gone() is None


def test_a_resumed_run_lets_the_unused_epoch_0_pipeline_go(monkeypatch):
    """Found by the second review of the GPU paths (issue 21)."""
    monkeypatch.setattr(loaders, "get_data_iterators_per_device", lambda *args: (Pipeline(), None))
    cfg = train_config.RunConfig().replace(fit__seed=1)
    first = Pipeline()
    gone = weakref.ref(first)
    make = epoch_data.train_iterator_factory(cfg, Distributed(None), [mx.cpu()], first)
    del first
    assert isinstance(make(3), Pipeline)
    gc.collect()
    assert gone() is None


# --- 8: MXNet's errors at the entry point: one line saying what to do --------------------------------------

OOM = ("Traceback (most recent call last):\n  File \"src/storage/./pooled_storage_manager.h\", line 161\n"
       "MXNetError: cudaMalloc retry failed: out of memory")


BAD_DEVICE = ("Traceback (most recent call last):\n  File \"src/engine/threaded_engine.cc\", line 331\n"
              "MXNetError: [10:00:00] ../include/mxnet/base.h:427: Check failed: e == cudaSuccess (101 vs. 0) : "
              "CUDA: invalid device ordinal")


@pytest.mark.parametrize("text,expected", [(OOM, "ran out of memory; use a smaller batch (runner's -b"),
                                           (BAD_DEVICE, "a GPU id that does not exist was asked for: this process "
                                                        "sees GPUs none; check --gpus")])
def test_train_py_ends_an_mxnet_error_in_one_line(monkeypatch, capsys, text, expected):
    """Found by the second review of the GPU paths (issue 21)."""
    def main(*args, **kwargs):
        raise mx.base.MXNetError(text)

    monkeypatch.setattr(train, "main", main)
    with pytest.raises(SystemExit) as ended:
        train.run(["--data-backend", "synthetic"])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("train.py: error: ") and expected in err


@pytest.mark.parametrize("backend", [name for name, row in backends.BACKENDS.items() if row.reads_records])
def test_class_count_below_the_record_labels_is_refused_without_a_lst(tmp_path, backend, caplog):
    """Found by the second newcomer walk (issue 26)."""
    files = labelled_records(tmp_path, [i % 10 for i in range(20)])
    with pytest.raises(cli.UsageError, match="labels up to 9 but --num-classes is 5; use --num-classes 10"):
        announce.warn_about(record_config(files, backend, 5), primary=True)
    announce.warn_about(record_config(files, backend, 10), primary=True)  # the right count passes
    with caplog.at_level("WARNING"):
        announce.warn_about(record_config(files, backend, 12), primary=True)
    assert "the data has 10 classes" in caplog.text


def test_train_refuses_in_one_line_a_batch_the_machine_cannot_hold(monkeypatch):
    """Found by the second newcomer walk (issue 26)."""
    import mxnet as mx

    from rn50kit.hardware import memory
    from rn50kit.training import distributed
    monkeypatch.setattr(memory, "cpu_budget", lambda processes: 1 * 2 ** 30)
    cfg = train_config.RunConfig().replace(fit__batch_size=4096, fit__mode="train", data__image_shape=(3, 32, 32))
    net = built(18, 32)
    with pytest.raises(cli.UsageError, match=r"this machine has 1.0 GiB; use --batch-size \d+ \(global"):
        start_checks.check_memory(cfg, net, [mx.cpu()], distributed.Distributed(None))
    start_checks.check_memory(cfg.replace(fit__batch_size=8), net, [mx.cpu()], distributed.Distributed(None))
    start_checks.check_memory(cfg.replace(fit__memory_check="warn"), net, [mx.cpu()], distributed.Distributed(None))


def test_a_negative_lr_is_refused():
    """Found by the second newcomer walk (issue 26)."""
    assert train_refusal("--lr", "-1") == "--lr must not be negative, got -1"
    assert plan_refusal("-l", "-1") == "-l must not be negative, got -1.0"


def test_scoring_without_a_checkpoint_is_refused_before_any_scoring_line(tmp_path, caplog):
    """Found by the second newcomer walk (issue 26)."""
    files = labelled_records(tmp_path, [i % 10 for i in range(20)])
    args = train.parse_args(["--kv-store", "local", "--mode", "val", "--data-backend", "dali-cpu", "--num-layers",
                             "18", "--num-classes", "10", "--image-shape", "3,32,32", "--data-val", files["val"][0],
                             "--workspace", str(tmp_path / "empty")])
    with caplog.at_level("INFO"), pytest.raises(cli.UsageError, match="no checkpoint to score: give --load"):
        train.main(args)
    assert "Scoring" not in caplog.text
