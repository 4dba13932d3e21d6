"""Scripts the tests start as processes (under horovodrun, in place of train.py, one process per fuzz run)."""
