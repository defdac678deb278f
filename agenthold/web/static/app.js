// The live page of `agenthold web`: one event stream (server-sent events, pushed by the change
// feed), no polling and no reload. Every text from the database goes in through textContent,
// never as HTML. Long lists (claims, the log) render only the rows on screen.
"use strict";

const ROW = 26; // px: the height of one row of a long list
const $ = (id) => document.getElementById(id);
let clock = 0; // the database's clock minus this browser's, in seconds
let overview = null;
let log = []; // the events loaded, oldest first
let before = null; // the cursors of the next older page, or null when there is none
let stream = null;

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}
function dbNow() { return Date.now() / 1000 + clock; }
function span(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
  if (s < 86400) return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
  return Math.floor(s / 86400) + "d";
}
function since(iso) { return iso ? span(dbNow() - Date.parse(iso) / 1000) : "-"; }
function leaseText(end) {
  if (end === null || end === undefined) return "no expiry";
  const left = end - dbNow();
  return left > 0 ? "in " + span(left) : "ended " + span(-left) + " ago";
}
function leaseCell(end) {
  const c = el("span", leaseText(end), "lease");
  if (end !== null && end !== undefined) {
    c.dataset.end = end;
    if (end - dbNow() < 30) c.classList.add("soon");
  }
  return c;
}
function ageCell(iso) { const c = el("span", since(iso), "age"); if (iso) c.dataset.at = iso; return c; }
function link(text, hash, cls) { const a = el("a", text, cls); a.href = hash; return a; }
function whyLink(uri) { return link(uri, "#why=" + encodeURIComponent(uri), "res"); }
function cell(row, content) {
  const td = el("td");
  if (content instanceof Node) td.append(content); else td.textContent = content ?? "-";
  row.append(td);
  return td;
}
async function getJSON(url) {
  const reply = await fetch(url, { credentials: "same-origin" });
  if (reply.status === 401) { signIn(); throw new Error("a token is needed"); }
  const body = await reply.json();
  if (!reply.ok) throw new Error(body.error || reply.statusText);
  return body;
}

// -- a list that renders only what is on screen ----------------------------------------------
class VList {
  constructor(box, render) {
    this.box = box; this.render = render; this.items = [];
    this.pad = el("div", null, "vpad"); this.rows = el("div", null, "vrows");
    box.append(this.pad, this.rows);
    box.addEventListener("scroll", () => this.draw());
    this.onTop = null;
  }
  // how: "bottom" jumps to the end, "follow" stays at the end if it was there, "prepend" keeps
  // the rows on screen where they are while older ones are put above them
  set(items, how) {
    const atEnd = this.box.scrollTop + this.box.clientHeight >= this.box.scrollHeight - ROW;
    const grew = items.length - this.items.length;
    this.items = items;
    this.pad.style.height = items.length * ROW + "px";
    if (how === "bottom" || (how === "follow" && atEnd)) this.box.scrollTop = this.box.scrollHeight;
    else if (how === "prepend") this.box.scrollTop += grew * ROW;
    this.draw();
  }
  draw() {
    const first = Math.max(0, Math.floor(this.box.scrollTop / ROW) - 5);
    const last = Math.min(this.items.length, first + Math.ceil(this.box.clientHeight / ROW) + 10);
    this.rows.replaceChildren();
    this.rows.style.top = first * ROW + "px";
    for (let i = first; i < last; i++) this.rows.append(this.render(this.items[i], i));
    const scrolls = this.box.scrollHeight > this.box.clientHeight;
    if (scrolls && this.box.scrollTop < ROW && this.onTop) this.onTop();
  }
}

// -- the overview ----------------------------------------------------------------------------
let claimList, logList;

function showOverview(data) {
  overview = data;
  clock = data.now - Date.now() / 1000;
  $("database").textContent = data.database;
  const agents = $("agents");
  agents.replaceChildren();
  for (const a of data.agents) {
    const tr = el("tr", null, a.lease_state === "ended" ? "gone" : "");
    tr.dataset.agent = a.agent_id;
    const name = link(a.name, "#", "agent");
    name.addEventListener("click", (ev) => { ev.preventDefault(); setFilter(a.name, ""); });
    cell(tr, name); cell(tr, a.model || "-"); cell(tr, leaseCell(a.lease_end));
    cell(tr, a.claims_held); cell(tr, a.waiting);
    agents.append(tr);
  }
  $("agents-count").textContent = data.agents.length;
  const queue = new Map(data.queue.map((w) => [w.seq, w]));
  const lines = [];
  for (const c of data.claims) {
    lines.push({ kind: "claim", c });
    c.queue.forEach((seq, i) => {
      if (queue.has(seq)) lines.push({ kind: "wait", w: queue.get(seq), place: i + 1, of: c.resource });
    });
    const shown = c.covers.slice(0, 8);
    shown.forEach((f) => lines.push({ kind: "covers", f }));
    if (c.covers.length > shown.length) lines.push({ kind: "more", n: c.covers.length - shown.length });
  }
  claimList.set(lines);
  $("claims-count").textContent = data.claims.length + " held, " + data.queue.length + " waiting";
  fillList("agent-names", data.agents.map((a) => a.name));
  fillList("resource-names", data.claims.map((c) => c.resource).concat(data.namespaces.map((n) => n.namespace)));
  const ns = $("namespaces");
  ns.replaceChildren();
  for (const n of data.namespaces) {
    const tr = el("tr");
    const a = link(n.namespace, "#", "ns");
    a.addEventListener("click", (ev) => { ev.preventDefault(); showKeys(n.namespace); });
    cell(tr, a); cell(tr, n.record_count); cell(tr, n.deleted_count); cell(tr, ageCell(n.updated_at)); cell(tr, n.updated_by);
    ns.append(tr);
  }
  const th = $("threads");
  th.replaceChildren();
  for (const t of data.threads) {
    const tr = el("tr");
    cell(tr, t.name || t.thread_id.slice(0, 8)); cell(tr, t.message_count);
    const who = el("span");
    for (const p of t.participants) who.append(el("span", p.name + " " + p.unread, p.unread ? "unread" : "read"));
    cell(tr, who); cell(tr, t.last_activity_at ? since(t.last_activity_at) + " ago" : "-");
    th.append(tr);
  }
}
function fillList(id, names) {
  const list = $(id); list.replaceChildren();
  for (const n of [...new Set(names)].sort()) { const o = el("option"); o.value = n; list.append(o); }
}
function claimRow(line) {
  const row = el("div", null, "cols claim-cols " + line.kind);
  if (line.kind === "claim") {
    const c = line.c;
    const res = el("span");
    res.append(el("span", c.kind, "badge " + c.kind), whyLink(c.resource));
    row.append(res, el("span", c.holder_name || c.holder), el("span", c.mode, "mode " + c.mode),
      el("span", "v" + c.version), ageCell(c.claimed_at), leaseCell(c.lease_end));
  } else if (line.kind === "wait") {
    const w = line.w;
    row.append(el("span", "waiting #" + line.place + (w.resource !== line.of ? " for " + w.resource : ""), "indent"),
      el("span", w.name || w.agent_id), el("span", w.mode, "mode " + w.mode), el("span", ""),
      ageCell(w.since), leaseCell(w.until));
  } else if (line.kind === "covers") {
    row.append(el("span", "└ " + line.f, "indent file"));
  } else {
    row.append(el("span", "└ and " + line.n + " more", "indent file"));
  }
  return row;
}

// -- the event log ---------------------------------------------------------------------------
function filters() { return { agent: $("f-agent").value.trim(), resource: $("f-resource").value.trim() }; }
let applied = {}; // the filter of the log as the server resolved it (a path becomes a URI)
function matches(e) {
  const f = applied;
  if (f.agent && f.agent !== e.actor && f.agent !== e.agent_id) return false;
  if (f.uri) return e.resource === f.uri;
  if (f.namespace) return e.namespace === f.namespace && (!f.key || e.key === f.key);
  return true;
}
function logRow(e) {
  const row = el("div", null, "logrow " + e.event);
  row.append(el("span", e.at.slice(11, 23), "time"), el("span", e.actor, "actor"), el("span", e.event, "event"),
    el("span", e.version ?? "-", "ver"));
  row.append(e.resource ? whyLink(e.what) : el("span", e.what, "what"));
  return row;
}
async function loadLog(older) {
  const f = filters();
  const q = new URLSearchParams({ limit: "200" });
  if (f.agent) q.set("agent", f.agent);
  if (f.resource) q.set("resource", f.resource);
  if (older) { if (!before) return; q.set("before", before.join(",")); }
  const page = await getJSON("/api/events?" + q);
  applied = page.filter;
  before = page.more ? page.before : null;
  log = older ? page.events.concat(log) : page.events;
  logList.set(log, older ? "prepend" : "bottom");
  $("log-count").textContent = log.length + (before ? "+" : "") + " events";
}
let loadingOlder = false;
async function older() {
  if (loadingOlder || !before) return;
  loadingOlder = true;
  try { await loadLog(true); } finally { loadingOlder = false; }
}
function setFilter(agent, resource) {
  $("f-agent").value = agent; $("f-resource").value = resource;
  location.hash = ""; loadLog(false);
}

// -- the other views -------------------------------------------------------------------------
async function showKeys(ns) {
  const keys = await getJSON("/api/keys?namespace=" + encodeURIComponent(ns));
  const box = $("keys"); box.replaceChildren(el("h3", "Keys of " + ns));
  const t = el("table"); box.append(t);
  for (const k of keys) {
    const tr = el("tr");
    cell(tr, link(k.key, "#key=" + encodeURIComponent(ns) + "/" + encodeURIComponent(k.key)));
    cell(tr, "v" + k.version); cell(tr, k.updated_by); cell(tr, JSON.stringify(k.value), "value");
    t.append(tr);
  }
}
async function showWhy(uri) {
  const why = await getJSON("/api/why?resource=" + encodeURIComponent(uri));
  clock = why.now - Date.now() / 1000;
  $("why-resource").textContent = why.resource;
  $("why-answer").textContent = why.free
    ? "Nothing stands in its way: a claim now would be granted."
    : why.claims.length + " claim(s) and " + why.queue.length + " wait(s) in line stand in its way.";
  const rows = $("why-claims"); rows.replaceChildren();
  for (const c of why.claims) {
    const tr = el("tr"); cell(tr, whyLink(c.resource)); cell(tr, c.holder_name || c.holder); cell(tr, c.mode);
    cell(tr, "v" + c.version); cell(tr, ageCell(c.claimed_at)); cell(tr, leaseCell(c.lease_end)); cell(tr, c.why);
    rows.append(tr);
  }
  const q = $("why-queue"); q.replaceChildren();
  why.queue.forEach((w, i) => {
    const tr = el("tr"); cell(tr, i + 1); cell(tr, w.name || w.agent_id); cell(tr, whyLink(w.resource)); cell(tr, w.mode);
    cell(tr, ageCell(w.since)); q.append(tr);
  });
}
async function showHistory(ref) {
  const slash = ref.indexOf("/");
  const ns = decodeURIComponent(ref.slice(0, slash)), key = decodeURIComponent(ref.slice(slash + 1));
  const rows = await getJSON("/api/history?" + new URLSearchParams({ namespace: ns, key }));
  $("history-key").textContent = ns + "/" + key;
  const body = $("history-rows"); body.replaceChildren();
  for (const h of rows) {
    const tr = el("tr"); cell(tr, "v" + h.version); cell(tr, h.event_type); cell(tr, h.updated_by);
    cell(tr, ageCell(h.updated_at)); cell(tr, h.event_type === "delete" ? "-" : JSON.stringify(h.value));
    body.append(tr);
  }
}
function route() {
  const hash = location.hash.slice(1);
  for (const id of ["overview", "why", "history"]) $(id).hidden = true;
  if (hash.startsWith("why=")) { $("why").hidden = false; showWhy(decodeURIComponent(hash.slice(4))).catch(report); }
  else if (hash.startsWith("key=")) { $("history").hidden = false; showHistory(hash.slice(4)).catch(report); }
  else { $("overview").hidden = false; claimList.draw(); logList.draw(); }
}
function report(err) { $("live").textContent = String(err.message || err); $("live").className = "off"; }

// -- live ------------------------------------------------------------------------------------
function connect() {
  stream = new EventSource("/api/stream");
  stream.addEventListener("open", () => { $("live").textContent = "live"; $("live").className = "on"; });
  stream.addEventListener("error", () => { $("live").textContent = "reconnecting…"; $("live").className = "off"; });
  stream.addEventListener("overview", (m) => {
    showOverview(JSON.parse(m.data));
    if (location.hash.startsWith("#why=")) showWhy(decodeURIComponent(location.hash.slice(5))).catch(report);
  });
  stream.addEventListener("events", (m) => {
    const fresh = JSON.parse(m.data).filter(matches);
    if (!fresh.length) return;
    log = log.concat(fresh);
    logList.set(log, "follow");
    $("log-count").textContent = log.length + (before ? "+" : "") + " events";
  });
  stream.addEventListener("resync", () => loadLog(false).catch(report));
}
function tick() { // only the clocks on screen move; nothing is fetched
  for (const c of document.querySelectorAll(".lease[data-end]")) {
    c.textContent = leaseText(Number(c.dataset.end));
    c.classList.toggle("soon", Number(c.dataset.end) - dbNow() < 30);
  }
  for (const c of document.querySelectorAll(".age[data-at]")) c.textContent = since(c.dataset.at);
}
function signIn() {
  $("login").hidden = false;
  for (const id of ["overview", "why", "history"]) $(id).hidden = true;
}
async function start() {
  try { await getJSON("/api/overview"); } catch (err) { return; }
  $("login").hidden = true;
  route();
  await loadLog(false);
  connect();
  setInterval(tick, 1000);
}
window.addEventListener("DOMContentLoaded", () => {
  claimList = new VList($("claims"), claimRow);
  logList = new VList($("log"), logRow);
  logList.onTop = older;
  window.addEventListener("hashchange", route);
  for (const id of ["f-agent", "f-resource"]) $(id).addEventListener("change", () => loadLog(false).catch(report));
  $("f-clear").addEventListener("click", () => setFilter("", ""));
  $("login").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const reply = await fetch("/api/login", { method: "POST", credentials: "same-origin",
      headers: { "content-type": "application/json" }, body: JSON.stringify({ token: $("token").value }) });
    if (reply.ok) { $("token").value = ""; start(); }
    else $("login-error").textContent = (await reply.json()).error;
  });
  start();
});
