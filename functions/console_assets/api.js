// The API client: every call carries the pasted token (sessionStorage: gone when the tab closes).
const KEY = "tensorant.token";

export const token = {
  get: () => sessionStorage.getItem(KEY) || "",
  set: (value) => sessionStorage.setItem(KEY, value),
  clear: () => sessionStorage.removeItem(KEY),
};

export class ApiError extends Error {
  constructor(status, problem) {
    const detail = problem && typeof problem === "object" ? (problem.detail || problem.title) : problem;
    super(detail ? String(detail) : `the API answered ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

// The claims of the token, for the header line only (the API checks the signature).
export function claims() {
  try {
    const part = token.get().split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    return JSON.parse(atob(part));
  } catch {
    return {};
  }
}

export async function api(method, path, { json, body, type } = {}) {
  const headers = { Authorization: `Bearer ${token.get()}`, Accept: "application/json" };
  let payload = body;
  if (json !== undefined) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(json);
  } else if (type) {
    headers["Content-Type"] = type;
  }
  const resp = await fetch(path, { method, headers, body: payload, cache: "no-store" });
  const text = resp.status === 204 ? "" : await resp.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = text;
  }
  if (!resp.ok) {
    if (resp.status === 401) window.dispatchEvent(new CustomEvent("tensorant:unauthorized"));
    throw new ApiError(resp.status, data);
  }
  return data;
}

export const get = (path) => api("GET", path);
export const post = (path, json) => api("POST", path, { json: json ?? {} });
