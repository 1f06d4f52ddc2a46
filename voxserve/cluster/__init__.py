"""Scale-out on Ray Serve (docs/cluster.md).

The gateway stays a normal voxserve server; its ASR and TTS engines are `RemoteAsr` and
`RemoteTts` (registered as the engines named `ray`), which call the core tier's Ray Serve
deployments (`deployments.py`) through the same engine protocol. Nothing here imports Ray at
module level except the modules that need it, so `voxserve` works without the `cluster` extra.
"""
