// One job: per-task GFLOPS charts, the task table and the model's estimated latency over time.
// Points arrive incrementally (``since_id``); the page keeps every point it has seen.

import { getJSON } from "./api.js";
import { TimeChart, TrialChart } from "./charts.js";
import {
  ERROR_KINDS, badge, count, duration, esc, gflops, latency, latencyTicks, parseTime, percent, progress,
  serverNow, spread, syncClock, timeCell,
} from "./format.js";

const FINAL = new Set(["done", "failed", "cancelled"]);
const RATE_WINDOW_MS = 5 * 60 * 1000;
const FAST_ALGORITHM = "effective GFLOPS: a fast algorithm does fewer multiplications than the direct convolution counted here";
const ABOVE_PEAK = "the worker's peak reading looks too low (taken while the device was busy?)";

export function pretty(text) {
  return String(text).replace(/->/g, "→").replace(/(\d)x(\d)/g, "$1×$2");
}

// A shorter form for chart titles.
function short(text) {
  return pretty(text).replace(" channels", " ch").replace(" input", "").replace(/ \(weights [^)]*\)/, "")
    .replace(", fused ", " · ").replace("residual add", "residual").replace(/ \+ /g, "+");
}

class JobState {
  constructor() {
    this.job = null;
    this.tasks = [];
    this.seen = new Set();
    this.byTask = new Map(); // task id -> points sorted by id
    this.cursor = 0;
  }

  merge(data) {
    this.job = data;
    this.tasks = data.tasks;
    const flops = new Map(this.tasks.map((t) => [t.task_id, t.flops]));
    const changed = new Set();
    for (const [id, task, cost, error, time, config] of data.points) {
      if (this.seen.has(id)) continue;
      this.seen.add(id);
      const ok = !error && cost > 0;
      const point = { id, task, latency: cost, error: error || 0, time, config,
        gflops: ok ? flops.get(task) / cost / 1e9 : 0, message: data.errors[id] || "" };
      if (!this.byTask.has(task)) this.byTask.set(task, []);
      this.byTask.get(task).push(point);
      changed.add(task);
    }
    for (const task of changed) {
      const list = this.byTask.get(task);
      list.sort((a, b) => a.id - b.id);
      list.forEach((p, i) => { p.trial = i + 1; });
    }
    this.cursor = data.cursor;
    return changed;
  }

  points(taskId) {
    return this.byTask.get(taskId) || [];
  }

  all() {
    return [...this.byTask.values()].flat();
  }

  // The model's estimate each time it changed: sum of weight x best latency, once every tunable
  // task has a valid measurement.
  estimateSeries() {
    const tunable = this.tasks.filter((t) => t.status !== "skipped");
    const weight = new Map(tunable.map((t) => [t.task_id, t.weight]));
    const ok = this.all().filter((p) => !p.error && p.latency > 0 && weight.has(p.task))
      .map((p) => ({ ...p, ms: parseTime(p.time) }))
      .sort((a, b) => a.ms - b.ms || a.id - b.id);
    const best = new Map();
    const series = [];
    for (const p of ok) {
      if (best.has(p.task) && best.get(p.task) <= p.latency) continue;
      best.set(p.task, p.latency);
      if (best.size < weight.size) continue;
      let sum = 0;
      for (const [task, cost] of best) sum += weight.get(task) * cost;
      series.push({ t: p.ms, v: sum, note: `${pretty(this.label(p.task))} improved` });
    }
    return series;
  }

  label(taskId) {
    const index = this.tasks.findIndex((t) => t.task_id === taskId);
    return index < 0 ? `task ${taskId}` : `T${index + 1}`;
  }
}

function header(job) {
  const started = parseTime(job.started_at);
  const end = job.finished_at ? parseTime(job.finished_at) : serverNow();
  const title = job.model_name ? esc(job.model_name) : "workload list";
  return `<h1>Job ${job.job_id} <span class="muted">· ${title}</span></h1> ${badge(job.status)}
    <div class="meta">
      <span>target <b>${esc(job.target)}</b></span>
      <span>device <b>${esc(job.device_key || "any")}</b></span>
      <span>tuner <b>${esc(job.tuner)}</b></span>
      <span>started <b>${timeCell(job.started_at)}</b></span>
      <span>${job.finished_at ? "took" : "running for"} <b>${Number.isFinite(started) ? duration(end - started) : "—"}</b></span>
    </div>
    <div class="actions">
      <a class="button" href="/api/v1/jobs/${job.job_id}/configs" data-auth-download="job-${job.job_id}-configs.json">Best configs (JSON)</a>
      <a class="button" href="/api/v1/jobs/${job.job_id}/configs?format=autotvm" data-auth-download="job-${job.job_id}-autotvm.jsonl">AutoTVM log</a>
    </div>
    ${job.message ? `<p class="notice" style="flex-basis:100%">${esc(job.message)}</p>` : ""}
    ${job.health ? `<p class="notice health" style="flex-basis:100%">${esc(job.health.message)}</p>` : ""}`;
}

function kpis(state) {
  const tasks = state.tasks.filter((t) => t.status !== "skipped");
  const done = tasks.reduce((s, t) => s + t.trials_done, 0);
  const budget = tasks.reduce((s, t) => s + t.trials_budget, 0);
  const measured = tasks.filter((t) => t.best_latency_s);
  const series = state.estimateSeries();
  const now = series.length ? series[series.length - 1].v : null;
  const first = series.length ? series[0].v : null;
  const all = state.all();
  const errors = all.filter((p) => p.error);
  const byKind = {};
  for (const p of errors) byKind[p.error] = (byKind[p.error] || 0) + 1;
  const kinds = Object.entries(byKind).sort((a, b) => b[1] - a[1]).slice(0, 2)
    .map(([k, n]) => `${ERROR_KINDS[k] || k} ${n}`).join(", ");
  // over the last 5 minutes, or since the job started when that is sooner
  const started = parseTime(state.job.started_at);
  const windowMs = Math.min(RATE_WINDOW_MS, Number.isFinite(started) ? serverNow() - started : RATE_WINDOW_MS);
  const since = serverNow() - windowMs;
  const recent = all.filter((p) => parseTime(p.time) >= since).length;
  const final = FINAL.has(state.job.status);
  const took = parseTime(state.job.finished_at) - started;
  const rate = final ? (took > 0 ? (all.length / took) * 60000 : null)
    : windowMs > 10000 ? (recent / windowMs) * 60000 : null;
  const peaks = tasks.filter((t) => t.fraction_of_peak != null);
  const direct = peaks.filter((t) => t.best_algorithm == null || t.best_algorithm === "direct");
  const bestPeak = direct.length ? Math.max(...direct.map((t) => t.fraction_of_peak)) : null;
  const estimateSub = now == null ? `${measured.length} of ${tasks.length} tasks measured`
    : first > now ? `${(first / now).toFixed(2)}× faster than the first estimate (${latency(first)})` : "first estimate";
  return `
    <div class="kpi"><div class="label">Estimated model latency</div>
      <div class="value best">${latency(now)}</div><div class="sub">${esc(estimateSub)}</div></div>
    <div class="kpi"><div class="label">Trials</div><div class="value">${count(done)} <span class="muted" style="font-size:15px">/ ${count(budget)}</span></div>
      <div class="sub">${percent(budget ? done / budget : 0)} of the budget · ${tasks.length} tasks</div></div>
    <div class="kpi"><div class="label">Throughput</div><div class="value">${rate == null ? "—" : rate.toFixed(1)}</div>
      <div class="sub">candidates per minute${final ? ", whole run" : windowMs < RATE_WINDOW_MS ? " since the start" : " (last 5 min)"}</div></div>
    <div class="kpi"><div class="label">Errors</div><div class="value${errors.length ? " bad" : ""}">${count(errors.length)}</div>
      <div class="sub">${all.length ? percent(errors.length / all.length, 1) : "—"} of measured${kinds ? ` · ${esc(kinds)}` : ""}</div></div>
    ${bestPeak != null ? `<div class="kpi"><div class="label">Best fraction of device peak</div>
      <div class="value${bestPeak > 1 ? " warn" : ""}">${percent(bestPeak)}</div>
      <div class="sub">${bestPeak > 1 ? "over 100%: the worker's peak reading looks too low" : "of the peak the worker measured"}</div></div>` : ""}`;
}

function taskRow(state, task, index) {
  const errors = state.points(task.task_id).filter((p) => p.error).length;
  const fast = task.best_algorithm != null && task.best_algorithm !== "direct";
  const above = task.fraction_of_peak > 1 && !fast;
  const note = fast ? `; ${FAST_ALGORITHM} (${task.best_algorithm})` : above ? `; ${ABOVE_PEAK}` : "";
  const peak = task.fraction_of_peak != null
    ? `<span class="${above ? "warn" : ""}" title="device peak ${gflops(task.peak_gflops)} GFLOPS${note}">${percent(task.fraction_of_peak, task.fraction_of_peak < 0.1 ? 1 : 0)}${above ? " ⚠" : ""}${fast ? " *" : ""}</span>`
    : `<span class="muted" title="the worker reported no peak">—</span>`;
  return `<tr>
    <td><a href="#task-${task.task_id}" aria-label="chart of task T${index + 1}">T${index + 1}</a></td>
    <td class="workload">${esc(pretty(task.description))}<span class="sub mono">${esc(task.workload)}</span></td>
    <td class="num">${task.weight}</td>
    <td>${progress(task.trials_done, task.trials_budget, task.status === "done")}</td>
    <td class="num best-text">${gflops(task.best_gflops)}</td>
    <td class="num">${latency(task.best_latency_s)}${spread(task.best_spread, task.best_noisy)}</td>
    <td class="num">${peak}</td>
    <td class="num${errors ? " bad" : ""}">${count(errors)}</td>
    <td>${badge(task.status)}${task.message ? `<span class="sub">${esc(task.message)}</span>` : ""}</td></tr>`;
}

function layout(main) {
  main.innerHTML = `<div class="page-head" id="job-head"></div>
    <div class="kpis" id="job-kpis"></div>
    <div class="panel" style="margin-top:14px"><div class="panel-head"><h2 id="e2e-title">Estimated model latency</h2>
      <span class="hint">sum over tasks of weight × best latency; lower is better</span></div>
      <div id="e2e-chart" aria-labelledby="e2e-title"></div></div>
    <div class="panel"><div class="panel-head"><h2>GFLOPS per trial</h2>
      <div class="legend" aria-hidden="true"><span><i class="l-pt"></i>measured candidate</span>
        <span><i class="l-err">×</i>error</span><span><i class="l-best"></i>best so far</span></div>
      <span class="hint right">hover or focus a chart and use the arrow keys for details</span></div>
      <div class="grid" id="task-charts"></div></div>
    <div class="panel" id="tasks-panel"><div class="panel-head"><h2 id="tasks-title">Tasks</h2></div>
      <div class="table-wrap"><table aria-labelledby="tasks-title"><thead><tr>
        <th scope="col">Task</th><th scope="col">Workload</th><th scope="col" class="num">Weight</th>
        <th scope="col">Trials</th><th scope="col" class="num">Best GFLOPS</th>
        <th scope="col" class="num">Best latency</th><th scope="col" class="num">Of peak</th>
        <th scope="col" class="num">Errors</th><th scope="col">Status</th></tr></thead>
        <tbody id="task-rows"></tbody></table></div></div>`;
}

export function jobPage({ main, params, poll }) {
  const jobId = Number(params[0]);
  document.title = `Job ${jobId} · tuner`;
  const state = new JobState();
  const charts = new Map();
  let e2e = null;

  const ensureCard = (grid, task, index) => {
    if (charts.has(task.task_id)) return charts.get(task.task_id);
    const card = document.createElement("section");
    card.className = "card";
    card.id = `task-${task.task_id}`;
    card.setAttribute("aria-labelledby", `task-${task.task_id}-title`);
    card.innerHTML = `<div class="card-head"><h3 id="task-${task.task_id}-title" title="${esc(task.workload)}">T${index + 1} · ${esc(short(task.description))}</h3></div>
      <div class="card-sub"><span class="trials"></span><span>weight ${task.weight}</span><span class="errs"></span>
      <span class="best"></span></div><div class="plot"></div>`;
    grid.append(card);
    const chart = new TrialChart(card.querySelector(".plot"), { label: `T${index + 1} ${task.description}` });
    charts.set(task.task_id, { card, chart, drawn: -1 });
    return charts.get(task.task_id);
  };

  const render = (changed) => {
    const job = state.job;
    if (!e2e) {
      layout(main);
      e2e = new TimeChart(main.querySelector("#e2e-chart"), {
        label: "Estimated model latency", title: "latency", format: latency, tickFormat: latencyTicks });
    }
    main.querySelector("#job-head").innerHTML = header(job);
    main.querySelector("#job-kpis").innerHTML = kpis(state);
    main.querySelector("#task-rows").innerHTML = state.tasks.map((t, i) => taskRow(state, t, i)).join("");
    const grid = main.querySelector("#task-charts");
    state.tasks.forEach((task, index) => {
      if (task.status === "skipped") return;
      const entry = ensureCard(grid, task, index);
      entry.card.querySelector(".best").textContent = task.best_gflops ? `${gflops(task.best_gflops)} GFLOPS` : "";
      entry.card.querySelector(".trials").textContent = `${task.trials_done} / ${task.trials_budget} trials`;
      const points = state.points(task.task_id);
      const errors = points.filter((p) => p.error).length;
      entry.card.querySelector(".errs").textContent = errors ? `${errors} error${errors === 1 ? "" : "s"}` : "";
      if (changed.has(task.task_id) || entry.drawn !== task.trials_budget) {
        entry.chart.update(points, task.trials_budget, `T${index + 1} ${pretty(task.description)}`);
        entry.drawn = task.trials_budget;
      }
    });
    const end = FINAL.has(job.status) && job.finished_at ? parseTime(job.finished_at) : serverNow();
    e2e.update(state.estimateSeries(), end, "Estimated model latency");
  };

  poll(async (signal) => {
    const changed = new Set();
    let data;
    do {
      data = await getJSON(`/api/v1/dashboard/jobs/${jobId}?since_id=${state.cursor}`, signal);
      syncClock(data.server_time);
      for (const task of state.merge(data)) changed.add(task);
    } while (data.more);
    render(changed);
  }, () => (state.job && FINAL.has(state.job.status) ? 15000 : 2000));
}
