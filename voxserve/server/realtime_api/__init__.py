"""The OpenAI Realtime API's vocabulary, spoken by the realtime and webrtc doors: client
events in, server events out, the session object and its updates, items, client secrets.
Imports server/session/, never a door."""
