// Shared helpers of the dashboard pages. Everything from a transcript is inserted as text
// (textContent, attributes set one by one): never as HTML.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  if (attrs) {
    for (const [key, value] of Object.entries(attrs)) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") el.className = value;
      else if (key === "text") el.textContent = value;
      else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
      else if (key === "dataset") Object.assign(el.dataset, value);
      else el.setAttribute(key, value === true ? "" : String(value));
    }
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

export function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "–";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 60) return `${seconds.toFixed(seconds < 10 ? 2 : 1)} s`;
  const m = Math.floor(seconds / 60);
  const s = Math.round(seconds % 60);
  if (m < 60) return `${m} m ${s} s`;
  return `${Math.floor(m / 60)} h ${m % 60} m`;
}

function pad(n) {
  return String(n).padStart(2, "0");
}

export function fmtTime(epoch) {
  if (epoch === null || epoch === undefined) return "–";
  const d = new Date(epoch * 1000);
  return (
    `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`
  );
}

export function fmtScore(score) {
  if (score === null || score === undefined) return "–";
  return Number.isInteger(score) ? String(score) : score.toFixed(3).replace(/0+$/, "");
}

export function fmtTokens(n) {
  if (!n) return "0";
  if (n < 10000) return String(n);
  if (n < 1e6) return `${(n / 1000).toFixed(1)}k`;
  return `${(n / 1e6).toFixed(2)}M`;
}

export function fmtBytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1024 / 1024).toFixed(1)} MiB`;
}

export const FINAL = new Set(["passed", "failed", "error"]);

export function badge(status) {
  return h("span", { class: `badge status-${status}`, text: status });
}

export function fileUrl(rel) {
  return "/files/" + rel.split("/").map(encodeURIComponent).join("/");
}

export function runUrl(rel) {
  return "/run?path=" + encodeURIComponent(rel);
}

// A <pre> that shows at most `maxLines` lines / `maxChars` characters until asked for all.
export function foldedPre(text, { maxLines = 30, maxChars = 4000, cls = "" } = {}) {
  text = text ?? "";
  const pre = h("pre", { class: `mono ${cls}` });
  const lines = text.split("\n");
  let cut = text.length;
  if (lines.length > maxLines) cut = lines.slice(0, maxLines).join("\n").length;
  cut = Math.min(cut, maxChars);
  if (cut >= text.length) {
    pre.textContent = text;
    return pre;
  }
  pre.textContent = text.slice(0, cut);
  const rest = text.length - cut;
  const more = h("button", {
    class: "fold",
    type: "button",
    text: `show all (${lines.length} lines, ${text.length} chars; ${rest} more)`,
  });
  more.addEventListener("click", () => {
    pre.textContent = text;
    more.remove();
  });
  return h("div", { class: "folded" }, pre, more);
}

export function pretty(value) {
  if (typeof value === "string") return value;
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

export async function getJson(url, options = {}) {
  const response = await fetch(url, options);
  if (response.status === 304) return { notModified: true, response };
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  if (!response.ok) {
    const why = body && body.error ? body.error : `HTTP ${response.status}`;
    throw new Error(why);
  }
  return { body, response };
}
