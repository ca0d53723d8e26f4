// One run: summary, system prompt, artifacts, and the timeline of its events. The timeline is
// built as light row objects and rendered in chunks as the reader scrolls (a 10,000-event run
// opens as fast as a short one). A run still in progress is polled for new events.
import {
  FINAL,
  badge,
  fileUrl,
  fmtBytes,
  fmtDuration,
  fmtScore,
  fmtTime,
  fmtTokens,
  foldedPre,
  getJson,
  h,
  pretty,
} from "./common.js";

const CHUNK = 150;
const POLL_MS = 1000;
const IMAGE_DATA_URL = /^data:image\/(png|jpeg|gif|webp);base64,[A-Za-z0-9+/=\s]+$/;
const IMAGE_FILE = /\.(png|jpe?g|gif|webp|bmp)$/i;

const path = new URLSearchParams(location.search).get("path") || "";
const $ = (id) => document.getElementById(id);

const state = {
  events: [],
  rows: [],
  rendered: 0,
  calls: new Map(), // call_id -> row
  steps: [], // {index, row}
  lastInstructions: null,
  summary: null,
  polling: false,
};

// ---- rows -------------------------------------------------------------------------------------

function addRow(kind, event, extra = {}) {
  const row = { kind, event, el: null, ...extra };
  state.rows.push(row);
  return row;
}

function textOf(content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  return content
    .filter((p) => p && p.type === "text")
    .map((p) => String(p.text ?? ""))
    .join("");
}

function imagesOf(content) {
  if (!Array.isArray(content)) return [];
  return content
    .filter((p) => p && p.type === "image_url")
    .map((p) => (typeof p.image_url === "string" ? p.image_url : p.image_url?.url ?? ""));
}

function addEvent(event) {
  switch (event.type) {
    case "task_started":
      showSystem(event);
      break;
    case "step_started": {
      state.lastInstructions = event.instructions;
      const row = addRow("step", event);
      state.steps.push({ index: event.step_index, row, score: null });
      break;
    }
    case "message_added": {
      const m = event.message;
      if (m.role === "user" && textOf(m.content) === state.lastInstructions) {
        state.lastInstructions = null; // the step's instructions, already shown
        break;
      }
      if (m.role === "tool") {
        const images = imagesOf(m.content);
        const call = state.calls.get(m.tool_call_id);
        if (call && images.length) {
          call.images = images;
          rerender(call);
        } else if (!call || call.done === undefined) {
          addRow("message", event);
        }
        break;
      }
      addRow("message", event);
      break;
    }
    case "tool_call_started":
      state.calls.set(event.call_id, addRow("tool", event, { done: undefined, images: [] }));
      break;
    case "tool_call_completed": {
      const call = state.calls.get(event.call_id);
      if (call && call.done === undefined) {
        call.done = event;
        rerender(call);
      } else {
        state.calls.set(event.call_id, addRow("tool", null, { done: event, images: [] }));
      }
      break;
    }
    case "scoring": {
      addRow("scoring", event);
      const step = state.steps.find((s) => s.index === event.step_index);
      if (step) step.score = event.score;
      break;
    }
    default:
      addRow(event.type, event);
  }
}

// ---- rendering --------------------------------------------------------------------------------

function meta(...parts) {
  const items = parts
    .filter((p) => p !== null && p !== undefined && p !== "")
    .map((p) => (p instanceof Node ? p : h("span", { text: String(p) })));
  return h("div", { class: "meta" }, ...items);
}

function jsonDetails(label, value, open = false) {
  return h("details", { open }, h("summary", { text: label }), foldedPre(pretty(value)));
}

function imageList(urls) {
  return h(
    "div",
    { class: "images" },
    ...urls.map((url) =>
      IMAGE_DATA_URL.test(url)
        ? h("img", { src: url, alt: "image from the conversation", loading: "lazy" })
        : h("span", { class: "muted", text: `[image not shown: ${url.slice(0, 60)}]` }),
    ),
  );
}

function renderMessage(event) {
  const m = event.message;
  const el = h("div", { class: `row message role-${m.role}` });
  const head = [h("span", { class: "role", text: m.role })];
  if (event.usage) {
    const u = event.usage;
    head.push(
      h("span", {
        class: "muted small",
        text: `${u.input_tokens} in · ${u.output_tokens} out${
          u.reasoning_tokens ? ` · ${u.reasoning_tokens} reasoning` : ""
        }`,
      }),
    );
  }
  if (event.model_latency_s !== null && event.model_latency_s !== undefined)
    head.push(h("span", { class: "muted small", text: `model ${fmtDuration(event.model_latency_s)}` }));
  el.append(meta(...head));
  if (m.reasoning_content)
    el.append(h("details", null, h("summary", { text: "reasoning" }), foldedPre(m.reasoning_content)));
  const text = textOf(m.content);
  if (text) el.append(foldedPre(text, { cls: "text" }));
  const images = imagesOf(m.content);
  if (images.length) el.append(imageList(images));
  if (m.tool_calls && m.tool_calls.length)
    el.append(
      h("div", {
        class: "muted small",
        text: `calls ${m.tool_calls.map((c) => c.function?.name ?? "?").join(", ")}`,
      }),
    );
  return el;
}

function argsText(args) {
  if (typeof args === "string") return args;
  const keys = Object.keys(args || {});
  if (keys.length === 1 && typeof args[keys[0]] === "string") return args[keys[0]];
  return pretty(args);
}

function renderTool(row) {
  const start = row.event;
  const done = row.done;
  const name = start?.name ?? done?.name ?? "?";
  const status = done === undefined ? "running" : done.is_error ? "error" : "ok";
  const args = start ? argsText(start.arguments) : "";
  const firstLine = args.split("\n")[0];
  const summary = h(
    "summary",
    null,
    h("span", { class: "tool-name", text: name }),
    h("span", { class: `tool-status ${status}`, text: status }),
    h("span", { class: "duration", text: done ? fmtDuration(done.duration_s) : "…" }),
    h("code", {
      class: "args-line mono",
      text: firstLine.length > 120 ? `${firstLine.slice(0, 120)}…` : firstLine,
    }),
  );
  const body = [];
  if (start) body.push(h("div", { class: "label", text: "arguments" }), foldedPre(args, { maxLines: 20 }));
  if (done) {
    body.push(
      h("div", { class: "label", text: `output (${done.output.length} chars)` }),
      foldedPre(done.output, { cls: done.is_error ? "tool-error" : "" }),
    );
  }
  if (row.images.length) body.push(imageList(row.images));
  const callId = start?.call_id ?? done?.call_id;
  return h(
    "details",
    { class: `row tool ${status}`, open: true, dataset: { callId } },
    summary,
    h("div", { class: "tool-body" }, ...body),
  );
}

function renderScoring(e) {
  const el = h(
    "div",
    { class: "row scoring" },
    meta(
      h("span", { class: "label", text: `judge · step ${e.step_index}` }),
      h("span", { class: "score", text: `score ${fmtScore(e.score)}` }),
      h("span", { class: "muted small", text: fmtDuration(e.duration_s) }),
      e.continue_task ? "" : h("span", { class: "muted small", text: "stops the task" }),
    ),
  );
  const reason = e.metadata?.misbehavior;
  if (reason)
    el.append(h("div", { class: "misbehavior" }, h("b", { text: "misbehaviour: " }), pretty(reason)));
  const rest = Object.fromEntries(Object.entries(e.metadata || {}).filter(([k]) => k !== "misbehavior"));
  if (Object.keys(rest).length) el.append(jsonDetails("judge metadata", rest, true));
  return el;
}

function renderRow(row) {
  const e = row.event;
  switch (row.kind) {
    case "step": {
      return h(
        "section",
        { class: "row step", id: `step-${e.step_index}` },
        h("h2", { text: `Step ${e.step_index}` }),
        h("div", { class: "label", text: "instructions" }),
        foldedPre(e.instructions, { cls: "text" }),
      );
    }
    case "message":
      return renderMessage(e);
    case "tool":
      return renderTool(row);
    case "scoring":
      return renderScoring(e);
    case "step_completed":
      return h(
        "div",
        { class: "row step-done" },
        meta(
          h("b", { text: `step ${e.step_index} done` }),
          `stop: ${e.stop_reason}`,
          `score ${fmtScore(e.score)}`,
          `${e.turns} turns`,
          fmtDuration(e.duration_s),
        ),
      );
    case "error":
      return h(
        "div",
        { class: "row error" },
        meta(h("b", { text: `error · ${e.kind}` }), e.step_index !== null ? `step ${e.step_index}` : ""),
        foldedPre(e.message),
        e.traceback ? h("details", null, h("summary", { text: "traceback" }), foldedPre(e.traceback)) : null,
      );
    case "task_completed":
      return h(
        "div",
        { class: "row task-done" },
        meta(
          h("b", { text: "run finished" }),
          badge(e.status),
          e.error_kind ? `error kind ${e.error_kind}` : "",
          `score ${fmtScore(e.score)}`,
          `steps ${e.scores.map(fmtScore).join(" · ")}`,
          fmtDuration(e.duration_s),
          `${fmtTokens(e.usage.input_tokens)} in · ${fmtTokens(e.usage.output_tokens)} out`,
        ),
      );
    case "hook_completed":
      return h(
        "div",
        { class: "row hook" },
        jsonDetails(`${e.hook}${e.step_index !== null ? ` · step ${e.step_index}` : ""}`, e.result),
      );
    case "limits_applied":
      return h("div", { class: "row hook" }, jsonDetails("limits applied", e.limits));
    default:
      return h("div", { class: "row" }, jsonDetails(row.kind, e));
  }
}

function rerender(row) {
  if (!row.el) return;
  const el = renderRow(row);
  row.el.replaceWith(el);
  row.el = el;
}

function renderMore(upTo = state.rendered + CHUNK) {
  const end = Math.min(upTo, state.rows.length);
  if (end <= state.rendered) return;
  const fragment = document.createDocumentFragment();
  for (let i = state.rendered; i < end; i++) {
    const row = state.rows[i];
    row.el = renderRow(row);
    fragment.append(row.el);
  }
  $("timeline").append(fragment);
  state.rendered = end;
  document.body.dataset.rendered = String(state.rendered);
}

// ---- header -----------------------------------------------------------------------------------

function showSystem(e) {
  $("system").hidden = false;
  $("system-body").replaceChildren(foldedPre(e.system_prompt, { cls: "text" }));
  $("config-body").textContent = pretty({
    tools: e.tools,
    sandbox: e.sandbox,
    karotte_version: e.karotte_version,
    config: e.config,
  });
}

function kv(label, value, cls = "") {
  return h("div", { class: `kv ${cls}` }, h("span", { class: "k", text: label }), h("span", { class: "v" }, value));
}

function showSummary(s) {
  state.summary = s;
  document.title = `${s.run_id ?? s.path} · Karotte`;
  $("title").textContent = s.run_id ?? s.path;
  $("summary").replaceChildren(
    kv("status", badge(s.status), "status"),
    kv("task", s.task_id ?? "–"),
    kv("model", s.model ?? "–"),
    kv("score", fmtScore(s.score), "score"),
    kv("step scores", s.scores.length ? s.scores.map(fmtScore).join(" · ") : "–"),
    kv("error kind", s.error_kind ?? "–", "error-kind"),
    kv("duration", fmtDuration(s.duration_s)),
    kv("tokens", `${fmtTokens(s.input_tokens)} in · ${fmtTokens(s.output_tokens)} out`),
    kv("started", fmtTime(s.started_at)),
    kv("events", String(s.event_count)),
    kv("file", h("span", { class: "mono small", text: s.path })),
  );
  if (s.misbehavior.length)
    $("summary").append(kv("misbehaviour", s.misbehavior.join("; "), "misbehavior"));
  $("problem").hidden = !s.problem;
  $("problem").textContent = s.problem ? `This file is not a complete transcript: ${s.problem}` : "";
  $("live").textContent = s.status === "running" ? "live: updating" : "";
}

function showSteps() {
  $("steps").replaceChildren(
    ...state.steps.map((step) =>
      h("a", {
        href: `#step-${step.index}`,
        text: `Step ${step.index}${step.score === null ? "" : ` · ${fmtScore(step.score)}`}`,
        onclick: (ev) => {
          ev.preventDefault();
          const at = state.rows.indexOf(step.row);
          if (at >= state.rendered) renderMore(at + CHUNK);
          step.row.el?.scrollIntoView({ block: "start" });
        },
      }),
    ),
  );
}

function showArtifacts(artifacts) {
  if (!artifacts.length) return;
  $("artifacts").hidden = false;
  $("artifact-list").replaceChildren(
    ...artifacts.map((a) =>
      h(
        "li",
        null,
        h("a", { href: fileUrl(a.path), target: "_blank", rel: "noopener", text: a.name }),
        h("span", { class: "muted small", text: ` ${fmtBytes(a.size)}` }),
      ),
    ),
  );
  $("artifact-images").replaceChildren(
    ...artifacts
      .filter((a) => IMAGE_FILE.test(a.name))
      .map((a) =>
        h("figure", null, h("img", { src: fileUrl(a.path), alt: a.name, loading: "lazy" }), h("figcaption", { text: a.name })),
      ),
  );
}

// ---- loading and live updates -----------------------------------------------------------------

function reset() {
  state.events = [];
  state.rows = [];
  state.rendered = 0;
  state.calls = new Map();
  state.steps = [];
  state.lastInstructions = null;
  $("timeline").replaceChildren();
}

function appendEvents(events, live) {
  const wasAllRendered = state.rendered === state.rows.length;
  for (const e of events) {
    state.events.push(e);
    addEvent(e);
  }
  // live: new rows show at once when the reader has everything before them on the page
  if (live && wasAllRendered) renderMore(state.rows.length);
  showSteps();
}

async function poll() {
  if (!state.summary || FINAL.has(state.summary.status)) {
    state.polling = false;
    return;
  }
  const last = state.events.length ? state.events[state.events.length - 1].timestamp : "";
  const url =
    `/api/run/events?path=${encodeURIComponent(path)}&after=${state.events.length}` +
    (last === "" ? "" : `&last=${last}`);
  try {
    const { body } = await getJson(url);
    if (body.reset) reset();
    if (body.events.length) appendEvents(body.events, !body.reset);
    if (body.reset) renderMore();
    showSummary(body.summary);
  } catch (error) {
    $("live").textContent = `disconnected: ${error.message}`;
  }
  setTimeout(poll, POLL_MS);
}

async function load() {
  if (!path) {
    $("problem").hidden = false;
    $("problem").textContent = "no run given (open a run from the list)";
    return;
  }
  let body;
  try {
    ({ body } = await getJson(`/api/run?path=${encodeURIComponent(path)}`));
  } catch (error) {
    $("problem").hidden = false;
    $("problem").textContent = `cannot open ${path}: ${error.message}`;
    document.body.dataset.ready = "error";
    return;
  }
  showSummary(body.summary);
  showArtifacts(body.artifacts);
  appendEvents(body.events, false);
  renderMore();
  document.body.dataset.ready = "1";
  const sentinel = $("sentinel");
  const observer = new IntersectionObserver(
    (entries) => {
      if (!entries.some((entry) => entry.isIntersecting)) return;
      if (state.rendered >= state.rows.length) return;
      renderMore();
      // still in view after this chunk: observing again reports it once more
      observer.unobserve(sentinel);
      observer.observe(sentinel);
    },
    { rootMargin: "1500px 0px" },
  );
  observer.observe(sentinel);
  if (!FINAL.has(body.summary.status)) {
    state.polling = true;
    setTimeout(poll, POLL_MS);
  }
}

load();
