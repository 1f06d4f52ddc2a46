"""The WebSocket wire under the ws and realtime doors: the audio fast path in uvicorn's
protocol, the frame splitter, direct sends, the stall probe, the session link, the close
codes. Imports server/session/, never a door."""
