// Reads from the server's JSON API, with the bearer token kept in localStorage when one is set.

const TOKEN_KEY = "tuner.token";

export class AuthRequired extends Error {}

export class HttpError extends Error {
  constructor(status, message) {
    super(`${status}: ${message}`);
    this.status = status;
  }
}

export function getToken() {
  return localStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(value) {
  if (value) localStorage.setItem(TOKEN_KEY, value);
  else localStorage.removeItem(TOKEN_KEY);
}

function authHeaders() {
  const token = getToken();
  return token ? { Authorization: `Bearer ${token}` } : {};
}

async function detail(response) {
  try {
    const body = await response.json();
    return typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail ?? body);
  } catch {
    return response.statusText;
  }
}

export async function getJSON(path, signal) {
  const response = await fetch(path, {
    headers: { Accept: "application/json", ...authHeaders() },
    signal,
    cache: "no-store",
  });
  if (response.status === 401) throw new AuthRequired(await detail(response));
  if (!response.ok) throw new HttpError(response.status, await detail(response));
  return response.json();
}

// A link that downloads with the token: plain links cannot send an Authorization header.
export async function download(url, filename) {
  const response = await fetch(url, { headers: authHeaders() });
  if (response.status === 401) throw new AuthRequired(await detail(response));
  if (!response.ok) throw new HttpError(response.status, await detail(response));
  const blob = await response.blob();
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = filename;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 5000);
}

export function query(params) {
  const parts = Object.entries(params)
    .filter(([, v]) => v !== undefined && v !== null && v !== "")
    .map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v)}`);
  return parts.length ? `?${parts.join("&")}` : "";
}
