// dt console: the runs list and a run's page, drawn from dtcoord's JSON API (/api/v1/). Plain
// JavaScript and SVG: no framework, no build step, nothing fetched from elsewhere. Everything shown
// comes from runs' own processes, so it is set as text, never parsed as HTML.
"use strict";

const ACTIVE = ["PENDING", "RENDEZVOUS", "RUNNING", "RESTARTING", "REQUEUED"];
const TERMINAL = ["SUCCEEDED", "FAILED", "CANCELLED"];
const FILTERS = [
  ["all", "All", () => true],
  ["active", "Active", (r) => ACTIVE.includes(r.state)],
  ["succeeded", "Succeeded", (r) => r.state === "SUCCEEDED"],
  ["failed", "Failed", (r) => r.state === "FAILED"],
  ["cancelled", "Cancelled", (r) => r.state === "CANCELLED"],
];
// The charts every dttrainer run has, in this order; other metrics a program logs follow.
const CHARTS = [
  ["loss", "Loss"],
  ["eval_loss", "Eval loss"],
  ["lr", "Learning rate"],
  ["tokens_per_s", "Tokens/s"],
  ["step_time_s", "Step time (s)"],
];
const MAX_EXTRA_CHARTS = 16;
const COLORS = ["#2c5cc5", "#d9480f", "#2b8a3e", "#862e9c", "#c2255c", "#1098ad", "#5c940d", "#e67700"];
const POLL_MS = 2000;

let timer = null;  // the current view's refresh
let viewToken = 0; // bumps on navigation, so a stale refresh draws nothing

// ---- Helpers ----------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "style") node.style.cssText = v;  // CSSOM: allowed by the page's CSP, unlike a style attribute
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  for (const c of children.flat()) {
    if (c === undefined || c === null) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function api(path) {
  const res = await fetch("/api/v1/" + path, { credentials: "same-origin", headers: { Accept: "application/json" } });
  let body = null;
  try {
    body = await res.json();
  } catch (e) {
    body = null;
  }
  if (res.status === 401) {
    // The session ended (expired, or dtcoord restarted): sign in again.
    window.location.assign("/login");
    throw new ApiError(401, "signed out");
  }
  if (!res.ok) throw new ApiError(res.status, (body && body.error) || res.statusText);
  return body;
}

function ago(iso) {
  if (!iso) return "";
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  return duration(s) + " ago";
}

function duration(s) {
  if (!isFinite(s)) return "";
  if (s < 60) return Math.round(s) + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(Math.round(s % 60)).padStart(2, "0") + "s";
  if (s < 86400) return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
  return Math.floor(s / 86400) + "d" + String(Math.floor((s % 86400) / 3600)).padStart(2, "0") + "h";
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = n, u = 0;
  while (v >= 1024 && u < units.length - 1) { v /= 1024; u++; }
  return u === 0 ? n + " B" : v.toFixed(1) + " " + units[u];
}

function num(v) {
  if (v === null || v === undefined || !isFinite(v)) return "";
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(2);
  if (a >= 100) return v.toFixed(0);
  if (a >= 1) return v.toFixed(3).replace(/\.?0+$/, "");
  return v.toPrecision(3);
}

function badge(state) {
  return el("span", { class: "badge " + state }, state);
}

function progress(run) {
  const total = run.total_steps || 0;
  const frac = total > 0 ? Math.min(1, run.step / total) : 0;
  const cls = run.state === "SUCCEEDED" ? "bar done" : run.state === "FAILED" ? "bar failed" : "bar";
  return el("div", { class: "progress" },
    el("div", { class: cls, role: "progressbar", "aria-valuenow": run.step, "aria-valuemax": total || undefined },
      el("span", { style: "width:" + (frac * 100).toFixed(1) + "%" })),
    el("span", { class: "mono" }, total > 0 ? run.step + "/" + total : String(run.step)));
}

function fact(key, value) {
  return el("div", { class: "fact" }, el("div", { class: "k" }, key), el("div", { class: "v" }, value));
}

function stop() {
  if (timer !== null) clearTimeout(timer);
  timer = null;
}

// Runs `refresh` now and every POLL_MS while the view is current and `again()` holds.
function poll(token, refresh, again) {
  const tick = async () => {
    if (token !== viewToken) return;
    try {
      await refresh();
    } catch (e) {
      if (token === viewToken) showError(e);
    }
    if (token === viewToken && again()) timer = setTimeout(tick, POLL_MS);
  };
  tick();
}

function showError(e) {
  let banner = document.getElementById("error-banner");
  if (!banner) {
    banner = el("div", { id: "error-banner", class: "error-banner", role: "alert" });
    document.getElementById("app").prepend(banner);
  }
  banner.textContent = e instanceof ApiError ? e.message : "Cannot reach dtcoord: " + e.message;
}

function clearError() {
  const banner = document.getElementById("error-banner");
  if (banner) banner.remove();
}

// ---- The runs list ----------------------------------------------------------------------

function runsView(params) {
  const token = viewToken;
  const app = document.getElementById("app");
  let filter = FILTERS.some((f) => f[0] === params.get("state")) ? params.get("state") : "all";
  let text = "";
  const tbody = el("tbody", { id: "runs-body" });
  const filters = el("div", { class: "filters", id: "state-filters" });
  const search = el("input", { type: "search", placeholder: "Filter by name or id", "aria-label": "Filter runs" });
  let runs = [];

  const draw = () => {
    filters.replaceChildren(...FILTERS.map(([key, label, match]) => el("button", {
      class: key === filter ? "on" : "", "data-filter": key,
      onclick: () => { filter = key; history.replaceState(null, "", "#/?state=" + key); draw(); },
    }, label + " " + runs.filter(match).length)));
    const match = FILTERS.find((f) => f[0] === filter)[2];
    const shown = runs.filter(match).filter((r) => !text || r.name.includes(text) || r.run_id.includes(text));
    tbody.replaceChildren(...shown.map((r) => el("tr", { "data-run": r.run_id },
      el("td", {}, el("a", { href: "#/runs/" + r.run_id }, r.name)),
      el("td", { class: "mono muted" }, r.run_id),
      el("td", {}, badge(r.state)),
      el("td", {}, progress(r)),
      el("td", { class: "num" }, r.restarts + "/" + r.max_restarts),
      el("td", { class: "num" }, r.world_size ? r.world_size : r.nodes * r.procs_per_node),
      el("td", { title: r.created_at }, ago(r.created_at)),
      el("td", { class: "muted" }, r.scheduler.toLowerCase()))));
    if (shown.length === 0) {
      tbody.append(el("tr", {}, el("td", { colspan: 8, class: "empty" },
        runs.length === 0 ? "No runs yet: submit one with dtctl submit." : "No run matches the filter.")));
    }
  };
  search.addEventListener("input", () => { text = search.value.trim(); draw(); });

  app.replaceChildren(
    el("div", { class: "card" },
      el("div", { class: "row" }, el("h1", {}, "Runs"), el("span", { class: "spacer" }), search),
      el("div", { style: "margin:10px 0" }, filters),
      el("table", { id: "runs" },
        el("thead", {}, el("tr", {}, ["Name", "Run", "State", "Progress", "Restarts", "Ranks", "Age", "Scheduler"]
          .map((h, i) => el("th", { class: i === 4 || i === 5 ? "num" : "" }, h)))),
        tbody)));
  poll(token, async () => {
    const body = await api("runs");
    if (token !== viewToken) return;
    clearError();
    runs = body.runs;
    draw();
  }, () => true);
}

// ---- Charts -----------------------------------------------------------------------------

function tickStep(lo, hi, count) {
  const raw = (hi - lo) / count;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  return [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
}

function niceTicks(lo, hi, count) {
  if (!(hi > lo)) return [lo];
  const step = tickStep(lo, hi, count);
  const ticks = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(+t.toPrecision(12));
  return ticks;
}

// A tick's label with just enough digits to tell it from its neighbours `step` away.
function tickLabel(t, step) {
  if (t === 0) return "0";
  const a = Math.abs(t);
  if (a >= 1e5 || a < 1e-3) {
    const digits = Math.max(1, Math.min(8, Math.ceil(Math.log10(a / step) + 1e-9)));
    return t.toExponential(digits);
  }
  const decimals = Math.max(0, Math.min(10, Math.ceil(-Math.log10(step) - 1e-9)));
  return t.toFixed(decimals);
}

// At most `width` x 2 points per line: the lowest and highest of each pixel column.
function thin(points, width) {
  if (points.length <= width * 2) return points;
  const out = [];
  const per = points.length / width;
  for (let c = 0; c < width; c++) {
    const slice = points.slice(Math.floor(c * per), Math.floor((c + 1) * per));
    if (slice.length === 0) continue;
    let lo = slice[0], hi = slice[0];
    for (const p of slice) { if (p[1] < lo[1]) lo = p; if (p[1] > hi[1]) hi = p; }
    out.push(...(lo[0] <= hi[0] ? [lo, hi] : [hi, lo]));
  }
  return out;
}

// A line chart of one metric, one line per rank: series = {rank: [[step, value], ...]}.
function drawChart(card, name, series) {
  const plot = card.querySelector("svg");
  const W = Math.max(320, plot.clientWidth || 560), H = 220;
  const m = { l: 58, r: 12, t: 10, b: 26 };
  const ranks = Object.keys(series).sort((a, b) => a - b);
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity, count = 0;
  for (const r of ranks) {
    for (const [s, v] of series[r]) {
      if (!isFinite(v)) continue;
      x0 = Math.min(x0, s); x1 = Math.max(x1, s); y0 = Math.min(y0, v); y1 = Math.max(y1, v); count++;
    }
  }
  plot.setAttribute("viewBox", "0 0 " + W + " " + H);
  plot.setAttribute("data-points", count);
  plot.replaceChildren();
  if (count === 0) {
    plot.append(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "no points yet"));
    return;
  }
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { const d = Math.abs(y0) * 0.05 || 1; y0 -= d; y1 += d; }
  const pad = (y1 - y0) * 0.06;
  y0 -= pad; y1 += pad;
  const yStep = tickStep(y0, y1, 5);
  const yTicks = niceTicks(y0, y1, 5).map((t) => [t, tickLabel(t, yStep)]);
  // Room on the left for the longest label (11px text is about 6.5px a character).
  m.l = Math.max(40, 12 + Math.ceil(6.5 * Math.max(...yTicks.map(([, l]) => l.length))));
  const X = (s) => m.l + ((s - x0) / (x1 - x0)) * (W - m.l - m.r);
  const Y = (v) => H - m.b - ((v - y0) / (y1 - y0)) * (H - m.t - m.b);
  for (const [t, label] of yTicks) {
    plot.append(svg("line", { class: "grid", x1: m.l, x2: W - m.r, y1: Y(t), y2: Y(t) }));
    plot.append(svg("text", { x: m.l - 6, y: Y(t) + 4, "text-anchor": "end" }, label));
  }
  for (const t of niceTicks(x0, x1, 6).filter((t) => Number.isInteger(t))) {
    plot.append(svg("line", { class: "grid", x1: X(t), x2: X(t), y1: m.t, y2: H - m.b }));
    plot.append(svg("text", { x: X(t), y: H - m.b + 16, "text-anchor": "middle" }, t));
  }
  plot.append(svg("line", { class: "axis", x1: m.l, x2: m.l, y1: m.t, y2: H - m.b }));
  plot.append(svg("line", { class: "axis", x1: m.l, x2: W - m.r, y1: H - m.b, y2: H - m.b }));
  ranks.forEach((r, i) => {
    const color = COLORS[i % COLORS.length];
    const pts = thin(series[r].filter((p) => isFinite(p[1])), W - m.l - m.r);
    const d = pts.map((p, j) => (j === 0 ? "M" : "L") + X(p[0]).toFixed(1) + " " + Y(p[1]).toFixed(1)).join("");
    plot.append(svg("path", { class: "line", d, stroke: color, "data-rank": r }));
    if (pts.length <= 60) {
      for (const p of pts) plot.append(svg("circle", { cx: X(p[0]), cy: Y(p[1]), r: 2.5, fill: color }));
    }
  });
  const cursor = svg("line", { class: "cursor", x1: -10, x2: -10, y1: m.t, y2: H - m.b });
  plot.append(cursor);
  const tip = card.querySelector(".tooltip");
  plot.onmousemove = (ev) => {
    const box = plot.getBoundingClientRect();
    const step = x0 + ((ev.clientX - box.left) * (W / box.width) - m.l) / (W - m.l - m.r) * (x1 - x0);
    const parts = [];
    let at = null;
    ranks.forEach((r) => {
      let best = null;
      for (const p of series[r]) if (best === null || Math.abs(p[0] - step) < Math.abs(best[0] - step)) best = p;
      if (best) { parts.push("rank " + r + ": " + num(best[1])); at = best[0]; }
    });
    if (at === null) return;
    cursor.setAttribute("x1", X(at)); cursor.setAttribute("x2", X(at));
    tip.textContent = "step " + at + " — " + parts.join(", ");
  };
  card.querySelector(".legend").replaceChildren(...ranks.map((r, i) =>
    el("span", {}, el("i", { style: "background:" + COLORS[i % COLORS.length] }), "rank " + r)));
}

// ---- A run ------------------------------------------------------------------------------

function runView(runId) {
  const token = viewToken;
  const app = document.getElementById("app");
  const state = { run: null, series: {}, seriesFrom: 0, charts: {}, logRank: 0, logFold: false, lastCheckpoints: 0 };

  const header = el("div", { class: "card", id: "run-header" });
  const cause = el("div", { id: "root-cause" });
  const chartsGrid = el("div", { class: "grid2", id: "charts" });
  const otherGrid = el("div", { class: "grid2", id: "other-charts" });
  const otherSummary = el("summary", {}, "Other metrics");
  const other = el("details", { class: "card", id: "other-metrics" }, otherSummary, el("div", { style: "margin-top:12px" }, otherGrid));
  const ranksBody = el("tbody");
  const historyBody = el("tbody");
  const ckptBody = el("tbody");
  const wandb = el("div", { id: "wandb" });
  const logTabs = el("div", { class: "tabs", id: "log-tabs" });
  const logNote = el("div", { class: "muted", style: "margin-bottom:6px" });
  const logPre = el("pre", { class: "log", id: "log" });

  app.replaceChildren(
    el("p", {}, el("a", { href: "#/" }, "← All runs")),
    header, cause, chartsGrid, other,
    el("div", { class: "card" }, el("h2", {}, "Ranks"),
      el("table", { id: "ranks" }, el("thead", {}, el("tr", {},
        ["Rank", "Node", "Host", "PID", "State", "Step", "Last heartbeat", "Step time", "Pre-flight"]
          .map((h, i) => el("th", { class: [0, 3, 5, 7, 8].includes(i) ? "num" : "" }, h)))), ranksBody)),
    el("div", { class: "grid2" },
      el("div", { class: "card" }, el("h2", {}, "History"),
        el("table", { id: "history" }, el("thead", {}, el("tr", {},
          ["Gen", "When", "What", "Rank", "Step"].map((h) => el("th", {}, h)))), historyBody)),
      el("div", { class: "card" }, el("h2", {}, "Checkpoints"),
        el("table", { id: "checkpoints" }, el("thead", {}, el("tr", {},
          ["Step", "Size", "Committed", "Gen"].map((h, i) => el("th", { class: i < 2 ? "num" : "" }, h)))), ckptBody),
        el("h2", { style: "margin-top:14px" }, "Weights & Biases"), wandb)),
    el("div", { class: "card" }, el("h2", {}, "Logs"), logTabs, logNote, logPre));

  const drawHeader = (run) => {
    header.replaceChildren(
      el("div", { class: "row" }, el("h1", { id: "run-name" }, run.name), badge(run.state),
        el("span", { class: "mono muted" }, run.run_id), el("span", { class: "spacer" }), progress(run)),
      el("div", { class: "facts", style: "margin-top:12px" },
        fact("Generation", run.generation),
        fact("Restarts", run.restarts + " of " + run.max_restarts),
        run.scheduler === "SLURM" || run.preemptions > 0 ? fact("Requeues", run.preemptions + " of " + run.max_requeues) : null,
        fact("World", run.generation_nodes && run.generation_nodes.length > 0
          ? run.world_size + " (" + run.generation_nodes.length + " of " + run.nodes + " nodes × " + run.procs_per_node +
            "; lost " + run.lost_nodes.join(", ") + ")"
          : run.world_size + " (" + run.nodes + " × " + run.procs_per_node + ")"),
        fact("Scheduler", run.scheduler.toLowerCase() + (run.scheduler_job_id ? " · job " + run.scheduler_job_id : "")),
        fact("Created", el("span", { title: run.created_at }, ago(run.created_at))),
        fact(run.ended_at ? "Ended" : "Running for",
          run.ended_at ? el("span", { title: run.ended_at }, ago(run.ended_at))
            : duration((Date.now() - Date.parse(run.created_at)) / 1000)),
        fact("Latest checkpoint", run.latest_checkpoint_step === null ? "none" : "step " + run.latest_checkpoint_step),
        el("div", { class: "fact", style: "grid-column: span 4" }, el("div", { class: "k" }, "Experiment directory"),
          el("div", { class: "v mono", id: "exp-dir" }, run.exp_dir)),
        run.excluded_nodes.length ? fact("Excluded nodes", run.excluded_nodes.join(", ")) : null));
  };

  const drawCause = (run) => {
    // Where a run that seems stuck waits, and for whom.
    const waits = (run.open_barriers || []).map((b) => {
      const missing = run.world_size - b.arrived;
      return el("div", { class: "card warn barrier-wait" },
        el("h2", {}, "Waiting at barrier " + b.name + " (instance " + b.sequence + ")"),
        el("div", {}, b.arrived + " of " + run.world_size + " ranks arrived, the first " + ago(b.first_arrival) +
          "; waiting for rank" + (missing === 1 ? " " : "s ") + b.missing_ranks.join(", ") +
          (missing > b.missing_ranks.length ? ", …" : "")));
    });
    if (!run.reason) { cause.replaceChildren(...waits); return; }
    const failed = run.state === "FAILED";
    cause.replaceChildren(el("div", { class: "card alert" + (failed ? "" : " warn") },
      el("h2", {}, failed ? "Root cause" : "Last failure"),
      el("div", {}, run.reason.summary),
      run.reason.stack ? el("pre", {}, run.reason.stack) : null,
      verdictView(run.reason.verdict)), ...waits);
  };

  // A hang's verdict: its stacks grouped by rank, the odd group first and marked (dtctl stacks
  // prints the whole capture).
  const verdictView = (verdict) => {
    if (!verdict || !verdict.groups || !verdict.groups.length) return null;
    const frame = (f) => f.function + (f.file ? " (" + f.file + (f.line ? ":" + f.line : "") + ")" : "");
    const groups = [...verdict.groups].sort((a, b) => (b.odd ? 1 : 0) - (a.odd ? 1 : 0));
    return el("div", { class: "verdict" },
      el("h3", {}, "Stacks before the group was stopped"),
      verdict.collectives ? el("div", { class: "muted" }, "Collectives: " + verdict.collectives) : null,
      ...groups.map((g) => el("details", { class: "stack-group" + (g.odd ? " odd" : ""), open: g.odd ? "" : null },
        el("summary", {}, (g.odd ? "odd one out: " : "") + (g.ranks.length === 1 ? "rank " : "ranks ") + g.ranks.join(", ")),
        el("pre", {}, g.frames.slice(0, 24).map((f, i) => "#" + i + " " + frame(f)).join("\n")))));
  };

  const drawRanks = (run) => {
    const times = Object.values(run.rank_step_time || {}).map((t) => t.seconds).sort((a, b) => a - b);
    const median = times.length ? times[Math.floor(times.length / 2)] : 0;
    ranksBody.replaceChildren(...run.ranks.map((r) => {
      const t = (run.rank_step_time || {})[r.rank];
      // A rank a quarter slower than the median paces every step of data-parallel training.
      const straggler = t && times.length > 1 && median > 0 && t.seconds > 1.25 * median;
      const pre = r.preflight ? (r.preflight.error ? "device error" : (r.preflight.matmul_seconds * 1000).toFixed(1) + " ms") : "";
      return el("tr", { class: straggler ? "straggler" : "", "data-rank": r.rank },
        el("td", { class: "num" }, r.rank),
        el("td", {}, r.node),
        el("td", {}, r.host),
        el("td", { class: "num" }, r.pid),
        el("td", {}, badge(r.state)),
        el("td", { class: "num" }, r.step),
        el("td", { title: r.last_heartbeat }, ago(r.last_heartbeat)),
        el("td", { class: "num" }, t ? num(t.seconds) + " s" : "", straggler ? el("span", { class: "badge straggler" }, "straggler") : null),
        el("td", { class: "num" }, pre));
    }));
    if (run.ranks.length === 0) ranksBody.append(el("tr", {}, el("td", { colspan: 9, class: "empty" }, "No rank has registered in this generation yet.")));
  };

  const drawHistory = (run) => {
    const rows = run.failures.map((f) => el("tr", {},
      el("td", {}, f.generation),
      el("td", { title: f.time }, ago(f.time)),
      el("td", {}, el("details", {}, el("summary", {}, f.kind + (f.fatal ? " (fatal)" : "")),
        el("div", {}, f.summary),
        f.stopped_ranks.length ? el("div", { class: "muted" }, "stopped meanwhile (victims): ranks " + f.stopped_ranks.join(", ")) : null,
        f.stack ? el("pre", {}, f.stack) : null,
        verdictView(f.verdict))),
      el("td", {}, f.rank >= 0 ? f.rank + (f.node ? " on " + f.node : "") : "—"),
      el("td", {}, f.step)));
    rows.push(el("tr", {}, el("td", {}, run.generation), el("td", {}, ""),
      el("td", {}, TERMINAL.includes(run.state) ? "ended " + run.state : "current: " + run.state), el("td", {}, ""),
      el("td", {}, run.step)));
    historyBody.replaceChildren(...rows);
  };

  const drawWandb = (run) => {
    if (!run.wandb.length) {
      wandb.replaceChildren(el("div", { class: "muted" }, "Not forwarded to W&B (no project set for this run)."));
      return;
    }
    wandb.replaceChildren(...run.wandb.map((w) => el("div", {},
      /^https?:\/\//.test(w.url || "") ? el("a", { href: w.url, target: "_blank", rel: "noopener noreferrer" }, (w.entity ? w.entity + "/" : "") + w.project + "/" + w.run_id)
        : el("span", { class: "mono" }, w.project + "/" + w.run_id),
      el("span", { class: "muted" }, " · " + (w.name || "") + " · " + w.accepted + "/" + w.spooled + " points sent" +
        (w.mode === "offline" ? " · offline (spooled only)" : w.url ? "" : " · waiting for W&B to name the entity")))));
  };

  const drawCheckpoints = (list, run) => {
    ckptBody.replaceChildren(...list.slice().reverse().map((c) => el("tr", { title: c.path },
      el("td", { class: "num" }, c.step, c.step === run.latest_checkpoint_step ? el("span", { class: "badge SUCCEEDED", style: "margin-left:6px" }, "latest") : null),
      el("td", { class: "num" }, bytes(c.size)),
      el("td", { title: c.time }, c.committed ? ago(c.time) : "in progress"),
      el("td", {}, c.generation))));
    if (list.length === 0) ckptBody.append(el("tr", {}, el("td", { colspan: 4, class: "empty" }, "No checkpoint committed yet.")));
  };

  const chartCard = (name, title) => {
    if (!state.charts[name]) {
      const card = el("div", { class: "card chart", "data-metric": name },
        el("h2", {}, title, el("span", { class: "muted" }, name)),
        svg("svg", { preserveAspectRatio: "none", role: "img", "aria-label": title + " over steps" }),
        el("div", { class: "legend" }), el("div", { class: "tooltip" }));
      state.charts[name] = card;
    }
    return state.charts[name];
  };

  // The five charts of a training run first; whatever else the program logs below, folded.
  const drawCharts = () => {
    const names = Object.keys(state.series);
    const known = CHARTS.filter(([n]) => names.includes(n));
    const extra = names.filter((n) => !CHARTS.some(([k]) => k === n)).sort().slice(0, MAX_EXTRA_CHARTS).map((n) => [n, n]);
    chartsGrid.replaceChildren(...known.map(([n, title]) => chartCard(n, title)));
    if (known.length === 0) chartsGrid.append(el("div", { class: "card muted" }, "No training metrics yet."));
    otherGrid.replaceChildren(...extra.map(([n, title]) => chartCard(n, title)));
    otherSummary.textContent = "Other metrics (" + extra.length + ")";
    other.hidden = extra.length === 0;
    for (const [n] of known) drawChart(state.charts[n], n, state.series[n]);
    if (other.open) for (const [n] of extra) drawChart(state.charts[n], n, state.series[n]);
  };
  other.addEventListener("toggle", () => { if (other.open) drawCharts(); });

  // New points since the last read. The trailing step is read again: a rank's batch may land after
  // another rank's later one.
  const refreshSeries = async () => {
    let from = state.seriesFrom;
    for (;;) {
      const body = await api("runs/" + runId + "/series?from_step=" + from);
      for (const [name, ranks] of Object.entries(body.series)) {
        const byRank = state.series[name] || (state.series[name] = {});
        for (const [rank, points] of Object.entries(ranks)) {
          const old = (byRank[rank] || []).filter((p) => p[0] < from);
          byRank[rank] = old.concat(points);
        }
      }
      if (body.complete) break;
      from = body.next_from_step;
    }
    let frontier = Infinity;
    for (const ranks of Object.values(state.series)) {
      for (const points of Object.values(ranks)) if (points.length) frontier = Math.min(frontier, points[points.length - 1][0]);
    }
    state.seriesFrom = isFinite(frontier) ? frontier : 0;
  };

  // One tab per rank (the first 64) and "all ranks": every rank's lines in time order, a line
  // every rank printed alike shown once when "fold" is ticked.
  const refreshLog = async (run) => {
    // Every rank that may have a log: an elastic run's shrunk generation has fewer than its spec.
    const world = Math.max(1, run.world_size || 0, run.nodes * run.procs_per_node);
    const tabs = Math.min(world, 64);
    if (logTabs.childElementCount !== tabs + (world > 1 ? 2 : 0)) {
      const pick = (rank) => () => { state.logRank = rank; refreshLog(run).catch(showError); };
      const buttons = Array.from({ length: tabs }, (_, r) => el("button", { "data-rank": r, onclick: pick(r) }, "rank " + r));
      if (world > 1) {
        const fold = el("input", { type: "checkbox", id: "log-fold", onchange: () => { state.logFold = fold.checked; refreshLog(run).catch(showError); } });
        buttons.unshift(el("button", { "data-rank": "all", onclick: pick("all") }, "all ranks"));
        buttons.push(el("label", { class: "muted" }, fold, " fold lines every rank printed"));
      }
      logTabs.replaceChildren(...buttons);
    }
    for (const b of logTabs.querySelectorAll("button")) b.className = b.dataset.rank === String(state.logRank) ? "on" : "";
    const query = state.logRank === "all" && state.logFold ? "?fold=1" : "";
    const body = await api("runs/" + runId + "/logs/" + state.logRank + query);
    const atBottom = logPre.scrollTop + logPre.clientHeight >= logPre.scrollHeight - 8;
    logNote.textContent = body.file + (body.truncated ? " — last " + bytes(body.text.length) + " of " + bytes(body.size) : "");
    logPre.textContent = body.text || "(empty)";
    if (atBottom) logPre.scrollTop = logPre.scrollHeight;
  };

  let finalRefreshDone = false;
  poll(token, async () => {
    const run = await api("runs/" + runId);
    if (token !== viewToken) return;
    clearError();
    state.run = run;
    drawHeader(run);
    drawCause(run);
    drawRanks(run);
    drawHistory(run);
    drawWandb(run);
    await refreshSeries();
    if (token !== viewToken) return;
    drawCharts();
    const checkpoints = await api("runs/" + runId + "/checkpoints");
    if (token !== viewToken) return;
    drawCheckpoints(checkpoints.checkpoints, run);
    await refreshLog(run);
    if (TERMINAL.includes(run.state)) finalRefreshDone = true;
  }, () => !finalRefreshDone);
}

// ---- Routing ----------------------------------------------------------------------------

function route() {
  stop();
  viewToken++;
  const hash = window.location.hash.replace(/^#/, "") || "/";
  const [path, query] = hash.split("?");
  const params = new URLSearchParams(query || "");
  const m = path.match(/^\/runs\/(r-[0-9a-f]{16})$/);
  if (m) runView(m[1]);
  else runsView(params);
}

async function start() {
  try {
    const who = await api("whoami");
    document.getElementById("who").textContent = who.admin ? "signed in as admin" : "signed in with the token of run " + who.run_id;
  } catch (e) {
    showError(e);
  }
  window.addEventListener("hashchange", route);
  route();
}

start();
