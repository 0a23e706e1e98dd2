// SVG charts drawn by hand: GFLOPS per trial (with errors and the best so far) and a value over
// time (the model's estimated latency). Both redraw on resize and answer mouse and keyboard.

import { ERROR_KINDS, clock, esc, gflops, latency } from "./format.js";

const MARGIN = { left: 46, right: 12, top: 18, bottom: 24 };

export function niceTicks(max, wanted = 4) {
  if (!(max > 0)) return [0, 1];
  const raw = max / wanted;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((f) => f * magnitude).find((s) => s >= raw);
  const ticks = [];
  for (let v = 0; v < max + step * 0.999; v += step) ticks.push(Number(v.toPrecision(12)));
  return ticks;
}

function tickLabel(value) {
  if (value >= 1000) return `${+(value / 1000).toFixed(1)}k`;
  return String(+value.toPrecision(4));
}

class Chart {
  constructor(container, { height, label }) {
    this.container = container;
    this.height = height;
    this.label = label;
    this.selected = null;
    this.titleRoom = 30; // px kept free of tick labels left of the x-axis title
    container.classList.add("chart");
    container.tabIndex = 0;
    container.setAttribute("role", "group");
    this.svgHost = document.createElement("div");
    this.tip = document.createElement("div");
    this.tip.className = "tooltip";
    this.tip.hidden = true;
    this.tip.setAttribute("role", "status");
    container.append(this.svgHost, this.tip);
    container.addEventListener("mousemove", (e) => this.onMouse(e));
    container.addEventListener("mouseleave", () => this.select(null));
    container.addEventListener("keydown", (e) => this.onKey(e));
    container.addEventListener("blur", () => this.select(null));
    this.width = 0;
    if (typeof ResizeObserver !== "undefined") {
      this.resizer = new ResizeObserver(() => {
        if (container.clientWidth !== this.width) this.draw();
      });
      this.resizer.observe(container);
    }
  }

  frame() {
    this.width = this.container.clientWidth || 400;
    const w = this.width, h = this.height;
    return { w, h, x0: MARGIN.left, x1: w - MARGIN.right, y0: h - MARGIN.bottom, y1: MARGIN.top };
  }

  axes(f, xTicks, xOf, xText, yTicks, yOf, yText, yTitle, xTitle) {
    let out = `<g class="axis">`;
    for (const t of yTicks) {
      const y = yOf(t).toFixed(1);
      out += `<line class="gridline" x1="${f.x0}" x2="${f.x1}" y1="${y}" y2="${y}"/>`;
      out += `<text x="${f.x0 - 6}" y="${y}" dy="3.5" text-anchor="end">${esc(yText(t))}</text>`;
    }
    for (const t of xTicks) {
      if (xOf(t) > f.x1 - this.titleRoom) continue; // leave room for the axis title
      const x = xOf(t).toFixed(1);
      out += `<line x1="${x}" x2="${x}" y1="${f.y0}" y2="${f.y0 + 4}"/>`;
      out += `<text x="${x}" y="${f.y0 + 15}" text-anchor="middle">${esc(xText(t))}</text>`;
    }
    out += `<path d="M${f.x0},${f.y1} V${f.y0} H${f.x1}"/>`;
    out += `<text x="${f.x0 - 40}" y="${f.y1 - 9}">${esc(yTitle)}</text>`;
    out += `<text x="${f.x1}" y="${f.y0 + 15}" text-anchor="end">${esc(xTitle)}</text>`;
    return `${out}</g>`;
  }

  showTip(html, px, py) {
    this.tip.innerHTML = html;
    this.tip.hidden = false;
    const w = this.tip.offsetWidth, h = this.tip.offsetHeight;
    const left = px + 14 + w > this.width ? px - 14 - w : px + 14;
    this.tip.style.left = `${Math.max(0, left)}px`;
    this.tip.style.top = `${Math.max(0, Math.min(this.height - h, py - h / 2))}px`;
  }

  onKey(event) {
    const n = this.size();
    if (!n) return;
    const steps = { ArrowRight: 1, ArrowLeft: -1, PageUp: 10, PageDown: -10 };
    let next = this.selected;
    if (event.key in steps) next = (next ?? (steps[event.key] > 0 ? -1 : n)) + steps[event.key];
    else if (event.key === "Home") next = 0;
    else if (event.key === "End") next = n - 1;
    else if (event.key === "Escape") next = null;
    else return;
    event.preventDefault();
    this.select(next == null ? null : Math.max(0, Math.min(n - 1, next)));
  }
}

// GFLOPS of every measured candidate against its trial number.
export class TrialChart extends Chart {
  constructor(container, options) {
    super(container, { height: 190, ...options });
    this.points = [];
    this.budget = 0;
  }

  size() {
    return this.points.length;
  }

  update(points, budget, label) {
    this.points = points;
    this.budget = budget;
    this.label = label;
    this.draw();
  }

  scales() {
    const f = this.frame();
    const xmax = Math.max(this.budget, this.points.length, 1);
    let top = 0;
    for (const p of this.points) if (p.gflops > top) top = p.gflops;
    const yTicks = niceTicks(top * 1.05 || 1);
    const ymax = yTicks[yTicks.length - 1];
    const xOf = (t) => f.x0 + (t / xmax) * (f.x1 - f.x0);
    const yOf = (v) => f.y0 - (v / ymax) * (f.y0 - f.y1);
    return { f, xmax, xOf, yOf, yTicks };
  }

  draw() {
    const { f, xmax, xOf, yOf, yTicks } = this.scales();
    let dots = "", crosses = "", best = -1, line = "", errors = 0, good = 0;
    for (const p of this.points) {
      const x = xOf(p.trial);
      if (p.error) {
        errors += 1;
        const y = f.y0 - 5;
        crosses += `M${(x - 3).toFixed(1)},${(y - 3).toFixed(1)}l6,6m0,-6l-6,6`;
        continue;
      }
      good += 1;
      const y = yOf(p.gflops);
      dots += `M${(x - 2.4).toFixed(1)},${y.toFixed(1)}a2.4,2.4 0 1,0 4.8,0a2.4,2.4 0 1,0 -4.8,0`;
      if (p.gflops > best) {
        line += line ? `H${x.toFixed(1)}V${y.toFixed(1)}` : `M${x.toFixed(1)},${y.toFixed(1)}`;
        best = p.gflops;
      }
    }
    if (line) line += `H${xOf(this.points.length).toFixed(1)}`;
    const summary = this.points.length
      ? `${this.label}: ${this.points.length} trials of ${this.budget}, ${errors} errors, best ${gflops(best)} GFLOPS`
      : `${this.label}: no measurements yet`;
    this.container.setAttribute("aria-label", `${summary}. Arrow keys step through trials.`);
    const empty = this.points.length ? "" :
      `<text class="empty" x="${(f.x0 + f.x1) / 2}" y="${(f.y0 + f.y1) / 2}" text-anchor="middle">waiting for measurements</text>`;
    this.svgHost.innerHTML = `<svg viewBox="0 0 ${f.w} ${f.h}" height="${f.h}" aria-hidden="true"
      data-points="${good}" data-errors="${errors}" data-best="${best > 0 ? best : ""}">
      ${this.axes(f, niceTicks(xmax, 5).filter((t) => t <= xmax), xOf, tickLabel, yTicks, yOf, tickLabel, "GFLOPS", "trial")}
      <path class="pt" d="${dots}"/><path class="err" d="${crosses}"/>
      <path class="bestline" d="${line}"/>${empty}<g class="sel"></g></svg>`;
    if (this.selected != null) this.select(Math.min(this.selected, this.points.length - 1));
  }

  onMouse(event) {
    if (!this.points.length) return;
    const { f, xmax } = this.scales();
    const box = this.container.getBoundingClientRect();
    const trial = Math.round(((event.clientX - box.left - f.x0) / (f.x1 - f.x0)) * xmax);
    this.select(Math.max(0, Math.min(this.points.length - 1, trial - 1)));
  }

  select(index) {
    this.selected = index;
    const layer = this.svgHost.querySelector(".sel");
    if (index == null || index < 0 || !this.points.length) {
      this.tip.hidden = true;
      if (layer) layer.innerHTML = "";
      return;
    }
    const { f, xOf, yOf } = this.scales();
    const p = this.points[index];
    const x = xOf(p.trial), y = p.error ? f.y0 - 5 : yOf(p.gflops);
    layer.innerHTML = `<line class="cursor" x1="${x}" x2="${x}" y1="${f.y1}" y2="${f.y0}"/>
      <circle class="hl" cx="${x}" cy="${y}" r="5"/>`;
    const what = p.error
      ? `<span class="err-text">${esc(ERROR_KINDS[p.error] || `error ${p.error}`)}${p.message ? `: ${esc(p.message)}` : ""}</span>`
      : `<b>${gflops(p.gflops)} GFLOPS</b> · ${latency(p.latency)}`;
    this.showTip(`trial ${p.trial} · config ${p.config}<br>${what}<br><span class="muted">${clock(p.time)}</span>`, x, y);
  }
}

const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400]
  .map((s) => s * 1000);

function timeTicks(start, end, wanted = 6) {
  const step = TIME_STEPS.find((s) => (end - start) / s <= wanted) || TIME_STEPS[TIME_STEPS.length - 1];
  const ticks = [];
  for (let t = Math.ceil(start / step) * step; t <= end; t += step) ticks.push(t);
  return { ticks, step };
}

// A step line over time: the value holds until the next point.
export class TimeChart extends Chart {
  constructor(container, options) {
    super(container, { height: 150, ...options });
    this.titleRoom = 60;
    this.series = [];
    this.end = 0;
    this.title = options.title || "";
    this.format = options.format || String;
    this.tickFormat = options.tickFormat || ((ticks) => this.format);
  }

  size() {
    return this.series.length;
  }

  update(series, end, label) {
    this.series = series;
    this.end = end;
    this.label = label;
    this.draw();
  }

  scales() {
    const f = this.frame();
    const start = this.series.length ? this.series[0].t : 0;
    const end = Math.max(this.end, start + 1000);
    let top = 0;
    for (const p of this.series) if (p.v > top) top = p.v;
    const yTicks = niceTicks(top * 1.05 || 1);
    const ymax = yTicks[yTicks.length - 1];
    const xOf = (t) => f.x0 + ((t - start) / (end - start)) * (f.x1 - f.x0);
    const yOf = (v) => f.y0 - (v / ymax) * (f.y0 - f.y1);
    return { f, start, end, xOf, yOf, yTicks };
  }

  draw() {
    const { f, start, end, xOf, yOf, yTicks } = this.scales();
    let line = "";
    for (const p of this.series) {
      const x = xOf(p.t).toFixed(1), y = yOf(p.v).toFixed(1);
      line += line ? `H${x}V${y}` : `M${x},${y}`;
    }
    const last = this.series[this.series.length - 1];
    if (line) line += `H${xOf(end).toFixed(1)}`;
    const area = line ? `${line}V${f.y0}H${xOf(start).toFixed(1)}Z` : "";
    const { ticks, step } = timeTicks(start, end);
    const timeText = (t) => new Date(t).toLocaleTimeString([], step < 60000
      ? { hour: "2-digit", minute: "2-digit", second: "2-digit" } : { hour: "2-digit", minute: "2-digit" });
    const summary = last ? `${this.label}: now ${this.format(last.v)}, first ${this.format(this.series[0].v)}`
      : `${this.label}: not known yet`;
    this.container.setAttribute("aria-label", `${summary}. Arrow keys step through changes.`);
    const empty = this.series.length ? "" :
      `<text class="empty" x="${(f.x0 + f.x1) / 2}" y="${(f.y0 + f.y1) / 2}" text-anchor="middle">known once every task has a valid measurement</text>`;
    this.svgHost.innerHTML = `<svg viewBox="0 0 ${f.w} ${f.h}" height="${f.h}" aria-hidden="true" data-points="${this.series.length}">
      ${this.series.length ? this.axes(f, ticks, xOf, timeText, yTicks, yOf, this.tickFormat(yTicks), this.title, "time") : ""}
      <path class="e2e-area" d="${area}"/><path class="e2e" d="${line}"/>${empty}<g class="sel"></g></svg>`;
    if (this.selected != null) this.select(Math.min(this.selected, this.series.length - 1));
  }

  onMouse(event) {
    if (!this.series.length) return;
    const { f, start, end } = this.scales();
    const box = this.container.getBoundingClientRect();
    const t = start + ((event.clientX - box.left - f.x0) / (f.x1 - f.x0)) * (end - start);
    let index = 0;
    while (index + 1 < this.series.length && this.series[index + 1].t <= t) index += 1;
    this.select(index);
  }

  select(index) {
    this.selected = index;
    const layer = this.svgHost.querySelector(".sel");
    if (index == null || index < 0 || !this.series.length) {
      this.tip.hidden = true;
      if (layer) layer.innerHTML = "";
      return;
    }
    const { f, xOf, yOf } = this.scales();
    const p = this.series[index];
    const x = xOf(p.t), y = yOf(p.v);
    layer.innerHTML = `<line class="cursor" x1="${x}" x2="${x}" y1="${f.y1}" y2="${f.y0}"/>
      <circle class="hl" cx="${x}" cy="${y}" r="5"/>`;
    this.showTip(`<b>${esc(this.format(p.v))}</b><br><span class="muted">${esc(new Date(p.t).toLocaleTimeString())}${p.note ? ` · ${esc(p.note)}` : ""}</span>`, x, y);
  }
}
