"""progress: the first line's global and per-worker batch, the progress line's epoch of how many and its ETA."""
from rn50kit.config import train_config
from rn50kit.training import announce


def test_the_first_line_says_global_batch_and_per_worker():
    """Found by the second newcomer walk (issue 26)."""
    cfg = train_config.RunConfig().replace(fit__batch_size=64, fit__num_epochs=2, fit__lr=0.1, fit__workspace="ws",
                                     data__data_backend="synthetic", fit__dtype="float32")
    assert "2 worker(s), global batch 64 (32 per worker), float32" in announce.header(cfg, 2, "report.json")
    assert "1 worker(s), global batch 64, float32" in announce.header(cfg, 1, "report.json")


def test_the_progress_line_says_which_epoch_of_how_many_and_that_its_eta_is_the_runs(caplog):
    """Found by the second newcomer walk (issue 26)."""
    import io

    from rn50kit.reporting.progress import Progress
    with caplog.at_level("INFO", logger="rn50"):
        Progress(True, 1, stream=io.StringIO(), num_epochs=16).update(8, 3, 10, 12.5, 1.25, 0.1, 3725)
    assert "Epoch[8/16] Batch[3/10] 12.5 img/s loss 1.2500 lr 0.10000 run ETA 1:02:05" in caplog.text
