"""`voxserve bench`: paced load against a live voxserve server, and what it costs the server.

Modules, one job each: `schedule` (when to send), `stats` (percentiles, underruns, WER),
`program` (the audio a stream plays), `records` (raw measurements and their merge),
`audio_client` / `text_client` / `http_tts` (one client per mode), `replies` (audio-out
timing), `loadgen` and `workers` (one or several load processes), `procstat` (the server
process from /proc), `servers` (spawned servers, the baseline echo server), `step` (one
measured step and its validity), `standalone` (engines called directly), `report` and
`charts` (output), `commands` (one runner per sub-command) and `cli` (argparse).
"""
