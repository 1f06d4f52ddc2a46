"""Transports: thin adapters between the wire and sessions. Wire parsing stays free of I/O."""
