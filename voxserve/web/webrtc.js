// The page's WebRTC mode: one call to POST /v1/realtime/calls, as OpenAI's Realtime WebRTC
// clients make it. The microphone goes out as an Opus track (with the browser's echo
// cancellation, noise suppression and gain control), the reply comes back on a track played
// by an <audio> element, and the data channel `oai-events` carries the Realtime API's events
// (docs/realtime.md): transcripts, replies' text, speech started/stopped, errors.

import { $, addLine, app, openMicStream, setPartial, setState, setStatus, showAlert, showLatency, showPlayback } from "./ui.js";

export const supported = typeof window.RTCPeerConnection === "function";

const GATHER_MS = 2000; // wait at most this long for the offer's ICE candidates
const CONNECT_MS = 15000; // the call must be up (data channel open) by then
const DISCONNECTED_MS = 5000; // "disconnected" this long counts as lost
const SOUND_RMS = 0.003; // about -50 dBFS: reply audio with sound in it, not the silence between
const METER_MS = 50;

// A refused or failed call. retryAfterMs: the server asked to try again later (overloaded);
// fallback: this server has no WebRTC, the WebSocket mode may work.
export class CallError extends Error {
  constructor(message, { retryAfterMs = null, fallback = false } = {}) {
    super(message);
    this.retryAfterMs = retryAfterMs;
    this.fallback = fallback;
  }
}

function bearer(key) {
  return key ? { Authorization: `Bearer ${key}` } : {};
}

// The error a refused POST carries: voxserve's {"error": {"code", "message"}} (OpenAI's shape).
async function refusal(r) {
  let code = "";
  let message = r.statusText;
  try {
    const body = await r.json();
    code = body.error.code || body.error.type || "";
    message = body.error.message || message;
  } catch { /* not JSON: the status says it */ }
  return { code, message };
}

export class Call {
  // ctx: the page's AudioContext (started by the click), used to measure the reply's sound.
  // settings: {mode, voice, language, turns (a turn_detection), key}; onEnd({lost, message}) when the call is over
  // without hangUp() (the server ended it, or the network lost it).
  constructor(ctx, settings, onEnd) {
    this.ctx = ctx;
    this.settings = settings;
    this.onEnd = onEnd;
    this.pc = null;
    this.channel = null;
    this.mic = null;
    this.location = null;
    this.over = false;
    this.timers = [];
    this.meter = null;
    this.statsTimer = null;
    // per call state, for the transcript and the latency panel
    this.speechStart = new Map(); // item_id -> arrival of speech_started
    this.speechEnd = new Map(); // item_id -> arrival of speech_stopped
    this.partials = new Map(); // item_id -> the transcript's deltas so far
    this.lastSpeechEnd = null; // for the next reply's turn latency
    this.replyLines = new Map(); // item_id -> the assistant line growing with the deltas
    this.responding = false; // between response.created and response.done
    this.playing = false; // between output_audio_buffer.started and stopped/cleared
    this.replies = 0;
    this.heardMs = 0;
    this.lossText = "0";
    this.ended = null; // what voxserve.session.ended said, when it came
  }

  async start() {
    this.mic = await openMicStream();
    const pc = (this.pc = new RTCPeerConnection());
    pc.addTransceiver(this.mic.getAudioTracks()[0], { direction: "sendrecv", streams: [this.mic] });
    pc.ontrack = (e) => this.play(e.streams[0] || new MediaStream([e.track]));
    pc.onconnectionstatechange = () => this.onConnectionState();
    const channel = (this.channel = pc.createDataChannel("oai-events"));
    channel.onmessage = (e) => this.onMessage(e.data);
    channel.onclose = () => this.lost(this.ended ? null : "the server closed the data channel");

    await pc.setLocalDescription(await pc.createOffer());
    await this.gathered();
    if (this.over) return;
    let r;
    try {
      r = await fetch("/v1/realtime/calls", {
        method: "POST",
        headers: { "Content-Type": "application/sdp", ...bearer(this.settings.key) },
        body: pc.localDescription.sdp,
      });
    } catch (err) {
      this.close();
      throw new CallError(`Cannot reach the server (${err.message}).`, { retryAfterMs: 0 });
    }
    if (r.status !== 201) {
      this.close();
      const { code, message } = await refusal(r);
      const what = `HTTP ${r.status}${code ? ", " + code : ""}: ${message}`;
      if (r.status === 501 || r.status === 404) {
        throw new CallError(`This server takes no WebRTC calls (${what}).`, { fallback: true });
      }
      if (r.status === 503 || r.status === 429) {
        const after = Number(r.headers.get("Retry-After"));
        throw new CallError(`The server refused the call (${what}).`, {
          retryAfterMs: Number.isFinite(after) && after > 0 ? after * 1000 : 0,
        });
      }
      throw new CallError(`The server refused the call (${what}).`);
    }
    this.location = r.headers.get("Location");
    const answer = await r.text();
    if (this.over) {
      this.deleteCall();
      return;
    }
    await pc.setRemoteDescription({ type: "answer", sdp: answer });
    this.timers.push(setTimeout(() => {
      if (channel.readyState !== "open") this.lost(`not connected after ${CONNECT_MS / 1000} s (ICE ${pc.iceConnectionState})`);
    }, CONNECT_MS));
  }

  // The offer carries its candidates (no trickle: one POST); a slow STUN server only delays
  // the call by GATHER_MS, the host candidates are there by then.
  gathered() {
    const pc = this.pc;
    if (pc.iceGatheringState === "complete") return Promise.resolve();
    return new Promise((done) => {
      const timer = setTimeout(done, GATHER_MS);
      pc.addEventListener("icegatheringstatechange", () => {
        if (pc.iceGatheringState === "complete") {
          clearTimeout(timer);
          done();
        }
      });
    });
  }

  // ------------------------------------------------------------ the reply's audio

  play(stream) {
    const el = $("reply-audio");
    el.srcObject = stream;
    el.play().catch(() => { /* autoplay refused: the Start click normally allows it */ });
    // How much of the reply had sound, measured on the track itself (the element plays it):
    // every METER_MS, the last ~20 ms of the track's samples.
    const source = this.ctx.createMediaStreamSource(stream);
    const analyser = this.ctx.createAnalyser();
    analyser.fftSize = 1024;
    source.connect(analyser);
    const buf = new Float32Array(analyser.fftSize);
    this.meter = setInterval(() => {
      analyser.getFloatTimeDomainData(buf);
      let sum = 0;
      for (const v of buf) sum += v * v;
      if (Math.sqrt(sum / buf.length) > SOUND_RMS) {
        this.heardMs += METER_MS;
        this.showPlayback();
      }
    }, METER_MS);
    this.statsTimer = setInterval(() => this.readStats(), 1000);
  }

  // The reply's packets the network lost and the audio the browser made up for them.
  async readStats() {
    let stats;
    try {
      stats = await this.pc.getStats();
    } catch {
      return; // closed meanwhile
    }
    for (const s of stats.values()) {
      if (s.type === "inbound-rtp" && s.kind === "audio") {
        const concealedMs = Math.round(((s.concealedSamples || 0) - (s.silentConcealedSamples || 0)) / 48);
        this.lossText = `${s.packetsLost || 0} (${concealedMs} ms)`;
        this.showPlayback();
      }
    }
  }

  showPlayback() {
    showPlayback(this.replies, this.heardMs, "Packets lost (concealed)", this.lossText);
  }

  // ------------------------------------------------------------ connection

  // The page's choices, sent once the session is there (session.created): the call starts
  // with the server's defaults.
  applySettings() {
    const { mode, voice, language, turns } = this.settings;
    this.send({
      type: "session.update",
      session: {
        type: "realtime",
        audio: {
          input: {
            transcription: { language },
            turn_detection: { ...turns, create_response: mode !== "asr" },
          },
          output: { voice },
        },
      },
    });
  }

  onConnectionState() {
    const state = this.pc && this.pc.connectionState;
    if (state === "failed") this.lost("the network path failed (ICE)");
    if (state === "disconnected") {
      this.timers.push(setTimeout(() => {
        if (this.pc && this.pc.connectionState === "disconnected") this.lost("no packets from the server");
      }, DISCONNECTED_MS));
    }
  }

  send(ev) {
    if (this.channel && this.channel.readyState === "open") this.channel.send(JSON.stringify(ev));
  }

  onMessage(data) {
    let ev;
    try {
      ev = JSON.parse(data);
    } catch {
      return;
    }
    this.onEvent(ev, performance.now());
  }

  // ------------------------------------------------------------ the Realtime events

  onEvent(ev, now) {
    switch (ev.type) {
      case "session.created":
      case "session.updated": {
        // The call is up (created: the server's defaults; updated: the page's choices).
        const s = ev.session || {};
        const input = (s.audio && s.audio.input) || {};
        const td = input.turn_detection;
        const hangover = td ? td.silence_duration_ms : null;
        $("lat-note").textContent = "WebRTC: timed from the arrival of the server's speech_started and speech_stopped" +
          (hangover != null ? ` (speech_stopped comes after ${hangover} ms of silence).` : ".");
        const voice = s.audio && s.audio.output ? s.audio.output.voice : "?";
        const language = input.transcription ? input.transcription.language : "?";
        if (ev.type === "session.created") {
          showAlert("");
          this.applySettings();
        }
        setState("connected");
        setStatus(`Listening (WebRTC, ${this.settings.mode}, voice ${voice}, language ${language}). Speak now.`);
        break;
      }
      case "input_audio_buffer.speech_started":
        this.speechStart.set(ev.item_id, now);
        setStatus("Hearing you…");
        break;
      case "input_audio_buffer.speech_stopped":
        this.speechEnd.set(ev.item_id, now);
        this.lastSpeechEnd = now;
        break;
      case "conversation.item.input_audio_transcription.delta": {
        const before = this.partials.get(ev.item_id);
        if (before === undefined && this.speechStart.has(ev.item_id)) {
          showLatency("ttfp", now - this.speechStart.get(ev.item_id));
        }
        const text = (before || "") + ev.delta;
        this.partials.set(ev.item_id, text);
        setPartial(text);
        break;
      }
      case "conversation.item.input_audio_transcription.completed": {
        setPartial("");
        this.partials.delete(ev.item_id);
        if (ev.transcript) addLine("You", ev.transcript, "user");
        const end = this.speechEnd.get(ev.item_id);
        if (end !== undefined) showLatency("final", now - end);
        setStatus("Listening.");
        break;
      }
      case "conversation.item.input_audio_transcription.failed":
        setPartial("");
        showAlert(`Transcription failed: ${ev.error ? ev.error.message : "no reason given"}`);
        break;
      case "response.created":
        this.responding = true;
        break;
      case "response.output_audio_transcript.delta":
      case "response.output_text.delta":
        this.replyLine(ev.item_id).textContent += ev.delta;
        break;
      case "response.output_audio_transcript.done":
        this.replyLine(ev.item_id).textContent = ev.transcript;
        break;
      case "response.output_text.done":
        this.replyLine(ev.item_id).textContent = ev.text;
        break;
      case "output_audio_buffer.started":
        // The server's first reply audio went out on the track: the end of the turn.
        this.playing = true;
        this.replies++;
        if (this.lastSpeechEnd !== null) showLatency("turn", now - this.lastSpeechEnd);
        this.lastSpeechEnd = null;
        this.showPlayback();
        setStatus("Speaking (speak over the reply to interrupt it).");
        break;
      case "output_audio_buffer.stopped":
      case "output_audio_buffer.cleared":
        this.playing = false;
        setStatus(ev.type.endsWith("cleared") ? "Reply interrupted: listening." : "Listening.");
        break;
      case "response.done": {
        this.responding = false;
        const r = ev.response || {};
        if (r.status === "cancelled") {
          // Barge-in or the Interrupt button: the line keeps what was spoken, marked as cut.
          for (const item of r.output || []) {
            const line = this.replyLines.get(item.id);
            if (line) line.after(" (interrupted)");
          }
        }
        if (r.status === "failed") {
          const err = (r.status_details && r.status_details.error) || {};
          showAlert(`The reply failed (${err.code || "error"}: ${err.message || "no reason given"}).`);
        }
        break;
      }
      case "voxserve.tts.fallback":
        setStatus(`The server is degraded (${ev.reason}); it speaks a fallback phrase.`);
        break;
      case "error": {
        const e = ev.error || {};
        showAlert(`Server error ${e.code || e.type}: ${e.message}`);
        break;
      }
      case "voxserve.session.ended":
        this.ended = `Session ended (${ev.reason}): ${ev.received} frames received, ${ev.segments} segments, ${ev.replies} replies.`;
        setStatus(this.ended);
        break;
    }
  }

  replyLine(itemId) {
    let line = this.replyLines.get(itemId);
    if (!line) {
      line = addLine("Assistant", "", "assistant");
      this.replyLines.set(itemId, line);
    }
    return line;
  }

  // The "Interrupt reply" button: stop the response and drop the audio already on its way.
  interrupt() {
    if (this.responding) this.send({ type: "response.cancel" });
    if (this.playing) this.send({ type: "output_audio_buffer.clear" });
  }

  // ------------------------------------------------------------ the end

  // The call ended without hangUp(): reason null when the server ended the session.
  lost(reason) {
    if (this.over) return;
    this.hangUp();
    this.onEnd({ lost: reason !== null, message: reason ?? this.ended });
  }

  // Hang up: DELETE the call's Location (the server frees it now, not at its ICE timeout),
  // then close the peer connection. In that order, so that the DELETE finds the call rather
  // than racing the server noticing the closed connection; the microphone stops at once.
  hangUp() {
    if (this.over) return;
    const deleted = this.deleteCall();
    const pc = this.pc;
    this.close(false);
    const timeout = new Promise((done) => setTimeout(done, 2000));
    Promise.race([deleted, timeout]).finally(() => pc && pc.close());
  }

  // Everything of the call but (closePc false) its peer connection.
  close(closePc = true) {
    this.over = true;
    for (const t of this.timers) clearTimeout(t);
    clearInterval(this.meter);
    clearInterval(this.statsTimer);
    if (this.channel) {
      this.channel.onclose = null;
      this.channel.onmessage = null;
    }
    if (this.pc) {
      this.pc.onconnectionstatechange = null;
      if (closePc) this.pc.close();
    }
    this.pc = null;
    if (this.mic) for (const track of this.mic.getTracks()) track.stop();
    this.mic = null;
    $("reply-audio").srcObject = null;
  }

  // keepalive: the DELETE still goes out when the page is being closed.
  deleteCall() {
    const url = this.location;
    this.location = null;
    if (!url) return Promise.resolve();
    return fetch(url, { method: "DELETE", headers: bearer(this.settings.key), keepalive: true }).catch(() => {});
  }
}
