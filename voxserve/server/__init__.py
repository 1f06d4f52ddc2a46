"""The server: one package per door (http, ws, realtime, webrtc, grpc, wyoming), what doors
share (session; realtime_api and websocket by wire), and at this root the modules that
compose them into one app (docs/architecture.md "Rooms"; pyproject.toml's contracts)."""
