// Workers: where they run, whether they are alive, how fast they measure and how often they fail.

import { getJSON } from "./api.js";
import { ERROR_COLORS, ERROR_KINDS, ago, badge, count, esc, gflops, percent, syncClock } from "./format.js";

function hardware(hw) {
  const parts = [];
  if (hw.cpu_model) parts.push(esc(hw.cpu_model));
  const facts = [];
  if (hw.threads) facts.push(`${hw.threads} threads`);
  if (hw.vector_bits) facts.push(`${hw.vector_bits}-bit vectors`);
  const peaks = hw.peak_gflops && typeof hw.peak_gflops === "object" ? Object.entries(hw.peak_gflops) : [];
  if (peaks.length) {
    const [threads, peak] = peaks[peaks.length - 1];
    facts.push(`peak ${gflops(peak)} GFLOPS on ${threads} thread${threads === "1" ? "" : "s"}`);
  }
  if (!parts.length && !facts.length) return `<span class="muted">—</span>`;
  return `${parts.join("")}<span class="sub">${esc(facts.join(" · "))}</span>`;
}

function errorMix(worker) {
  const total = worker.measured_last_hour;
  const kinds = Object.entries(worker.errors_last_hour).sort((a, b) => b[1] - a[1]);
  if (!total) return `<span class="muted">no results in the last hour</span>`;
  const failed = kinds.reduce((s, [, n]) => s + n, 0);
  const bar = kinds.map(([k, n]) =>
    `<span style="width:${((n / total) * 100).toFixed(2)}%;background:${ERROR_COLORS[k] || "#888"}"></span>`).join("");
  const text = kinds.length
    ? kinds.map(([k, n]) => `${esc(ERROR_KINDS[k] || `kind ${k}`)} ${percent(n / total, 1)}`).join(" · ")
    : "no errors";
  return `<div class="errbar" role="img" aria-label="errors ${percent(failed / total, 1)} of ${total}: ${esc(text)}">${bar}</div>
    <span class="kinds">${percent(failed / total, 1)} failed · ${esc(text)}</span>`;
}

// The worker's median seconds per candidate for each part of its pipeline (newest results).
const PARTS = [["wait_s", "wait"], ["claim_s", "claim"], ["build_s", "build"], ["check_s", "check"],
  ["measure_s", "measure"], ["report_s", "report"]];

function seconds(s) {
  return s >= 1 ? `${s.toFixed(2)} s` : `${(s * 1e3).toFixed(s >= 0.01 ? 0 : 1)} ms`;
}

function timeSplit(worker) {
  const medians = worker.timing_medians_s || {};
  const known = PARTS.filter(([key]) => typeof medians[key] === "number");
  if (!known.length) return `<span class="muted">—</span>`;
  return `<span class="kinds">${known.map(([key, label]) => `${label} ${esc(seconds(medians[key]))}`).join(" · ")}</span>`;
}

function row(w) {
  return `<tr>
    <td class="nowrap">${esc(w.name || "worker")} <span class="muted">#${w.worker_id}</span>
      <span class="sub">${esc(w.software?.backend || "")}</span></td>
    <td>${esc(w.device_key)}</td>
    <td><code>${esc(w.target)}</code></td>
    <td>${badge(w.online ? "online" : "offline")}</td>
    <td class="nowrap" title="${esc(w.last_heartbeat || "")}">${esc(ago(w.last_heartbeat))}</td>
    <td>${hardware(w.hardware || {})}</td>
    <td class="num">${w.candidates_per_min.toFixed(1)}</td>
    <td class="num">${count(w.measured_last_hour)}</td>
    <td style="min-width:220px">${errorMix(w)}</td>
    <td style="min-width:180px">${timeSplit(w)}</td></tr>`;
}

export function workersPage({ main, poll }) {
  document.title = "Workers · tuner";
  main.innerHTML = `<div class="page-head"><h1>Workers</h1><div class="meta" id="workers-meta"></div></div>
    <div class="panel"><div class="table-wrap"><table>
      <caption id="workers-caption"></caption>
      <thead><tr><th scope="col">Worker</th><th scope="col">Device key</th><th scope="col">Target</th>
        <th scope="col">State</th><th scope="col">Last heartbeat</th><th scope="col">Hardware</th>
        <th scope="col" class="num">Candidates / min</th><th scope="col" class="num">Measured (1 h)</th>
        <th scope="col">Error rate by kind (1 h)</th>
        <th scope="col">Time per candidate (median)</th></tr></thead>
      <tbody></tbody></table></div></div>`;
  const body = main.querySelector("tbody");
  poll(async (signal) => {
    const data = await getJSON("/api/v1/dashboard/workers", signal);
    syncClock(data.server_time);
    const workers = data.workers;
    const online = workers.filter((w) => w.online).length;
    main.querySelector("#workers-meta").innerHTML =
      `<span><b>${online}</b> online</span><span><b>${workers.length - online}</b> offline</span>`;
    main.querySelector("#workers-caption").textContent =
      `Online means a heartbeat within ${3 * data.heartbeat_s} s. Candidates per minute and time split over the last ${data.rate_window_s / 60} minutes.`;
    body.innerHTML = workers.length ? workers.map(row).join("") :
      `<tr><td colspan="10" class="message">No worker has registered. Attach one with <code>tuner worker --server URL --token TOKEN</code>.</td></tr>`;
  }, 5000);
}
