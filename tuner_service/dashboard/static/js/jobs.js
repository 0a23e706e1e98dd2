// The jobs list: status, target, device, progress, times, and each model's current estimate.

import { getJSON } from "./api.js";
import { badge, count, duration, esc, latency, parseTime, progress, serverNow, syncClock, timeCell } from "./format.js";

const ACTIVE = new Set(["queued", "running"]);

function elapsed(job) {
  const start = parseTime(job.started_at);
  if (!Number.isFinite(start)) return "—";
  const end = job.finished_at ? parseTime(job.finished_at) : serverNow();
  return duration(end - start);
}

function what(job) {
  const name = job.model_name ? esc(job.model_name) : `<span class="muted">workload list</span>`;
  return `${name}<span class="sub">${count(job.tasks)} task${job.tasks === 1 ? "" : "s"} · ${esc(job.tuner)}</span>`;
}

function row(job) {
  const finished = !ACTIVE.has(job.status);
  return `<tr>
    <td><a href="/jobs/${job.job_id}">Job ${job.job_id}</a></td>
    <td>${what(job)}</td>
    <td>${badge(job.status)}${job.message ? `<span class="sub" title="${esc(job.message)}">${esc(job.message.slice(0, 60))}</span>` : ""}</td>
    <td><code>${esc(job.target)}</code></td>
    <td>${job.device_key ? esc(job.device_key) : `<span class="muted">any</span>`}</td>
    <td>${progress(job.trials_done, job.trials_budget, finished && job.status === "done")}</td>
    <td class="num">${latency(job.estimated_latency_s)}</td>
    <td>${timeCell(job.created_at)}</td>
    <td>${timeCell(job.started_at)}</td>
    <td>${timeCell(job.finished_at)}</td>
    <td class="num nowrap">${elapsed(job)}</td>
  </tr>`;
}

export function jobsPage({ main, poll }) {
  document.title = "Jobs · tuner";
  main.innerHTML = `<div class="page-head"><h1>Jobs</h1>
      <div class="meta" id="jobs-meta"></div></div>
    <div class="panel"><div class="table-wrap"><table id="jobs-table">
      <caption>Newest first. The estimate is the sum over tasks of weight × best latency.</caption>
      <thead><tr><th scope="col">Job</th><th scope="col">Model</th><th scope="col">Status</th>
        <th scope="col">Target</th><th scope="col">Device</th><th scope="col">Trials</th>
        <th scope="col" class="num">Est. latency</th><th scope="col">Created</th>
        <th scope="col">Started</th><th scope="col">Finished</th><th scope="col" class="num">Elapsed</th></tr></thead>
      <tbody></tbody></table></div></div>`;
  const body = main.querySelector("tbody");
  const meta = main.querySelector("#jobs-meta");
  poll(async (signal) => {
    const data = await getJSON("/api/v1/dashboard/jobs", signal);
    syncClock(data.server_time);
    const jobs = data.jobs;
    const running = jobs.filter((j) => j.status === "running").length;
    meta.innerHTML = `<span><b>${jobs.length}</b> jobs</span><span><b>${running}</b> running</span>`;
    body.innerHTML = jobs.length ? jobs.map(row).join("") :
      `<tr><td colspan="11" class="message">No jobs yet. Submit one with <code>tuner submit model.onnx</code> or <code>POST /api/v1/jobs</code>.</td></tr>`;
  }, 3000);
}
