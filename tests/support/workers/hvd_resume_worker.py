"""Run by tests/e2e/test_horovod_training.py under horovodrun with 2 ranks: each rank resumes (--resume auto, as
fit.start does: distributed.chosen_by_rank_0) from each workspace the test prepared in <out>, counting the files it
hashed; writes <out>/rank<r>.json: per workspace, the checkpoint chosen (or the error) and the files hashed."""
import json
import os
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.dirname(TESTS), TESTS]  # the kit's modules, and tests/support
import horovod.mxnet as hvd  # noqa: E402

from rn50kit.training import distributed  # noqa: E402
from rn50kit.weights import checkpoint  # noqa: E402


def main():
    out, cases = sys.argv[1], sys.argv[2:]
    hvd.init()
    dist = distributed.Distributed(hvd)
    hashed, real_sha256 = [], checkpoint.sha256
    checkpoint.sha256 = lambda path: hashed.append(path) or real_sha256(path)
    results = {}
    for case in cases:
        hashed.clear()
        prefix = os.path.join(out, case, "model")
        try:
            state = distributed.chosen_by_rank_0(
                lambda warn, prefix=prefix: checkpoint.resume_state("auto", prefix, warn), dist)
            results[case] = {"chosen": state and os.path.basename(state["state_path"])}
        except checkpoint.CheckpointError as error:
            results[case] = {"error": str(error)}
        results[case]["hashed"] = len(hashed)
    with open(os.path.join(out, f"rank{dist.rank}.json"), "w") as f:
        json.dump(results, f)
    hvd.shutdown()


if __name__ == "__main__":
    main()
