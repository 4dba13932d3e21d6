"""rn50kit/data/identity.py: the training records' identity a checkpoint keeps, and the refusal of a resume on
other records."""
import hashlib

from rn50kit.data import identity


def write_records(folder, rec, idx):
    (folder / "train.rec").write_bytes(rec)
    (folder / "train.idx").write_text(idx)
    return str(folder / "train.rec"), str(folder / "train.idx")


def test_identity_is_sizes_and_the_index_checksum(tmp_path):
    rec, idx = write_records(tmp_path, b"x" * 100, "0\t0\n1\t50\n")
    got = identity.records_identity(rec, idx)
    assert got == {"rec": rec, "rec_bytes": 100, "idx_bytes": len(b"0\t0\n1\t50\n"),
                   "idx_sha256": hashlib.sha256(b"0\t0\n1\t50\n").hexdigest()}
    assert identity.records_identity(str(tmp_path / "missing.rec"), idx) is None
    assert identity.records_identity("", "") is None


def test_other_records_are_refused_the_same_pass(tmp_path):
    rec, idx = write_records(tmp_path, b"x" * 100, "0\t0\n1\t50\n")
    saved = identity.records_identity(rec, idx)
    assert identity.changed_records_problem(saved, identity.records_identity(rec, idx), "ck.state.json") is None
    write_records(tmp_path, b"y" * 100, "0\t0\n1\t60\n")  # the same size, another layout
    problem = identity.changed_records_problem(saved, identity.records_identity(rec, idx), "ck.state.json")
    assert problem.startswith("the training records changed since ck.state.json was saved")
    assert "\n" not in problem and "--resume none" in problem
    assert identity.changed_records_problem(None, saved, "ck") is None  # a checkpoint from before: not compared
