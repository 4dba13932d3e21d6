"""The one error of reading published weights into a network."""


class PretrainedError(ValueError):
    """A file that cannot be loaded into the network built: the message is one line for the user."""
