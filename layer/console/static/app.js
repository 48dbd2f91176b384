// The qlayer console: polls the coordinator's JSON API (/api/...) once a second and draws the
// queues overview (#/) or one queue (#/queue/NAME). Plain JavaScript, no build step.
"use strict";

const POLL_MS = 1000;
const HISTORY = 120; // rate points kept for the chart
const state = { last: {}, history: {}, timer: null, browseLoaded: null };

const $ = (sel) => document.querySelector(sel);
const tokenInput = $("#token");
tokenInput.value = localStorage.getItem("qlayer-token") || "";
tokenInput.addEventListener("change", () => {
  localStorage.setItem("qlayer-token", tokenInput.value);
  poll();
});

async function api(path, options = {}) {
  const headers = { "Content-Type": "application/json" };
  if (tokenInput.value) headers.Authorization = "Bearer " + tokenInput.value;
  const response = await fetch(path, { ...options, headers });
  const body = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function text(value) {
  if (value === null || value === undefined) return "";
  if (typeof value === "object" && value.base64 !== undefined) return "base64:" + value.base64;
  return String(value);
}

function cell(row, value, cls) {
  const td = row.insertCell();
  td.textContent = text(value);
  if (cls) td.className = cls;
  return td;
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 60) return seconds.toFixed(1) + " s";
  if (seconds < 3600) return (seconds / 60).toFixed(1) + " min";
  return (seconds / 3600).toFixed(1) + " h";
}

function showError(message) {
  const el = $("#error");
  el.hidden = !message;
  el.textContent = message || "";
}

// Rates from two readings of the counters.
function rates(q, now) {
  const before = state.last[q.queue];
  const figures = {
    ingested: q.extra.ingested_total || 0,
    delivered: q.delivered_total,
    acked: q.acked_total,
  };
  state.last[q.queue] = { at: now, figures };
  const out = { ingested: 0, delivered: 0, acked: 0 };
  if (before) {
    const dt = (now - before.at) / 1000;
    for (const k of Object.keys(out)) out[k] = Math.max(0, (figures[k] - before.figures[k]) / dt);
  }
  const h = (state.history[q.queue] = state.history[q.queue] || []);
  h.push(out);
  if (h.length > HISTORY) h.shift();
  return out;
}

async function drawOverview() {
  const queues = await api("/api/queues");
  const now = Date.now();
  const body = $("#queues tbody");
  body.replaceChildren();
  for (const q of queues) {
    const r = rates(q, now);
    const row = body.insertRow();
    row.dataset.queue = q.queue;
    row.className = "clickable";
    row.addEventListener("click", () => (location.hash = "#/queue/" + encodeURIComponent(q.queue)));
    cell(row, q.queue, "name");
    cell(row, q.available, "num available");
    cell(row, q.leased, "num leased");
    cell(row, q.inactive, "num inactive");
    cell(row, r.ingested.toFixed(1), "num rate-in");
    cell(row, r.acked.toFixed(1), "num rate-acked");
    cell(row, q.extra.unread, "num lag");
    cell(row, age(q.oldest_available_age_s), "num oldest");
    cell(row, q.subscriptions, "num consumers");
    cell(row, q.dead_lettered_total, "num dead");
  }
}

function figure(container, label, value, cls) {
  const div = document.createElement("div");
  div.className = "figure " + cls;
  const b = document.createElement("b");
  b.textContent = text(value);
  const span = document.createElement("span");
  span.textContent = label;
  div.append(b, span);
  container.append(div);
}

function drawChart(points) {
  const canvas = $("#q-chart");
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 24;
  ctx.clearRect(0, 0, w, h);
  const max = Math.max(1, ...points.flatMap((p) => [p.ingested, p.delivered, p.acked]));
  ctx.fillStyle = "#6b7385";
  ctx.font = "11px sans-serif";
  ctx.fillText(max.toFixed(1) + " /s", 4, 12);
  ctx.strokeStyle = "#dde1e8";
  ctx.beginPath();
  ctx.moveTo(pad, h - pad);
  ctx.lineTo(w, h - pad);
  ctx.stroke();
  const series = [["ingested", "#2f6fde"], ["delivered", "#e67e22"], ["acked", "#27ae60"]];
  for (const [key, color] of series) {
    ctx.strokeStyle = color;
    ctx.lineWidth = 2;
    ctx.beginPath();
    points.forEach((p, i) => {
      const x = pad + ((w - pad) * i) / (HISTORY - 1);
      const y = h - pad - ((h - 2 * pad) * p[key]) / max;
      if (i === 0) ctx.moveTo(x, y);
      else ctx.lineTo(x, y);
    });
    ctx.stroke();
  }
}

async function drawQueue(name) {
  const q = await api("/api/queues/" + encodeURIComponent(name));
  $("#q-name").textContent = name;
  rates(q, Date.now());
  const figures = $("#q-figures");
  figures.replaceChildren();
  figure(figures, "available", q.available, "available");
  figure(figures, "leased", q.leased, "leased");
  figure(figures, "inactive", q.inactive, "inactive");
  figure(figures, "delayed", q.extra.delayed, "delayed");
  figure(figures, "lag (unread)", q.extra.unread, "lag");
  figure(figures, "oldest available", age(q.oldest_available_age_s), "oldest");
  figure(figures, "consumers", q.subscriptions, "consumers");
  figure(figures, "delivered", q.delivered_total, "delivered");
  figure(figures, "acked", q.acked_total, "acked");
  figure(figures, "dead-lettered", q.dead_lettered_total, "dead");
  // how messages left without an ack or a dead letter: shown where the queue's options make
  // them possible (or they happened under earlier options)
  const c = q.config;
  const conflated = q.extra.conflated_total || 0;
  const discarded = q.extra.discarded_total || 0;
  if (conflated || c.conflate_key || c.last_value)
    figure(figures, "conflated", conflated, "conflated");
  if (discarded || c.dead_letter_if) figure(figures, "discarded", discarded, "discarded");
  drawChart(state.history[name] || []);

  const subs = $("#q-subs tbody");
  subs.replaceChildren();
  for (const s of q.subscribers) {
    const row = subs.insertRow();
    cell(row, s.id);
    cell(row, s.client);
    cell(row, s.backlog, "num");
    cell(row, s.filter);
    cell(row, s.stalled ? "yes" : "no");
    cell(row, s.leases.map((l) => l.bookmark).join(", "), "value");
  }
  // in a cluster, a member lists the subscriptions it holds; the others are on their owners
  for (const member of q.subscribers_elsewhere || []) {
    const row = subs.insertRow();
    row.className = "elsewhere";
    const td = cell(row, `subscriptions on member ${member}: see its console`);
    td.colSpan = 6;
  }
  const config = $("#q-config tbody");
  config.replaceChildren();
  for (const [key, value] of Object.entries(q.config)) {
    if (value === null) continue;
    const row = config.insertRow();
    cell(row, key);
    cell(row, Array.isArray(value) ? value.join(", ") : value, "value");
  }
  if (state.browseLoaded !== name) {
    state.browseLoaded = name;
    await Promise.all([browse(name), deadLetters(name)]);
  }
}

async function browse(name) {
  const filter = $("#browse-filter").value;
  const limit = $("#browse-limit").value || "50";
  const params = new URLSearchParams({ limit });
  if (filter) params.set("filter", filter);
  const messages = await api(`/api/queues/${encodeURIComponent(name)}/browse?${params}`);
  const body = $("#q-browse tbody");
  body.replaceChildren();
  for (const m of messages) {
    const row = body.insertRow();
    cell(row, m.bookmark);
    cell(row, m.deliveries, "num");
    cell(row, new Date(m.timestamp_ms).toISOString());
    cell(row, m.value, "value");
  }
}

async function deadLetters(name) {
  const filter = $("#dl-filter").value;
  const params = new URLSearchParams({ limit: "100" });
  if (filter) params.set("filter", filter);
  const body = $("#q-dead tbody");
  body.replaceChildren();
  let letters;
  try {
    letters = await api(`/api/queues/${encodeURIComponent(name)}/dead-letters?${params}`);
  } catch (e) {
    const row = body.insertRow();
    cell(row, e.message);
    return;
  }
  for (const d of letters) {
    const row = body.insertRow();
    cell(row, d.bookmark);
    cell(row, d.reason + (d.redriven ? " (redriven)" : ""));
    cell(row, d.deliveries, "num");
    cell(row, d.cancels, "num");
    cell(row, d.original);
    cell(row, text(d.payload) + (d.detail ? `  [${d.detail}]` : ""), "value");
  }
}

function route() {
  const match = location.hash.match(/^#\/queue\/(.+)$/);
  return match ? decodeURIComponent(match[1]) : null;
}

async function poll() {
  const name = route();
  $("#overview").hidden = name !== null;
  $("#queue").hidden = name === null;
  try {
    if (name === null) await drawOverview();
    else await drawQueue(name);
    $("#status").textContent = "live · " + new Date().toLocaleTimeString();
    showError(null);
  } catch (e) {
    $("#status").textContent = "not connected";
    showError(e.message);
  }
}

async function admin(action, body) {
  const name = route();
  const result = $("#admin-result");
  try {
    const path = action === "reload" ? "/api/reload" : `/api/queues/${encodeURIComponent(name)}/${action}`;
    const answer = await api(path, { method: "POST", body: JSON.stringify(body || {}) });
    result.textContent = action + ": " + (answer.lines ? answer.lines.join("; ") : JSON.stringify(answer));
    state.browseLoaded = null;
    await poll();
  } catch (e) {
    result.textContent = action + " refused: " + e.message;
  }
}

$("#browse-form").addEventListener("submit", (e) => { e.preventDefault(); browse(route()); });
$("#dl-form").addEventListener("submit", (e) => { e.preventDefault(); deadLetters(route()); });
$("#redrive").addEventListener("click", () => {
  const filter = $("#dl-filter").value;
  admin("redrive", filter ? { filter } : {});
});
$("#ackwhere-form").addEventListener("submit", (e) => {
  e.preventDefault();
  admin("ack-where", { filter: $("#ackwhere-filter").value, expire: $("#ackwhere-expire").checked });
});
$("#reload").addEventListener("click", () => admin("reload"));
window.addEventListener("hashchange", () => { state.browseLoaded = null; poll(); });

poll();
state.timer = setInterval(poll, POLL_MS);
