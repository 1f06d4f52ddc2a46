"""What a client asked for when it opened a stream: defined with the rest of the protocol's
vocabulary (voxserve/events.py), named here too for the pipeline's modules."""

from __future__ import annotations

from voxserve.events import MODES as MODES
from voxserve.events import Mode as Mode
from voxserve.events import StreamConfig as StreamConfig
