"""The /v1/realtime/calls door: the OpenAI Realtime API over WebRTC (aiortc): the events on a
data channel, the audio on media tracks. Speaks server/realtime_api/; never imports another
door (docs/architecture.md "Rooms")."""
