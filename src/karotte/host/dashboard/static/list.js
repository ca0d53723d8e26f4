// The runs list: every run under the directory, sortable, filterable, refreshed by polling
// (the server answers 304 when nothing changed).
import {
  FINAL,
  badge,
  fmtDuration,
  fmtScore,
  fmtTime,
  fmtTokens,
  getJson,
  h,
  runUrl,
} from "./common.js";

const STATUSES = ["passed", "failed", "error", "running", "unfinished", "malformed"];
const POLL_MS = 2000;

const state = {
  runs: [],
  etag: null,
  sortKey: "started_at",
  sortDesc: true,
  filters: { status: "", task: "", model: "", text: "" },
};

const $ = (id) => document.getElementById(id);

function readUrl() {
  const q = new URLSearchParams(location.search);
  for (const key of Object.keys(state.filters)) state.filters[key] = q.get(key) || "";
  if (q.get("sort")) state.sortKey = q.get("sort");
  if (q.get("order")) state.sortDesc = q.get("order") !== "asc";
}

function writeUrl() {
  const q = new URLSearchParams();
  for (const [key, value] of Object.entries(state.filters)) if (value) q.set(key, value);
  if (state.sortKey !== "started_at" || !state.sortDesc) {
    q.set("sort", state.sortKey);
    q.set("order", state.sortDesc ? "desc" : "asc");
  }
  const search = q.toString();
  history.replaceState(null, "", search ? `?${search}` : location.pathname);
}

function sortValue(run, key) {
  switch (key) {
    case "tokens":
      return run.input_tokens + run.output_tokens;
    case "scores": {
      const known = run.scores.filter((s) => s !== null);
      return known.length ? known.reduce((a, b) => a + b, 0) / run.scores.length : null;
    }
    case "status":
      return STATUSES.indexOf(run.status);
    default:
      return run[key] ?? null;
  }
}

function compare(a, b) {
  const va = sortValue(a, state.sortKey);
  const vb = sortValue(b, state.sortKey);
  if (va === null && vb === null) return a.path.localeCompare(b.path);
  if (va === null) return 1; // unknown values last, whatever the order
  if (vb === null) return -1;
  let c = typeof va === "string" ? va.localeCompare(vb) : va - vb;
  if (c === 0) c = a.path.localeCompare(b.path);
  return state.sortDesc ? -c : c;
}

function matches(run) {
  const f = state.filters;
  if (f.status && run.status !== f.status) return false;
  if (f.task && run.task_id !== f.task) return false;
  if (f.model && run.model !== f.model) return false;
  if (f.text) {
    const needle = f.text.toLowerCase();
    const hay = `${run.run_id ?? ""} ${run.task_id ?? ""} ${run.model ?? ""} ${run.path}`;
    if (!hay.toLowerCase().includes(needle)) return false;
  }
  return true;
}

function fillSelect(select, values, current) {
  const wanted = ["", ...values];
  if (current && !wanted.includes(current)) wanted.push(current);
  const have = Array.from(select.options).map((o) => o.value);
  if (have.length === wanted.length && have.every((v, i) => v === wanted[i])) {
    select.value = current;
    return;
  }
  select.replaceChildren(...wanted.map((v) => h("option", { value: v, text: v || "all" })));
  select.value = current;
}

function distinct(key) {
  return [...new Set(state.runs.map((r) => r[key]).filter((v) => v))].sort();
}

function renderTotals(rows) {
  const counts = Object.fromEntries(STATUSES.map((s) => [s, 0]));
  for (const r of rows) counts[r.status] = (counts[r.status] || 0) + 1;
  const finished = rows.filter((r) => FINAL.has(r.status));
  const scored = finished.filter((r) => r.score !== null && r.score !== undefined);
  const passRate = finished.length ? (100 * counts.passed) / finished.length : null;
  const mean = scored.length ? scored.reduce((a, r) => a + r.score, 0) / scored.length : null;
  const parts = [
    h("span", { id: "t-count" }, h("b", { text: String(rows.length) }), " runs"),
    h(
      "span",
      { id: "t-pass-rate" },
      "pass rate ",
      h("b", { text: passRate === null ? "–" : `${passRate.toFixed(1)}%` }),
      ` (${counts.passed} of ${finished.length} finished)`,
    ),
    h(
      "span",
      { id: "t-mean-score" },
      "mean score ",
      h("b", { text: mean === null ? "–" : mean.toFixed(3) }),
    ),
  ];
  for (const s of STATUSES) {
    if (counts[s]) parts.push(h("span", { class: "muted" }, badge(s), ` ${counts[s]}`));
  }
  $("totals").replaceChildren(...parts);
}

function stepScores(run) {
  if (!run.scores.length) return h("span", { class: "muted", text: "–" });
  return h(
    "span",
    { class: "step-scores" },
    ...run.scores.map((s) =>
      h("span", {
        class: `step-score ${s === null ? "none" : s >= 1 ? "full" : s > 0 ? "part" : "zero"}`,
        text: fmtScore(s),
      }),
    ),
  );
}

function renderRow(run) {
  const link = h("a", { href: runUrl(run.path), text: run.run_id || run.path });
  const runCell = h("td", { class: "run" }, link);
  if (run.run_id) runCell.append(h("div", { class: "muted small mono", text: run.path }));
  if (run.problem) runCell.append(h("div", { class: "problem small", text: run.problem }));
  if (run.misbehavior.length)
    runCell.append(h("div", { class: "misbehavior small", text: run.misbehavior.join("; ") }));
  return h(
    "tr",
    { dataset: { path: run.path, status: run.status } },
    h("td", null, badge(run.status)),
    h("td", { class: "task", text: run.task_id ?? "–" }),
    h("td", { class: "model", text: run.model ?? "–" }),
    runCell,
    h("td", null, stepScores(run)),
    h("td", { class: "num score", text: fmtScore(run.score) }),
    h("td", { class: "error-kind", text: run.error_kind ?? "" }),
    h("td", { class: "num", text: fmtDuration(run.duration_s) }),
    h("td", {
      class: "num",
      title: `${run.input_tokens} in, ${run.output_tokens} out`,
      text: fmtTokens(run.input_tokens + run.output_tokens),
    }),
    h("td", { class: "small", text: fmtTime(run.started_at) }),
  );
}

function render() {
  fillSelect($("f-status"), STATUSES, state.filters.status);
  fillSelect($("f-task"), distinct("task_id"), state.filters.task);
  fillSelect($("f-model"), distinct("model"), state.filters.model);
  $("f-text").value = state.filters.text;
  for (const th of document.querySelectorAll("th[data-key]")) {
    th.classList.toggle("sorted", th.dataset.key === state.sortKey);
    th.classList.toggle("desc", th.dataset.key === state.sortKey && state.sortDesc);
  }
  const rows = state.runs.filter(matches).sort(compare);
  renderTotals(rows);
  const body = document.querySelector("#runs tbody");
  const fragment = document.createDocumentFragment();
  for (const run of rows) fragment.append(renderRow(run));
  body.replaceChildren(fragment);
  $("empty").hidden = rows.length > 0;
  document.body.dataset.rows = String(rows.length);
}

async function refresh() {
  const headers = state.etag ? { "If-None-Match": state.etag } : {};
  try {
    const { body, response, notModified } = await getJson("/api/runs", { headers });
    $("failure").hidden = true;
    $("live").textContent = "live";
    $("live").classList.remove("off");
    if (notModified) return;
    state.etag = response.headers.get("etag");
    state.runs = body.runs;
    $("root").textContent = body.root;
    render();
    document.body.dataset.ready = "1";
  } catch (error) {
    $("live").textContent = "disconnected";
    $("live").classList.add("off");
    $("failure").textContent = `cannot list runs: ${error.message}`;
    $("failure").hidden = false;
  }
}

function bind() {
  const onFilter = (key, el, event) =>
    el.addEventListener(event, () => {
      state.filters[key] = el.value;
      writeUrl();
      render();
    });
  onFilter("status", $("f-status"), "change");
  onFilter("task", $("f-task"), "change");
  onFilter("model", $("f-model"), "change");
  onFilter("text", $("f-text"), "input");
  for (const th of document.querySelectorAll("th[data-key]")) {
    th.addEventListener("click", () => {
      if (state.sortKey === th.dataset.key) state.sortDesc = !state.sortDesc;
      else {
        state.sortKey = th.dataset.key;
        state.sortDesc = ["started_at", "score", "duration_s", "tokens", "scores"].includes(
          th.dataset.key,
        );
      }
      writeUrl();
      render();
    });
  }
}

async function poll() {
  await refresh();
  setTimeout(poll, POLL_MS);
}

readUrl();
bind();
poll();
