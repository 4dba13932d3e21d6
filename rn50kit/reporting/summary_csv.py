"""summary.csv: one row per trained epoch of a run (as timm's summary.csv), for a spreadsheet or pandas.

Kept across resumes: a run that continues from epoch N keeps the rows of epochs 1..N and writes the later ones
anew, so a resumed run (or one resumed from an earlier checkpoint) never lists an epoch twice.
"""
import csv
import os

from rn50kit.reporting.outputs import Output
from rn50kit.reporting.report import WARMUP_ITERATIONS, images_per_second

SUMMARY_CSV = "summary.csv"
COLUMNS = ("epoch", "train_loss", "val_top1", "val_top5", "val_loss", "lr", "images_per_s", "train_seconds")


def read_rows(path):
    """The rows of a summary.csv as dicts of strings ([] when there is none)."""
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


class SummaryCsv(Output):
    """Writes ``path`` (None: nothing, on the ranks but 0): at each epoch's end its training loss, LR at its end,
    images/s (as the report's total_ips) and training wall seconds, and its validation's top-1/top-5/loss (empty
    cells when the epoch was not validated)."""

    def __init__(self, path, batch_size, untimed_iters=WARMUP_ITERATIONS):
        self.path = path
        self.batch_size = batch_size
        self.untimed_iters = untimed_iters
        self.row = {}

    @classmethod
    def open(cls, context):
        return cls(context.file(SUMMARY_CSV), context.cfg.batch_size, context.cfg.untimed_iters)

    def run_start(self, first_epoch, last_epoch, resumed_from):
        if self.path is None:
            return
        kept = [row for row in read_rows(self.path) if row.get("epoch", "").isdigit() and
                int(row["epoch"]) < first_epoch]  # epochs from first_epoch on are trained again
        tmp = f"{self.path}.tmp"
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, COLUMNS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(kept)
        os.replace(tmp, self.path)

    def epoch_start(self, epoch):
        self.row = {"epoch": epoch}

    def trained(self, epoch, metrics, durations, lr, seconds):
        self.row.update(train_loss=metrics["loss"], lr=lr, train_seconds=round(seconds, 3),
                        images_per_s=images_per_second(durations, self.batch_size, self.untimed_iters))

    def validation(self, epoch, metrics, first):
        self.row.update(val_top1=metrics["top1"], val_top5=metrics["top5"], val_loss=metrics["loss"])

    def epoch_end(self, epoch, record):
        if self.path is None:
            return
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, COLUMNS).writerow({**self.row, "epoch": epoch})
