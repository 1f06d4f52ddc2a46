"""The gRPC door: voxserve.v1 on its own port (sessions, Synthesize, listing), with health,
reflection and TLS. Imports server/session/, never another door (docs/architecture.md
"Rooms")."""
