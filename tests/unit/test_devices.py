"""devices: --gpus one rule (nvidia-smi ids, runner's CUDA_VISIBLE_DEVICES, one GPU per Horovod local rank)."""
import mxnet as mx
import pytest

import train
from rn50kit.config import fit_flags
from rn50kit.config.cli import UsageError
from rn50kit.training import worker
from support.runs import planned_train_argv

# --- 4: one rule for --gpus: it selects the GPUs with every --kv-store, consistently with runner's variable ---

def fit_cfg(**fields):
    return fit_flags.FitConfig(**fields)


def test_kv_store_device_gpus_2_3_under_runner_computes_on_the_two_gpus_it_sees(data_folder):
    """Found by the second review of the GPU paths (issue 21)."""
    env, argv = planned_train_argv(["-n", 2, "--kv-store", "device", "--gpus", "2,3", "--data-root", data_folder])
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    args = train.parse_args(argv)
    ctxs = worker.contexts(fit_cfg(kv_store="device", gpus=args.gpus), 0, 1, num_gpus=2, environ=env)
    assert ctxs == [mx.gpu(0), mx.gpu(1)]  # physical GPUs 2 and 3, as this process numbers them


def test_gpus_must_agree_with_n_and_name_gpus_that_exist(data_folder):
    """Found by the second review of the GPU paths (issue 21)."""
    with pytest.raises(UsageError, match="-n 4 but --gpus 0,1 names 2"):
        planned_train_argv(["-n", 4, "--kv-store", "device", "--gpus", "0,1", "--data-root", data_folder])
    with pytest.raises(UsageError, match="GPU 9, and this machine has GPUs 0 to 7"):
        worker.contexts(fit_cfg(kv_store="device", gpus="0,9"), 0, 1, num_gpus=8, environ={})
    with pytest.raises(UsageError, match="CUDA_VISIBLE_DEVICES=0,1 hides"):
        worker.contexts(fit_cfg(kv_store="device", gpus="2"), 0, 1, num_gpus=2,
                       environ={"CUDA_VISIBLE_DEVICES": "0,1"})


def test_gpus_selects_each_horovod_ranks_gpu(data_folder):
    """Found by the second review of the GPU paths (issue 21)."""
    env, argv = planned_train_argv(["-n", 2, "--gpus", "4,6", "--data-root", data_folder])
    assert "CUDA_VISIBLE_DEVICES" not in env  # every rank sees the node's GPUs
    cfg = fit_cfg(kv_store="horovod", gpus=train.parse_args(argv).gpus)
    assert [worker.contexts(cfg, rank, 2, num_gpus=8, environ=env) for rank in range(2)] == [[mx.gpu(4)], [mx.gpu(6)]]
    with pytest.raises(UsageError, match="-n 4 but --gpus 4,6 names 2"):
        planned_train_argv(["-n", 4, "--gpus", "4,6", "--data-root", data_folder])
    assert worker.contexts(fit_cfg(kv_store="horovod"), 3, 8, num_gpus=8, environ={}) == [mx.gpu(3)]
