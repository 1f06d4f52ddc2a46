// AudioWorklet: microphone samples (the context's rate, often 48 kHz) -> 16 kHz PCM16 frames
// of 20 ms (320 samples), posted to the page one ArrayBuffer per frame.
const OUT_RATE = 16000;
const FRAME = 320; // 20 ms at 16 kHz: the server's frame unit

class CaptureProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.ratio = sampleRate / OUT_RATE; // input samples per output sample (3 at 48 kHz)
    this.pending = new Float32Array(0); // input not yet consumed
    this.pos = 0; // fractional read position in `pending`
    this.frame = new Int16Array(FRAME);
    this.fill = 0;
  }

  process(inputs) {
    const input = inputs[0] && inputs[0][0];
    if (!input) return true; // no mic data this quantum; keep the node alive

    const buf = new Float32Array(this.pending.length + input.length);
    buf.set(this.pending);
    buf.set(input, this.pending.length);

    let pos = this.pos;
    while (pos + this.ratio <= buf.length) {
      // Average the input samples one output sample spans: a box filter, enough to keep
      // the worst aliasing out of speech without a real resampler.
      const start = Math.floor(pos);
      const end = Math.max(start + 1, Math.floor(pos + this.ratio));
      let sum = 0;
      for (let i = start; i < end; i++) sum += buf[i];
      const v = Math.max(-1, Math.min(1, sum / (end - start)));
      this.frame[this.fill++] = v < 0 ? v * 0x8000 : v * 0x7fff;
      if (this.fill === FRAME) {
        // Transfer, not copy: a fresh frame buffer follows.
        this.port.postMessage(this.frame.buffer, [this.frame.buffer]);
        this.frame = new Int16Array(FRAME);
        this.fill = 0;
      }
      pos += this.ratio;
    }
    const used = Math.floor(pos);
    this.pending = buf.slice(used);
    this.pos = pos - used;
    return true;
  }
}

registerProcessor("capture-16k", CaptureProcessor);
