// boxqueue's dashboard: one EventSource on api/events (a snapshot a second), plots drawn as SVG.
"use strict";

const APIS = ["iproto", "console", "deckard", "zaqar", "sonya"];
const TASK_SERIES = [["puts", "#2b6cb0"], ["takes", "#1f8a4c"], ["acks", "#805ad5"], ["releases", "#b7791f"],
  ["expiries", "#c53030"]];
const API_COLORS = { iproto: "#2b6cb0", console: "#6b7280", deckard: "#805ad5", zaqar: "#1f8a4c", sonya: "#d69e2e" };
const STATES = ["ready", "delayed", "taken", "buried", "done"];
const ROW_HISTORY = 120;
const SVG = "http://www.w3.org/2000/svg";

const view = { q: "", sort: "name", page: 0, size: 50 };
let source = null;
let history = [];          // {t, tasks: {...}, requests: {api: n}} one a second, from the server
let previous = null;       // the previous snapshot, for rates
const rows = new Map();    // "space/tube" -> [{t, depth, puts, takes, acks}] seen since the page opened

const $ = (id) => document.getElementById(id);

function connect() {
  if (source) source.close();
  const params = new URLSearchParams({ q: view.q, sort: view.sort, page: view.page, size: view.size });
  source = new EventSource("api/events?" + params.toString());
  source.onmessage = (event) => render(JSON.parse(event.data));
  source.onerror = () => setState("offline");
}

function setState(state) {
  const badge = $("state");
  badge.textContent = state;
  badge.className = "state state-" + state;
}

function fmt(n, digits = 0) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  if (Math.abs(n) >= 1e9) return (n / 1e9).toFixed(1) + "G";
  if (Math.abs(n) >= 1e6) return (n / 1e6).toFixed(1) + "M";
  if (Math.abs(n) >= 1e4) return (n / 1e3).toFixed(1) + "k";
  return n.toFixed(digits);
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + units[i];
}

function duration(s) {
  if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + " s";
  if (s < 3600) return (s / 60).toFixed(1) + " min";
  if (s < 86400) return (s / 3600).toFixed(1) + " h";
  return (s / 86400).toFixed(1) + " d";
}

function card(title, pairs, id) {
  const el = document.createElement("div");
  el.className = "card";
  if (id) el.id = id;
  const h = document.createElement("h3");
  h.textContent = title;
  const dl = document.createElement("dl");
  for (const [key, value] of pairs) {
    const dt = document.createElement("dt");
    dt.textContent = key;
    const dd = document.createElement("dd");
    dd.textContent = value;
    dl.append(dt, dd);
  }
  el.append(h, dl);
  return el;
}

function rate(now, before, dt) {
  if (before === undefined || before === null || dt <= 0) return null;
  return Math.max(now - before, 0) / dt;
}

function render(data) {
  setState(data.state);
  $("uptime").textContent = "up " + duration(data.uptime);
  $("updated").textContent = "updated " + new Date(data.t * 1000).toLocaleTimeString();
  if (data.history) history = data.history.slice();
  else history.push({ t: data.t, tasks: data.tasks, requests: Object.fromEntries(
    Object.entries(data.apis).map(([api, a]) => [api, a.requests])) });
  if (history.length > 600) history.splice(0, history.length - 600);
  const dt = previous ? data.t - previous.t : 0;
  renderRecovery(data.storage.recovery);
  renderApis(data, dt);
  renderReplica(data.replica);
  renderStorage(data, dt);
  plot($("plot-tasks"), $("legend-tasks"), TASK_SERIES.map(([name, color]) => ({
    name, color, values: rates(history, (p) => p.tasks[name]) })));
  plot($("plot-requests"), $("legend-requests"), APIS.filter((api) => api in data.apis).map((api) => ({
    name: api, color: API_COLORS[api], values: rates(history, (p) => (p.requests || {})[api]) })));
  renderTubes(data.tubes, data.t);
  renderErrors(data.errors);
  previous = data;
}

function renderRecovery(recovery) {
  const box = $("recovery");
  if (!recovery || recovery.state === "done") { box.hidden = true; return; }
  box.hidden = false;
  $("recovery-progress").value = recovery.fraction;
  const left = recovery.seconds_left === null ? "" : `, about ${duration(recovery.seconds_left)} left`;
  $("recovery-text").textContent = `${fmt(recovery.loaded)} of ${fmt(recovery.total)} tasks${left}`;
}

function renderApis(data, dt) {
  const box = $("apis");
  box.replaceChildren();
  for (const api of APIS) {
    const a = data.apis[api];
    if (!a) continue;
    const p = previous && previous.apis[api];
    const count = p ? a.latency_count - p.latency_count : 0;
    const latency = count > 0 ? (a.latency_sum - p.latency_sum) / count * 1000 : null;
    const pairs = [];
    if (a.connections !== null && a.connections !== undefined) pairs.push(["connections", fmt(a.connections)]);
    pairs.push(["in progress", fmt(a.in_progress)]);
    pairs.push(["requests/s", fmt(rate(a.requests, p && p.requests, dt), 1)]);
    pairs.push(["errors/s", fmt(rate(a.errors, p && p.errors, dt), 1)]);
    pairs.push(["avg latency", latency === null ? "–" : latency.toFixed(2) + " ms"]);
    pairs.push(["requests", fmt(a.requests)]);
    box.append(card(api, pairs, "api-" + api));
  }
}

// The replica set as this node sees it (absent outside one): its own election, then every peer
// with the role, term and lag this node can vouch for ("unknown" where it cannot see).
function renderReplica(replica) {
  const box = $("replica");
  if (!replica) { box.hidden = true; return; }
  box.hidden = false;
  $("replica-summary").textContent = replica.leader
    ? `(leader ${replica.leader}, term ${replica.term})` : `(no leader, term ${replica.term})`;
  $("replica-node").replaceChildren(card("this node: " + replica.name, [
    ["election state", replica.state], ["term", String(replica.term)], ["leader", replica.leader || "none"],
    ["read only", replica.ro ? "yes" : "no"], ["lsn", String(replica.lsn)],
    ["synchro quorum", String(replica.quorum)], ["awaiting quorum", fmt(replica.queue_len)]], "replica-card"));
  const out = replica.peers.map((p) => {
    const tr = document.createElement("tr");
    tr.dataset.peer = p.name;
    if (p.self) tr.className = "self";
    const stream = p.status === null ? "stream-none" : p.status === "follow" ? "" : "stream-down";
    const cells = [
      [p.self ? p.name + " (this node)" : p.name, "name"], [String(p.id), "n id"], [p.role, "role role-" + p.role],
      [p.term === null ? "–" : String(p.term), "n term"], [p.status || "–", "status " + stream],
      [p.lsn === null ? "–" : String(p.lsn), "n lsn"], [fmt(p.lag_records), "n lag-records"],
      [p.lag_s === null ? "–" : duration(p.lag_s), "n lag"],
    ];
    for (const [text, cls] of cells) {
      const td = document.createElement("td");
      td.className = cls;
      td.textContent = text;
      tr.append(td);
    }
    if (p.message) tr.title = p.message;
    return tr;
  });
  document.querySelector("#replica-peers tbody").replaceChildren(...out);
}

function renderStorage(data, dt) {
  const box = $("storage");
  box.replaceChildren();
  const s = data.storage;
  const p = previous && previous.storage;
  const commits = rate(s.commits, p && p.commits, dt);
  const writes = rate(s.writes, p && p.writes, dt);
  const pairs = [
    ["LMDB used", s.used === undefined ? "–" : bytes(s.used)],
    ["map size", s.map_size === undefined ? "–" : bytes(s.map_size)],
    ["data file", s.file === undefined ? "–" : bytes(s.file)],
    ["wal mode", s.wal_mode || "–"],
    ["commits/s", fmt(commits, 1)],
    ["writes per commit", commits ? fmt(writes / commits, 1) : "–"],
    ["recovery took", s.recovery && s.recovery.seconds !== null ? duration(s.recovery.seconds) : "–"],
  ];
  for (const [name, value] of Object.entries(s.plugged || {})) pairs.push([name, fmt(value)]);
  box.append(card("storage", pairs, "storage-card"));
  if (data.lua) {
    const l = data.lua;
    box.append(card("Lua", [["jobs", fmt(l.jobs)], ["failed", fmt(l.failed)], ["Lua time", duration(l.seconds)],
      ["time limit hits", fmt(l.time_limit_hits)], ["memory limit hits", fmt(l.memory_limit_hits)],
      ["memory", bytes(l.memory)]], "lua-card"));
  }
  if (data.sonya) {
    const y = data.sonya;
    const q = previous && previous.sonya;
    box.append(card("Sonya", [["queues", fmt(y.queues)], ["listeners", fmt(y.listeners)],
      ["messages/s", fmt(rate(y.messages, q && q.messages, dt), 1)],
      ["deliveries/s", fmt(rate(y.deliveries, q && q.deliveries, dt), 1)],
      ["closed for lag", fmt(y.closed_for_lag)]], "sonya-card"));
  }
  const t = data.tasks;
  box.append(card("tasks since start", [["puts", fmt(t.puts)], ["takes", fmt(t.takes)], ["acks", fmt(t.acks)],
    ["releases", fmt(t.releases)], ["buries", fmt(t.buries)], ["expiries", fmt(t.expiries)]], "tasks-card"));
}

function rates(points, pick) {
  const out = [];
  for (let i = 1; i < points.length; i++) {
    const a = pick(points[i - 1]);
    const b = pick(points[i]);
    const dt = points[i].t - points[i - 1].t;
    out.push({ t: points[i].t, v: a === undefined || b === undefined || dt <= 0 ? 0 : Math.max(b - a, 0) / dt });
  }
  return out;
}

function el(name, attrs) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

function plot(svg, legend, series) {
  const W = 600, H = 170, left = 44, bottom = 18, top = 8;
  svg.replaceChildren();
  const all = series.flatMap((s) => s.values);
  const now = history.length ? history[history.length - 1].t : Date.now() / 1000;
  const span = 600;
  const max = Math.max(1, ...all.map((p) => p.v));
  const x = (t) => left + (W - left - 4) * (1 - (now - t) / span);
  const y = (v) => top + (H - top - bottom) * (1 - v / max);
  for (const frac of [0, 0.5, 1]) {
    svg.append(el("line", { x1: left, x2: W, y1: y(max * frac), y2: y(max * frac), stroke: "#e3e6eb" }));
    const label = el("text", { x: left - 4, y: y(max * frac) + 4, "text-anchor": "end", "font-size": 11, fill: "#6b7280" });
    label.textContent = fmt(max * frac, max < 10 ? 1 : 0);
    svg.append(label);
  }
  for (const minutes of [10, 5, 0]) {
    const anchor = minutes === 10 ? "start" : minutes === 0 ? "end" : "middle";
    const label = el("text", { x: x(now - minutes * 60), y: H - 4, "text-anchor": anchor, "font-size": 11, fill: "#6b7280" });
    label.textContent = minutes ? `-${minutes} min` : "now";
    svg.append(label);
  }
  for (const s of series) {
    const pts = s.values.filter((p) => now - p.t <= span);
    if (pts.length < 2) continue;
    const d = pts.map((p, i) => (i ? "L" : "M") + x(p.t).toFixed(1) + "," + y(p.v).toFixed(1)).join(" ");
    svg.append(el("path", { d, fill: "none", stroke: s.color, "stroke-width": 1.6, "data-series": s.name }));
  }
  legend.replaceChildren(...series.map((s) => {
    const span = document.createElement("span");
    span.style.setProperty("--swatch", s.color);
    const last = s.values.length ? s.values[s.values.length - 1].v : 0;
    span.textContent = `${s.name} ${fmt(last, 1)}/s`;
    return span;
  }));
}

function sparkline(points) {
  const W = 160, H = 28;
  const svg = el("svg", { class: "spark", viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none" });
  if (points.length < 2) return svg;
  const depthMax = Math.max(1, ...points.map((p) => p.depth));
  const putRates = points.map((p, i) => (i ? Math.max(p.puts - points[i - 1].puts, 0) / Math.max(p.t - points[i - 1].t, 1e-3) : 0));
  const rateMax = Math.max(1, ...putRates);
  const t0 = points[0].t, t1 = points[points.length - 1].t;
  const x = (t) => (t1 > t0 ? (W - 2) * (t - t0) / (t1 - t0) : 0) + 1;
  const depth = points.map((p, i) => (i ? "L" : "M") + x(p.t).toFixed(1) + "," + (H - 2 - (H - 4) * p.depth / depthMax).toFixed(1)).join(" ");
  const puts = points.map((p, i) => (i ? "L" : "M") + x(p.t).toFixed(1) + "," + (H - 2 - (H - 4) * putRates[i] / rateMax).toFixed(1)).join(" ");
  svg.append(el("path", { d: puts, fill: "none", stroke: "#2b6cb0", "stroke-width": 1, opacity: 0.6, class: "puts" }));
  svg.append(el("path", { d: depth, fill: "none", stroke: "#1d2330", "stroke-width": 1.5, class: "depth" }));
  return svg;
}

function renderTubes(tubes, t) {
  $("tube-count").textContent = tubes.matching === tubes.all ? `(${fmt(tubes.all)})` : `(${fmt(tubes.matching)} of ${fmt(tubes.all)} match)`;
  const pages = Math.max(1, Math.ceil(tubes.matching / tubes.size));
  $("page-info").textContent = `page ${tubes.page + 1} of ${pages}`;
  $("prev").disabled = tubes.page <= 0;
  $("next").disabled = tubes.page + 1 >= pages;
  const body = document.querySelector("#tubes tbody");
  const shown = new Set();
  const out = [];
  for (const r of tubes.rows) {
    const key = r.space + "/" + r.tube;
    shown.add(key);
    const depth = STATES.reduce((sum, s) => sum + r.states[s], 0);
    const seen = rows.get(key) || [];
    const last = seen[seen.length - 1];
    seen.push({ t, depth, puts: r.tally.puts, takes: r.tally.takes, acks: r.tally.acks });
    if (seen.length > ROW_HISTORY) seen.shift();
    rows.set(key, seen);
    const dt = last ? t - last.t : 0;
    const tr = document.createElement("tr");
    tr.dataset.key = key;
    if (last && (last.depth !== depth || last.puts !== r.tally.puts || last.acks !== r.tally.acks)) tr.className = "changed";
    const cells = [
      [r.space, "space"], [r.tube, "tube"], [r.kind, "kind"],
      ...STATES.map((s) => [fmt(r.states[s]), "n " + s]),
      [fmt(r.waiting), "n waiting"],
      [r.states.ready ? duration(r.oldest_ready_s) : "–", "n oldest"],
      [fmt(rate(r.tally.puts, last && last.puts, dt), 1), "n puts"],
      [fmt(rate(r.tally.takes, last && last.takes, dt), 1), "n takes"],
      [fmt(rate(r.tally.acks, last && last.acks, dt), 1), "n acks"],
    ];
    for (const [text, cls] of cells) {
      const td = document.createElement("td");
      td.className = cls;
      td.textContent = text;
      tr.append(td);
    }
    const spark = document.createElement("td");
    spark.className = "plot";
    spark.append(sparkline(seen));
    tr.append(spark);
    out.push(tr);
  }
  if (!out.length) {
    const tr = document.createElement("tr");
    const td = document.createElement("td");
    td.colSpan = 14;
    td.className = "empty";
    td.textContent = tubes.all ? "no tube matches" : "no tubes yet";
    tr.append(td);
    out.push(tr);
  }
  body.replaceChildren(...out);
  for (const key of rows.keys()) if (!shown.has(key) && rows.size > 2000) rows.delete(key);
}

function renderErrors(errors) {
  const body = document.querySelector("#errors tbody");
  const out = errors.map((e) => {
    const tr = document.createElement("tr");
    for (const text of [new Date(e.at * 1000).toLocaleTimeString(), e.api, e.operation, e.code, e.message]) {
      const td = document.createElement("td");
      td.textContent = text;
      tr.append(td);
    }
    return tr;
  });
  if (!out.length) {
    const tr = document.createElement("tr");
    const td = document.createElement("td");
    td.colSpan = 5;
    td.className = "empty";
    td.textContent = "none";
    tr.append(td);
    out.push(tr);
  }
  body.replaceChildren(...out);
}

let typing = null;
$("search").addEventListener("input", () => {
  clearTimeout(typing);
  typing = setTimeout(() => { view.q = $("search").value.trim(); view.page = 0; connect(); }, 250);
});
$("sort").addEventListener("change", () => { view.sort = $("sort").value; view.page = 0; connect(); });
$("prev").addEventListener("click", () => { if (view.page > 0) { view.page--; connect(); } });
$("next").addEventListener("click", () => { view.page++; connect(); });
connect();
