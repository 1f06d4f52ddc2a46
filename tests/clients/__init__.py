"""The agent frameworks as a user installs them (pyproject.toml: the `clients` extra, each at
the version pinned there), each against a real voxserve server on the real engines.

The official `openai` SDK's own doors are tested where those doors are: tests/realtime
(test_realtime_sdk.py: realtime), tests/test_speech_formats.py (speech: mp3, SSE),
tests/test_http_transcriptions.py and tests/test_http_audio.py (transcriptions: mp3, m4a,
verbose_json with words, stream), tests/models/test_translations_default.py (translations),
tests/webrtc/test_calls_e2e.py (an aiortc caller). README.md "Agent frameworks" lists them."""
