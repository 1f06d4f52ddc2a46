"""The Wyoming door: Home Assistant's voice protocol on its own TCP port (ASR, TTS, wake words,
`describe`), advertised by zeroconf. Imports server/session/, never another door
(docs/architecture.md "Rooms")."""
