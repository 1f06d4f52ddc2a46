"""Engines: small protocols (base.py), a registry of entry points, one module per engine."""
