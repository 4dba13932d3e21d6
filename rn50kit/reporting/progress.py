"""Live progress on rank 0 (a bar on a terminal, log lines otherwise) and the JSON-lines log."""
import json
import logging
import sys
import time

log = logging.getLogger("rn50")


def format_seconds(seconds):
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """One bar per epoch with images/s, loss, LR and ETA; plain log lines every ``every`` steps when not a TTY."""

    def __init__(self, enabled, every, stream=None, width=24, num_epochs=None):
        self.enabled = enabled
        self.num_epochs = num_epochs  # shown as Epoch[8/16]
        self.every = max(every, 1) if every else 0
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.width = width

    def update(self, epoch, step, steps, speed, loss, lr, eta_seconds):
        # the ETA is of the whole run (this run's remaining epochs), not of the epoch: labelled so
        text = (f"{speed:.1f} img/s loss {loss:.4f} lr {lr:.5f} run ETA {format_seconds(eta_seconds)}")
        which = f"{epoch}/{self.num_epochs}" if self.num_epochs else f"{epoch}"
        self.show(f"Epoch[{which}]", step, steps, text, f"Batch[{step}/{steps}]")

    def count(self, label, done, total, speed, eta_seconds):
        """Progress through ``total`` items (images predicted, say) outside training: ``label`` [bar] done/total,
        images/s and ETA."""
        self.show(label, done, total, f"{speed:.1f} img/s ETA {format_seconds(eta_seconds)}", f"{done}/{total}")

    def show(self, label, step, steps, text, position):
        """A bar of ``step`` out of ``steps`` on a terminal, else a log line (``label position text``) every
        ``every`` steps and at the end."""
        if not self.enabled:
            return
        if self.tty:
            done = int(self.width * step / max(steps, 1))
            bar = "#" * done + "." * (self.width - done)
            self.stream.write(f"\r{label} [{bar}] {step}/{steps} {text}")
            self.stream.flush()
        elif self.every and (step % self.every == 0 or step == steps):
            log.info("%s %s %s", label, position, text)

    def end_epoch(self):
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()


class JsonLog:
    """One JSON object per line: {"type": "params"|"iter"|"epoch"|"summary", ...}; appends across resumes."""

    def __init__(self, path):
        self.file = open(path, "a") if path else None
        self.start = time.time()

    def write(self, kind, **fields):
        if self.file is None:
            return
        record = {"type": kind, "time": round(time.time(), 3), **fields}
        self.file.write(json.dumps(record, default=str) + "\n")
        self.file.flush()

    def close(self):
        if self.file is not None:
            self.file.close()
            self.file = None
