"""Observability: structured logs carrying each session's trace and session ids."""
