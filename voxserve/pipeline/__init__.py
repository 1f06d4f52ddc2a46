"""The per-session pipeline (VAD -> ASR -> responder -> TTS) and the shared executor that
runs its blocking model calls."""
