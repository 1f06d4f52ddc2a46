"""OpenAI's model names, which map to the default engines so the official SDK works
unchanged (HTTP /v1 and gRPC list them beside the engines' own names)."""

from __future__ import annotations

OPENAI_TTS_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-12-15")
OPENAI_ASR_MODELS = ("whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe")
