"""The HTTP door: OpenAI-compatible /v1 audio routes (speech, transcriptions, voices, models),
the admin and debug routes, the HTTP/1.1 protocol with its limits. Imports server/session/,
never another door (docs/architecture.md "Rooms")."""
