// Number, time and text formatting shared by the pages.

export const ERROR_KINDS = {
  1: "invalid config",
  2: "host compile",
  3: "device compile",
  4: "runtime",
  5: "wrong answer",
  6: "build timeout",
  7: "run timeout",
  8: "unknown",
};

export const ERROR_COLORS = {
  1: "#a2a8b3", 2: "#ff9830", 3: "#f2cc0c", 4: "#ff6b7d",
  5: "#e05bd6", 6: "#b877d9", 7: "#8ab8ff", 8: "#6f7683",
};

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

export function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

export function gflops(value) {
  if (value == null || !Number.isFinite(value)) return "—";
  if (value >= 100) return value.toFixed(0);
  if (value >= 10) return value.toFixed(1);
  return value.toFixed(2);
}

export function latency(seconds) {
  if (seconds == null || !Number.isFinite(seconds)) return "—";
  if (seconds >= 1) return `${seconds.toFixed(2)} s`;
  if (seconds >= 1e-3) return `${(seconds * 1e3).toFixed(seconds >= 0.1 ? 0 : 2)} ms`;
  return `${(seconds * 1e6).toFixed(seconds >= 1e-4 ? 0 : 1)} µs`;
}

// Tick labels in one unit chosen from the largest tick.
export function latencyTicks(ticks) {
  const top = Math.max(...ticks);
  const [scale, unit] = top >= 1 ? [1, "s"] : top >= 1e-3 ? [1e3, "ms"] : [1e6, "µs"];
  return (value) => (value === 0 ? "0" : `${+(value * scale).toPrecision(3)} ${unit}`);
}

export function percent(fraction, digits = 0) {
  if (fraction == null || !Number.isFinite(fraction)) return "—";
  return `${(fraction * 100).toFixed(digits)}%`;
}

export function count(value) {
  return (value ?? 0).toLocaleString("en-US");
}

export function parseTime(iso) {
  return iso ? Date.parse(iso) : NaN;
}

// The offset between the server's clock and this browser's, so "ago" is right on both.
let clockOffsetMs = 0;
export function syncClock(serverIso) {
  const server = parseTime(serverIso);
  if (Number.isFinite(server)) clockOffsetMs = server - Date.now();
}
export function serverNow() {
  return Date.now() + clockOffsetMs;
}

export function duration(ms) {
  if (!Number.isFinite(ms) || ms < 0) return "—";
  const s = Math.round(ms / 1000);
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${s % 60 ? `${s % 60} s` : ""}`.trim();
  const h = Math.floor(m / 60);
  if (h < 48) return `${h} h ${m % 60} min`;
  return `${Math.floor(h / 24)} d ${h % 24} h`;
}

export function ago(iso) {
  const t = parseTime(iso);
  if (!Number.isFinite(t)) return "never";
  const ms = serverNow() - t;
  return ms < 1500 ? "just now" : `${duration(ms)} ago`;
}

export function clock(iso) {
  const t = parseTime(iso);
  if (!Number.isFinite(t)) return "—";
  const d = new Date(t);
  const today = new Date(serverNow()).toDateString() === d.toDateString();
  const time = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
  return today ? time : `${d.toLocaleDateString()} ${time}`;
}

export function timeCell(iso) {
  if (!iso) return `<span class="muted">—</span>`;
  return `<time datetime="${esc(iso)}" title="${esc(new Date(parseTime(iso)).toString())}">${esc(clock(iso))}</time>`;
}

export function badge(status) {
  return `<span class="badge ${esc(status)}">${esc(status)}</span>`;
}

export function progress(done, budget, finished) {
  const fraction = budget ? Math.min(1, done / budget) : 0;
  return `<div class="progress-cell"><div class="progress${finished ? " done" : ""}" role="progressbar"
    aria-valuemin="0" aria-valuemax="${budget}" aria-valuenow="${done}"
    aria-label="${done} of ${budget} trials"><span style="width:${(fraction * 100).toFixed(1)}%"></span></div>
    <span class="nowrap">${count(done)} / ${count(budget)}</span></div>`;
}

// "±4%" after a latency: how far apart the samples behind it were (slowest vs fastest); a
// noisy result (the machine was busy while it was timed) is marked.
export function spread(value, noisy = false) {
  if (value == null || !Number.isFinite(value)) return noisy ? ` <span class="warn" title="the machine was not quiet while this was timed">noisy</span>` : "";
  const text = `±${(value * 100).toFixed(value < 0.1 ? 1 : 0)}%`;
  const title = `samples ${text} apart (slowest vs fastest)${noisy ? "; the machine was not quiet while this was timed" : ""}`;
  return ` <span class="sub${noisy || value > 0.1 ? " warn" : ""}" title="${title}">${text}${noisy ? " noisy" : ""}</span>`;
}
