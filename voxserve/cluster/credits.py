"""The gateway's credit window of in-flight calls to one core tier (AIMD, like TCP's): one
`TierCredits` (engines/credits.py) per tier of this process.
"""

from __future__ import annotations

import threading

from voxserve.config import ClusterCredits
from voxserve.engines.credits import TierCredits

_tiers: dict[str, TierCredits] = {}
_tiers_lock = threading.Lock()


def tier_credits(tier: str, config: ClusterCredits) -> TierCredits:
    """The one window per tier of this process, shared by every remote engine of the tier
    (e.g. the RemoteTts of each core TTS engine)."""
    with _tiers_lock:
        found = _tiers.get(tier)
        if found is None or found.config != config:
            found = _tiers[tier] = TierCredits(tier, config)
        return found
