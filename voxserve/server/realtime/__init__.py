"""The /v1/realtime door: the OpenAI Realtime API over a WebSocket, and its client secrets.
Speaks server/realtime_api/ on server/websocket/; never imports another door
(docs/architecture.md "Rooms")."""
