"""Which training records a run trains on, cheaply: the sizes of the record file and its index and a SHA-256 of the
index (each record's offset, so another image anywhere moves them), without reading the records themselves. A
training run keeps it in every checkpoint's state; resuming on records that differ is refused (tools/prepare_folder.py
over the same folder, another --data-root) instead of continuing on other data without a word."""
import hashlib
import os


def records_identity(rec_path, idx_path):
    """{"rec", "rec_bytes", "idx_bytes", "idx_sha256"} of the training records, or None when they are not files
    (synthetic data, a backend that reads no record file)."""
    if not rec_path or not idx_path or not os.path.isfile(rec_path) or not os.path.isfile(idx_path):
        return None
    digest = hashlib.sha256()
    with open(idx_path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return {"rec": os.path.abspath(rec_path), "rec_bytes": os.path.getsize(rec_path),
            "idx_bytes": os.path.getsize(idx_path), "idx_sha256": digest.hexdigest()}


def changed_records_problem(saved, now, checkpoint_path):
    """The one-line refusal of a resume whose training records are not those the checkpoint trained on (None: the
    same, or either side unknown, e.g. a checkpoint from before the records were recorded)."""
    if not saved or not now or all(saved.get(key) == now.get(key) for key in ("rec_bytes", "idx_bytes", "idx_sha256")):
        return None
    return (f"the training records changed since {checkpoint_path} was saved ({now['rec']}: {now['rec_bytes']} bytes, "
            f"index {now['idx_sha256'][:12]}; the checkpoint's: {saved.get('rec_bytes')} bytes, index "
            f"{str(saved.get('idx_sha256'))[:12]}): resuming would continue on other data; use a new --workspace, "
            f"--resume none to start afresh, or the records it trained on")
