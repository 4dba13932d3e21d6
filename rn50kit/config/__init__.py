"""train.py's configuration: the typed, frozen configs built once from the flags, and the settings a run takes when
the user does not say."""
