// The shared tuning log: the best known config per (workload, target), filterable, downloadable.

import { getJSON, query } from "./api.js";
import { ago, esc, gflops, latency, spread, syncClock } from "./format.js";
import { pretty } from "./job.js";

function recordsLink(params, text, filename) {
  const href = `/api/v1/records${query(params)}`;
  return `<a href="${esc(href)}" data-auth-download="${esc(filename)}" download="${esc(filename)}">${esc(text)}</a>`;
}

function row(e) {
  const job = e.job_id ? `<a href="/jobs/${e.job_id}">Job ${e.job_id}</a>` : `<span class="muted">imported</span>`;
  const name = `${e.op}-${e.target}`.replace(/[^A-Za-z0-9_.-]+/g, "_");
  return `<tr>
    <td><code>${esc(e.op)}</code></td>
    <td class="workload">${esc(pretty(e.description))}<span class="sub mono">${esc(e.workload)}</span></td>
    <td><code>${esc(e.target)}</code></td>
    <td class="num best-text">${gflops(e.gflops)}</td>
    <td class="num">${latency(e.mean_cost)}${spread(e.spread)}</td>
    <td>${esc(e.template)} <span class="muted">v${e.template_version}</span>
      <span class="sub">config ${esc(e.config?.index ?? "")}</span></td>
    <td>${esc(e.device_key || "—")}<span class="sub mono" title="device class, threads">${esc(e.device_class || "")}${e.threads ? ` · ${e.threads} thr` : ""}</span></td>
    <td class="nowrap" title="${esc(e.updated_at || "")}">${esc(ago(e.updated_at))}</td>
    <td class="nowrap">${job}</td>
    <td>${recordsLink({ workload: e.workload, target: e.target }, "records", `records-${name}.jsonl`)}</td></tr>`;
}

function matches(entry, text) {
  if (!text) return true;
  const hay = `${entry.workload} ${entry.description} ${pretty(entry.description)}`.toLowerCase();
  return text.toLowerCase().split(/\s+/).every((word) => hay.includes(word));
}

function options(values, selected, all) {
  return `<option value="">${all}</option>` + values.map((v) =>
    `<option value="${esc(v)}"${v === selected ? " selected" : ""}>${esc(v)}</option>`).join("");
}

export function logPage({ main, poll }) {
  document.title = "Tuning log · tuner";
  const url = new URL(location.href);
  const filters = { op: url.searchParams.get("op") || "", target: url.searchParams.get("target") || "",
    text: url.searchParams.get("q") || "" };
  main.innerHTML = `<div class="page-head"><h1>Shared tuning log</h1><div class="meta" id="log-meta"></div>
      <div class="actions" id="log-actions"></div></div>
    <div class="panel"><form class="filters" role="search" aria-label="Filter the tuning log">
      <label>Operator<select name="op"></select></label>
      <label>Target<select name="target"></select></label>
      <label>Workload<input type="search" name="q" placeholder="e.g. conv2d 64 56×56 or C=64"
        value="${esc(filters.text)}"></label></form>
      <div class="table-wrap"><table><caption>The best known config per workload and target, across all jobs and imports.</caption>
      <thead><tr><th scope="col">Operator</th><th scope="col">Workload</th><th scope="col">Target</th>
        <th scope="col" class="num">GFLOPS</th><th scope="col" class="num">Latency</th>
        <th scope="col">Template</th><th scope="col">Device</th><th scope="col">Found</th>
        <th scope="col">By</th><th scope="col">Download</th></tr></thead>
      <tbody></tbody></table></div></div>`;
  const form = main.querySelector("form");
  let latest = null;

  const show = () => {
    if (!latest) return;
    form.op.innerHTML = options(latest.ops, filters.op, "all operators");
    form.target.innerHTML = options(latest.targets, filters.target, "all targets");
    const rows = latest.entries.filter((e) => matches(e, filters.text));
    main.querySelector("#log-meta").innerHTML = `<span><b>${rows.length}</b> of ${latest.entries.length} shown</span>`;
    main.querySelector("#log-actions").innerHTML = recordsLink({ target: filters.target },
      filters.target ? `Download all ${filters.target} records` : "Download all records",
      `records${filters.target ? `-${filters.target}` : ""}.jsonl`).replace("<a ", `<a class="button" `);
    main.querySelector("tbody").innerHTML = rows.length ? rows.map(row).join("") :
      `<tr><td colspan="10" class="message">Nothing matches. Tuned configs land here as jobs measure them.</td></tr>`;
  };

  form.addEventListener("input", () => {
    filters.op = form.op.value;
    filters.target = form.target.value;
    filters.text = form.q.value.trim();
    const params = query({ op: filters.op, target: filters.target, q: filters.text });
    history.replaceState(null, "", `/tuning-log${params}`);
    if (latest && (latest.op !== filters.op || latest.target !== filters.target)) refresh();
    else show();
  });
  form.addEventListener("submit", (event) => event.preventDefault());

  let refresh = () => {};
  poll(async (signal) => {
    refresh = async () => {
      const data = await getJSON(`/api/v1/dashboard/tuning-log${query({ op: filters.op, target: filters.target })}`, signal);
      syncClock(data.server_time);
      latest = { ...data, op: filters.op, target: filters.target };
      show();
    };
    await refresh();
  }, 10000);
}
