"""What the core tier tells a gateway of its TTS engines (cluster/core_engines.py), read
without Ray: the engines are built here as a replica builds them."""

from __future__ import annotations

from voxserve.cluster.core_engines import TtsCatalogue
from voxserve.config import EnginesConfig, EngineSpec
from voxserve.engines.base import close_engine


def test_the_catalogue_says_which_engines_offer_the_first_piece_choice() -> None:
    """A gateway's RemoteTts passes a one-shot request's `short_first=False` on only where
    the core's engine takes it (engines/base.py, short_first_piece): piper does, espeak
    does not."""
    engines = EnginesConfig(tts=[EngineSpec(name="piper"), EngineSpec(name="espeak")])
    catalogue = TtsCatalogue.read(engines)
    offers = {name: entry.short_first_piece for name, entry in catalogue.engines.items()}
    assert offers == {"piper": True, "espeak": False}
    for engine in catalogue.spare.values():
        close_engine(engine)
