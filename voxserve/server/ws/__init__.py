"""The /v1/stream door: voxserve's own WebSocket protocol (docs/protocol.md) on the shared
WebSocket wire (server/websocket/). Imports server/session/ and server/websocket/, never
another door (docs/architecture.md "Rooms")."""
