// What both connection modes share: the page's status, alert, transcript and latency panel,
// and opening the microphone (one getUserMedia call, with the browser's own echo cancellation,
// noise suppression and gain control, and one set of messages for its failures).

export const $ = (id) => document.getElementById(id);
export const app = $("app");

export function setStatus(text) {
  $("status").textContent = text;
}

export function showAlert(text) {
  const el = $("alert");
  el.textContent = text;
  el.hidden = !text;
}

export function setState(state) {
  app.dataset.state = state;
  const busy = state !== "idle";
  $("start").disabled = busy;
  $("stop").disabled = !busy;
  $("cancel").disabled = state !== "connected";
  for (const id of ["transport", "mode", "voice", "language", "turns"]) $(id).disabled = busy;
}

// The "End of turn" choice as a turn_detection ({type, eagerness} or {type}); both the
// WebSocket's session.start and the Realtime API's session.update take it.
export function turnDetection() {
  const [type, eagerness] = $("turns").value.split(":");
  return eagerness ? { type, eagerness } : { type };
}

// A finished line of the conversation; returns its text span (a reply's line grows in place).
export function addLine(who, text, cls) {
  const li = document.createElement("li");
  li.className = cls;
  const w = document.createElement("span");
  w.className = "who";
  w.textContent = who + ":";
  const t = document.createElement("span");
  t.className = "text";
  t.textContent = text;
  li.append(w, " ", t);
  $("transcript").append(li);
  li.scrollIntoView({ block: "nearest" });
  return t;
}

export function setPartial(text) {
  $("partial").textContent = text;
}

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

const turns = { ttfp: [], final: [], turn: [] };

// kind: "ttfp" (first partial), "final" (final transcript) or "turn" (end of speech -> reply
// audio). Shows the last figure with the median of this page's turns.
export function showLatency(kind, ms) {
  turns[kind].push(ms);
  const med = median(turns[kind]);
  $("lat-" + kind).textContent = `${Math.round(ms)} ms (${Math.round(med)} ms)`;
}

// Reply playback figures: how many reply chunks (WebSocket) or replies (WebRTC) arrived, how
// much reply audio was heard, and the third row: underruns (WebSocket) or the network's
// losses the browser concealed (WebRTC).
export function showPlayback(chunks, playedMs, lossLabel, lossText) {
  app.dataset.replyChunks = String(chunks);
  app.dataset.replyPlayedMs = String(Math.round(playedMs));
  $("lat-played").textContent = `${Math.round(playedMs)} ms`;
  $("lat-loss-label").textContent = lossLabel;
  $("lat-underruns").textContent = lossText;
}

export async function openMicStream() {
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
    throw new Error("This page needs a secure context (https:// or http://localhost) to use the microphone.");
  }
  try {
    return await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
    });
  } catch (err) {
    if (err.name === "NotAllowedError" || err.name === "SecurityError") {
      throw new Error("Microphone access was denied. Allow the microphone for this site in the browser's settings, then press Start again.");
    }
    if (err.name === "NotFoundError") throw new Error("No microphone was found.");
    throw new Error(`The microphone could not be opened (${err.name}: ${err.message}).`);
  }
}
