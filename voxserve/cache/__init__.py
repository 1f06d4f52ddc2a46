"""The TTS cache: finished replies served from memory, kept on disk across restarts.

key.py (what makes two requests one reply), entry.py, lru.py (memory, bounded by bytes),
store.py (sqlite), writer.py (the disk-writing thread), lock.py (one server per directory),
flight.py (single flight), tts_cache.py (the facade the runtime owns) with stats.py, prewarm.py.
"""
