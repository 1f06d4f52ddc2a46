"""Audio layer: PCM formats, resampling, WAV, frame rings and the seq_id dedup window."""
