"""voxserve: serve speech models to many concurrent live audio streams in real time."""

__version__ = "0.1.0"
