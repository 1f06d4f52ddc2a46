// voxserve's browser page: microphone -> the server -> transcripts, replies and reply audio,
// over a WebRTC call (webrtc.js, the default where the browser has RTCPeerConnection) or the
// /v1/stream WebSocket (here). Plain ES modules, no build step; every file and request goes
// to this server.

import { $, addLine, app, openMicStream, setPartial, setState, setStatus, showAlert, showLatency, showPlayback as showStats, turnDetection } from "./ui.js";
import { Call, CallError, supported as webrtcSupported } from "./webrtc.js";

const FRAME_MS = 20;
const LEAD_S = 0.05; // how far ahead the first chunk of a reply is scheduled

// ---------------------------------------------------------------- state

let ctx = null; // one AudioContext for capture and playback
let mic = null; // MediaStream
let worklet = null;
let ws = null;
let call = null; // the WebRTC mode's Call
let fellBack = null; // why this session uses the WebSocket though WebRTC was chosen
let running = false; // the user pressed Start and not Stop
let retries = 0;
let retryTimer = null;

let session = null; // per WebSocket session: see newSession()
let replyChunks = 0;
let playedMs = 0;
let underruns = 0;

function newSession() {
  return {
    started: false,
    mode: "assistant",
    seq: 0,
    sentAt: [], // sentAt[seq] = performance.now() when frame `seq` left the page
    vadStart: new Map(), // segment -> mapped client time of the start of speech
    vadEnd: new Map(), // segment -> mapped client time of the end of speech
    gotPartial: new Set(),
    lastSpeechEnd: null, // for the turn latency of the next reply
    // playback
    sampleRate: 16000,
    nextTime: 0, // context time at which the next chunk starts
    sources: new Set(),
    dropAudio: false, // after barge_in, until the next tts.start
    replyFirstChunk: true,
    replyLine: null,
  };
}

// Latency mapping. The server reports speech times (start_ms, end_ms) in audio time: ms since
// the session's first frame. Frame `seq` holds audio [seq*20, seq*20+20) ms, and the page
// records when it sent each frame, so audio time t maps to the client clock as
// sentAt[floor(t / 20)]: the moment the frame holding that instant left the page. Every
// latency below is then "event arrival on the client clock - that mapped moment".
function mapAudioMs(ms) {
  const seq = Math.min(Math.floor(ms / FRAME_MS), session.sentAt.length - 1);
  return seq >= 0 ? session.sentAt[seq] : null;
}

// ---------------------------------------------------------------- UI helpers

function showPlayback() {
  showStats(replyChunks, playedMs, "Playback underruns", String(underruns));
}

// ---------------------------------------------------------------- options

async function loadOptions() {
  for (;;) {
    try {
      const r = await fetch("/web/options.json");
      if (r.ok) return fillOptions(await r.json());
      setStatus("The server is loading its models…");
    } catch {
      setStatus("Cannot reach the server; retrying…");
    }
    await new Promise((ok) => setTimeout(ok, 1000));
  }
}

function fillOptions(opts) {
  const fill = (select, items, selected) => {
    select.replaceChildren();
    for (const [value, label] of items) {
      const o = new Option(label, value, false, value === selected);
      select.append(o);
    }
  };
  fill($("mode"), opts.modes.map((m) => [m, m]), "assistant");
  fill(
    $("voice"),
    opts.voices.map((v) => [v.id, `${v.id} (${v.language}, ${v.engine})`]),
    opts.default_voice,
  );
  fill($("language"), opts.languages.map((l) => [l, l]), opts.languages.includes("en") ? "en" : opts.languages[0]);
  applyTransport();
  setStatus("Ready. Press Start.");
  app.dataset.options = "loaded";
}

// ---------------------------------------------------------------- microphone

async function openMic() {
  if (!window.AudioWorkletNode) {
    throw new Error("This page needs a secure context (https:// or http://localhost) and a browser with AudioWorklet.");
  }
  mic = await openMicStream();
  await ctx.audioWorklet.addModule("/web/capture-worklet.js");
  const source = ctx.createMediaStreamSource(mic);
  worklet = new AudioWorkletNode(ctx, "capture-16k", { numberOfInputs: 1, numberOfOutputs: 1, channelCount: 1 });
  worklet.port.onmessage = (e) => sendFrame(e.data);
  // The worklet must be pulled by the graph to run; a muted gain keeps the mic out of the speakers.
  const mute = ctx.createGain();
  mute.gain.value = 0;
  source.connect(worklet).connect(mute).connect(ctx.destination);
}

function sendFrame(pcm) {
  // Audio captured while there is no started session (connecting, reconnecting) is dropped.
  if (!ws || ws.readyState !== WebSocket.OPEN || !session.started || session.mode === "tts") return;
  const seq = session.seq++;
  const msg = new Uint8Array(4 + pcm.byteLength);
  new DataView(msg.buffer).setUint32(0, seq >>> 0, false); // 4-byte big-endian seq_id
  msg.set(new Uint8Array(pcm), 4); // PCM16 LE: the worklet's Int16Array is little-endian on every browser platform
  ws.send(msg);
  session.sentAt[seq] = performance.now();
}

// ---------------------------------------------------------------- playback

function stopPlayback() {
  for (const src of session.sources) {
    src.onended = null;
    try { src.stop(); } catch { /* already stopped */ }
  }
  session.sources.clear();
  session.nextTime = 0;
}

function playChunk(buf) {
  if (session.dropAudio || buf.byteLength < 2) return;
  const now = performance.now();
  if (session.replyFirstChunk) {
    session.replyFirstChunk = false;
    if (session.lastSpeechEnd !== null) showLatency("turn", now - session.lastSpeechEnd);
    session.lastSpeechEnd = null;
  }
  const pcm = new Int16Array(buf);
  const audio = ctx.createBuffer(1, pcm.length, session.sampleRate);
  const ch = audio.getChannelData(0);
  for (let i = 0; i < pcm.length; i++) ch[i] = pcm[i] / 32768;

  const t = ctx.currentTime;
  if (session.nextTime === 0) {
    session.nextTime = t + LEAD_S; // first chunk of a reply: a small cushion
  } else if (session.nextTime < t) {
    // The queue ran dry mid-reply: the listener hears a gap. Count it and restart the queue.
    underruns++;
    session.nextTime = t + LEAD_S;
  }
  const src = ctx.createBufferSource();
  src.buffer = audio;
  src.connect(ctx.destination);
  src.start(session.nextTime);
  session.nextTime += audio.duration;
  session.sources.add(src);
  src.onended = () => {
    session.sources.delete(src);
    playedMs += audio.duration * 1000;
    showPlayback();
  };
  replyChunks++;
  showPlayback();
}

// ---------------------------------------------------------------- the WebSocket session

function connect() {
  session = newSession();
  session.mode = $("mode").value;
  const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/stream`;
  setState("connecting");
  setStatus(retries ? `Reconnecting (attempt ${retries + 1})…` : "Connecting…");
  // Browsers cannot set headers on a WebSocket: the key travels as the subprotocol
  // voxserve.bearer.<key>, and the server selects voxserve.v1 (never echoing the key).
  const key = $("api-key").value.trim();
  const protocols = key ? ["voxserve.v1", `voxserve.bearer.${key}`] : [];
  const sock = (ws = new WebSocket(url, protocols));
  sock.binaryType = "arraybuffer";
  let lastError = null;

  sock.onopen = () => {
    sock.send(JSON.stringify({
      type: "session.start",
      mode: session.mode,
      sample_rate: 16000,
      encoding: "pcm_s16le",
      voice: $("voice").value || undefined,
      language: $("language").value || undefined,
      turn_detection: turnDetection(),
    }));
  };

  sock.onmessage = (e) => {
    if (sock !== ws) return;
    if (typeof e.data !== "string") return playChunk(e.data);
    const ev = JSON.parse(e.data);
    if (ev.type === "error") lastError = ev;
    onEvent(ev);
  };

  sock.onclose = (e) => {
    if (sock !== ws) return; // an old socket, already replaced
    ws = null;
    stopPlayback();
    if (!running) return;
    const err = lastError ? `${lastError.code}: ${lastError.message}` : e.reason || "no reason given";
    if (e.code === 1013) {
      // Overloaded or not ready: the server says when to try again.
      const wait = Math.max(1000, (lastError && lastError.retry_after_ms) || backoffMs());
      showAlert(`The server refused the session (close 1013, ${err}). Retrying in ${Math.round(wait / 1000)} s.`);
      return scheduleReconnect(wait);
    }
    if (e.code === 1000) return finish("Session ended.");
    if (e.code === 1008 || e.code === 1009) {
      // A refusal that trying again will not fix (bad settings, auth, protocol).
      showAlert(`The server closed the session (close ${e.code}, ${err}).`);
      return finish("Stopped.");
    }
    const wait = backoffMs();
    showAlert(`Connection lost (close ${e.code}${lastError ? ", " + err : ""}). Reconnecting in ${Math.round(wait / 1000)} s with a new session.`);
    scheduleReconnect(wait);
  };
}

function backoffMs() {
  return Math.min(30000, 1000 * 2 ** retries); // 1, 2, 4 ... 30 s
}

function scheduleReconnect(wait) {
  setState("connecting");
  retries++;
  retryTimer = setTimeout(() => {
    retryTimer = null;
    if (!running) return;
    if (app.dataset.transport === "webrtc") placeCall();
    else connect();
  }, wait);
}

function onEvent(ev) {
  const now = performance.now();
  switch (ev.type) {
    case "session.started":
      session.started = true;
      retries = 0;
      showAlert("");
      setState("connected");
      $("say").hidden = session.mode !== "tts";
      setStatus((session.mode === "tts"
        ? `Connected (voice ${ev.voice}). Type a sentence and press Speak.`
        : `Listening (${ev.mode}, voice ${ev.voice}, language ${ev.language}). Speak now.`) +
        (fellBack ? ` Over the WebSocket: ${fellBack}` : ""));
      break;
    case "vad.start":
      session.vadStart.set(ev.segment, mapAudioMs(ev.start_ms));
      setStatus("Hearing you…");
      break;
    case "transcript.partial":
      setPartial(ev.text);
      if (!session.gotPartial.has(ev.segment)) {
        session.gotPartial.add(ev.segment);
        const start = session.vadStart.get(ev.segment);
        if (start != null) showLatency("ttfp", now - start);
      }
      break;
    case "vad.end":
      session.vadEnd.set(ev.segment, mapAudioMs(ev.end_ms));
      break;
    case "transcript.final": {
      setPartial("");
      if (ev.text) addLine("You", ev.text, "user");
      const end = session.vadEnd.get(ev.segment) ?? mapAudioMs(ev.end_ms);
      if (end != null) showLatency("final", now - end);
      session.lastSpeechEnd = end;
      setStatus("Listening.");
      break;
    }
    case "response.delta":
      if (!session.replyLine) session.replyLine = addLine("Assistant", "", "assistant");
      session.replyLine.textContent += ev.text;
      break;
    case "response.text":
      if (!session.replyLine) session.replyLine = addLine("Assistant", "", "assistant");
      session.replyLine.textContent = ev.text;
      session.replyLine = null;
      break;
    case "tts.start":
      session.sampleRate = ev.sample_rate;
      session.dropAudio = false;
      session.replyFirstChunk = true;
      session.nextTime = 0;
      break;
    case "tts.end":
      if (ev.interrupted) setStatus("Reply interrupted.");
      break;
    case "barge_in":
      // The user spoke over the reply: silence it at once and drop what is still in flight.
      stopPlayback();
      session.dropAudio = true;
      setStatus("Interrupted: listening.");
      break;
    case "tts.fallback":
      setStatus(`The server is degraded (${ev.reason}); it speaks a fallback phrase.`);
      break;
    case "error":
      showAlert(`Server error ${ev.code}: ${ev.message}${ev.fatal ? " (session ended)" : ""}`);
      break;
    case "session.ended":
      setStatus(`Session ended: ${ev.received} frames received, ${ev.segments} segments, ${ev.replies} replies.`);
      break;
  }
}

// ---------------------------------------------------------------- the WebRTC call

async function placeCall() {
  setState("connecting");
  setStatus(retries ? `Calling again (attempt ${retries + 1})…` : "Calling the server (WebRTC)…");
  const settings = {
    mode: $("mode").value,
    voice: $("voice").value,
    language: $("language").value,
    turns: turnDetection(),
    key: $("api-key").value.trim(),
  };
  const c = (call = new Call(ctx, settings, (end) => callEnded(c, end)));
  try {
    await c.start();
  } catch (err) {
    c.hangUp();
    if (c !== call || !running) return; // stopped meanwhile
    call = null;
    if (err instanceof CallError && err.fallback) return fallBack(err.message);
    if (err instanceof CallError && err.retryAfterMs !== null) {
      const wait = Math.max(1000, err.retryAfterMs || backoffMs());
      showAlert(`${err.message} Retrying in ${Math.round(wait / 1000)} s.`);
      return scheduleReconnect(wait);
    }
    showAlert(err.message);
    finish("Not started.");
  }
}

function callEnded(c, { lost, message }) {
  if (c !== call) return;
  call = null;
  if (!running) return;
  if (!lost) return finish(message || "Session ended.");
  const wait = backoffMs();
  showAlert(`The call was lost (${message}). Calling again in ${Math.round(wait / 1000)} s with a new session.`);
  scheduleReconnect(wait);
}

// A server without WebRTC (no aiortc, or webrtc.enabled false): the WebSocket still works.
async function fallBack(reason) {
  $("transport").value = "websocket";
  applyTransport();
  app.dataset.transport = "websocket";
  fellBack = reason; // said in the status once the session is there
  setStatus(`${reason} Using the WebSocket instead.`);
  try {
    if ($("mode").value !== "tts" && !mic) await openMic();
  } catch (err) {
    showAlert(err.message);
    return finish("Not started.");
  }
  connect();
}

// WebRTC carries the microphone and replies; the page's text-to-speech mode needs the WebSocket.
function applyTransport() {
  const webrtc = $("transport").value === "webrtc";
  for (const o of $("mode").options) {
    if (o.value !== "tts") continue;
    o.disabled = webrtc;
    o.textContent = webrtc ? "tts (WebSocket only)" : "tts";
  }
  if (webrtc && $("mode").value === "tts") $("mode").value = "assistant";
  $("lat-note").textContent = webrtc ? "" : "WebSocket: timed from when the page sent the audio of the start and end of speech.";
}

// ---------------------------------------------------------------- start / stop

async function start() {
  showAlert("");
  running = true;
  setState("connecting");
  const transport = (app.dataset.transport = $("transport").value);
  fellBack = null;
  try {
    ctx = ctx || new AudioContext();
    await ctx.resume(); // inside the click: browsers allow audio to start here
    if (transport === "websocket" && $("mode").value !== "tts" && !mic) {
      setStatus("Opening the microphone…");
      await openMic();
    }
  } catch (err) {
    running = false;
    setState("idle");
    setStatus("Not started.");
    showAlert(err.message);
    return;
  }
  retries = 0;
  if (transport === "webrtc") placeCall();
  else connect();
}

function finish(text) {
  running = false;
  if (retryTimer) clearTimeout(retryTimer);
  retryTimer = null;
  if (mic) for (const track of mic.getTracks()) track.stop();
  mic = null;
  if (worklet) worklet.disconnect();
  worklet = null;
  setPartial("");
  setState("idle");
  setStatus(text);
}

function stop() {
  const c = call;
  call = null;
  const sock = ws;
  finish("Stopped.");
  // Hang up: close the peer connection and DELETE the call.
  if (c) c.hangUp();
  if (sock && sock.readyState === WebSocket.OPEN) {
    // Let the server finish what it accepted; the close that follows is ignored.
    sock.send(JSON.stringify({ type: "audio.end" }));
    ws = null;
    setTimeout(() => sock.close(1000), 3000);
  }
}

$("settings").addEventListener("submit", (e) => {
  e.preventDefault();
  start();
});
$("stop").addEventListener("click", stop);
$("cancel").addEventListener("click", () => {
  if (call) return call.interrupt();
  // Client barge-in: the server stops the reply (tts.end interrupted).
  if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "cancel" }));
  if (session) {
    stopPlayback();
    session.dropAudio = true;
  }
});
$("transport").addEventListener("change", applyTransport);
// Leaving the page hangs up: the server frees the call now, not at its ICE timeout.
window.addEventListener("pagehide", () => {
  if (call) call.hangUp();
});
$("say").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("say-text").value.trim();
  if (text && ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "text", text, flush: true }));
});

// ---------------------------------------------------------------- server panel

// P99 from cumulative Prometheus buckets, interpolated inside the bucket that crosses 99 %
// (as Prometheus' histogram_quantile does). Returns seconds, or Infinity past the last bound.
function p99(buckets) {
  const sorted = [...buckets].sort((a, b) => a[0] - b[0]);
  const total = sorted.length ? sorted[sorted.length - 1][1] : 0;
  if (!total) return null;
  const rank = 0.99 * total;
  let prevLe = 0;
  let prevCount = 0;
  for (const [le, count] of sorted) {
    if (count >= rank) {
      if (le === Infinity) return Infinity;
      return prevLe + ((le - prevLe) * (rank - prevCount)) / Math.max(1e-9, count - prevCount);
    }
    prevLe = le;
    prevCount = count;
  }
  return Infinity;
}

function parseMetrics(text) {
  let sessions = 0;
  const stages = new Map(); // stage -> [[le, cumulative count], ...]
  for (const line of text.split("\n")) {
    if (line.startsWith("voxserve_sessions_active{")) {
      sessions += Number(line.slice(line.lastIndexOf(" ") + 1));
    } else if (line.startsWith("voxserve_stage_latency_seconds_bucket{")) {
      const stage = /stage="([^"]*)"/.exec(line);
      const le = /le="([^"]*)"/.exec(line);
      if (!stage || !le) continue;
      const workClass = /work_class="([^"]*)"/.exec(line);
      // one row per stage and work class: "tts", "tts (bulk)"
      const name = workClass && workClass[1] !== "live" ? `${stage[1]} (${workClass[1]})` : stage[1];
      const bound = le[1] === "+Inf" ? Infinity : Number(le[1]);
      const count = Number(line.slice(line.lastIndexOf(" ") + 1));
      if (!stages.has(name)) stages.set(name, []);
      stages.get(name).push([bound, count]);
    }
  }
  return { sessions, stages };
}

async function pollServer() {
  try {
    const r = await fetch("/metrics", { cache: "no-store" });
    if (!r.ok) throw new Error(String(r.status));
    const { sessions, stages } = parseMetrics(await r.text());
    $("srv-sessions").textContent = String(sessions);
    const rows = [];
    for (const [stage, buckets] of [...stages].sort()) {
      const q = p99(buckets);
      const calls = Math.max(...buckets.map((b) => b[1]));
      const tr = document.createElement("tr");
      const th = document.createElement("th");
      th.scope = "row";
      th.textContent = stage;
      const cell = (text) => {
        const td = document.createElement("td");
        td.textContent = text;
        return td;
      };
      const shown = q === null ? "–" : q === Infinity ? "> 10 s" : `${Math.round(q * 1000)} ms`;
      tr.append(th, cell(shown), cell(String(calls)));
      rows.push(tr);
    }
    $("srv-stages").tBodies[0].replaceChildren(...rows);
  } catch {
    $("srv-sessions").textContent = "unavailable";
  }
}

if (!webrtcSupported) {
  // No RTCPeerConnection in this browser: the WebSocket is the only way.
  $("transport").value = "websocket";
  $("transport").options[0].disabled = true;
}
applyTransport();
setState("idle");
showPlayback();
loadOptions();
pollServer();
setInterval(pollServer, 2000);
