// The dashboard shell: routes paths to pages, polls for live data, asks for a token on 401.

import { AuthRequired, HttpError, download, getToken, setToken } from "./api.js";
import { clock, esc } from "./format.js";
import { jobsPage } from "./jobs.js";
import { jobPage } from "./job.js";
import { workersPage } from "./workers.js";
import { logPage } from "./log.js";

const ROUTES = [
  { pattern: /^\/$/, page: jobsPage, nav: "jobs" },
  { pattern: /^\/jobs\/(\d+)\/?$/, page: jobPage, nav: "jobs" },
  { pattern: /^\/workers\/?$/, page: workersPage, nav: "workers" },
  { pattern: /^\/tuning-log\/?$/, page: logPage, nav: "log" },
];

const main = document.getElementById("main");
const live = document.getElementById("live");
let current = null; // { stop() } of the page on screen

function setLive(state, text) {
  live.className = `live ${state}`;
  live.textContent = text;
}

function showTokenPanel(open, reason) {
  const panel = document.getElementById("token-panel");
  panel.hidden = !open;
  document.getElementById("token-toggle").setAttribute("aria-expanded", String(open));
  if (open) {
    if (reason) document.getElementById("token-title").textContent =
      `This server needs a token to read (${reason}). Paste one (from \`tuner token create\`); it is kept in this browser only.`;
    document.getElementById("token-input").focus();
  }
}

// Calls ``fetchAndRender`` now and again after ``interval()`` ms, while the page is shown.
function makePoller(signal) {
  return (fetchAndRender, interval) => {
    let timer = null;
    const run = async () => {
      if (signal.aborted) return;
      if (document.hidden) {
        document.addEventListener("visibilitychange", run, { once: true });
        return;
      }
      try {
        await fetchAndRender(signal);
        setLive("ok", `live · ${clock(new Date().toISOString())}`);
      } catch (error) {
        if (signal.aborted || error.name === "AbortError") return;
        if (error instanceof AuthRequired) {
          setLive("error", "token needed");
          showTokenPanel(true, error.message);
          return; // saving a token reloads the page view
        }
        if (error instanceof HttpError && error.status === 404) {
          main.innerHTML = `<p class="message error">${esc(error.message)}. <a href="/">Back to jobs</a></p>`;
          setLive("ok", "not found");
          return;
        }
        setLive("error", `retrying: ${error.message}`);
        console.warn(error);
      }
      if (!signal.aborted) timer = setTimeout(run, typeof interval === "function" ? interval() : interval);
    };
    signal.addEventListener("abort", () => clearTimeout(timer));
    run();
  };
}

function route() {
  if (current) current.abort();
  current = new AbortController();
  const path = location.pathname;
  const match = ROUTES.map((r) => ({ r, m: path.match(r.pattern) })).find((x) => x.m);
  document.querySelectorAll(".topbar nav a").forEach((a) => {
    if (match && a.dataset.page === match.r.nav) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  });
  if (!match) {
    main.innerHTML = `<p class="message">No page at <code>${esc(path)}</code>. <a href="/">Back to jobs</a></p>`;
    return;
  }
  main.innerHTML = `<p class="message">Loading…</p>`;
  match.r.page({ main, params: match.m.slice(1), poll: makePoller(current.signal), signal: current.signal });
}

function navigate(path) {
  history.pushState(null, "", path);
  route();
  main.focus({ preventScroll: true });
  window.scrollTo(0, 0);
}

// Downloads that need the token go through fetch; without a token the plain link works.
document.addEventListener("click", (event) => {
  const link = event.target.closest("a[data-auth-download]");
  if (!link || !getToken() || event.button !== 0) return;
  event.preventDefault();
  download(link.href, link.dataset.authDownload).catch((error) => {
    if (error instanceof AuthRequired) showTokenPanel(true, error.message);
    else setLive("error", `download failed: ${error.message}`);
  });
});

document.addEventListener("click", (event) => {
  const link = event.target.closest("a[href]");
  if (!link || event.defaultPrevented || event.button !== 0) return;
  if (event.metaKey || event.ctrlKey || event.shiftKey || event.altKey || link.target || link.download) return;
  const url = new URL(link.href, location.href);
  if (url.origin !== location.origin || !ROUTES.some((r) => r.pattern.test(url.pathname))) return;
  event.preventDefault();
  if (url.pathname === location.pathname && url.hash) {
    document.getElementById(url.hash.slice(1))?.scrollIntoView({ block: "start" });
    history.replaceState(null, "", url.hash);
    return;
  }
  navigate(url.pathname + url.search + url.hash);
});

window.addEventListener("popstate", route);

document.getElementById("token-toggle").addEventListener("click", () => {
  showTokenPanel(document.getElementById("token-panel").hidden);
});
document.getElementById("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  setToken(document.getElementById("token-input").value.trim());
  document.getElementById("token-input").value = "";
  showTokenPanel(false);
  route();
});
document.getElementById("token-clear").addEventListener("click", () => {
  setToken("");
  showTokenPanel(false);
  route();
});
document.getElementById("token-toggle").title = getToken() ? "A token is saved" : "No token saved";

route();
