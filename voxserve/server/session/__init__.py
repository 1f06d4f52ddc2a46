"""What every door shares: the session driver and its attachment, admission, per-key quotas,
auth, the session slot and parking, the /v1/stream message format, client JSON, HTTP request
reading and errors, OpenAI's model and voice names. Imports no other room of server/."""
