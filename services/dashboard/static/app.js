// Tessera's dashboard: draws /api/ledger and /api/queues every 2 s and follows
// /api/events (services/dashboard/service.py; the shapes are shared/views.py and
// shared/events.py). Every text reaches the page through el() below, as text nodes and
// attribute values: pod names, messages and reasons are user input, never parsed as HTML.
// Views omit fields at their default (msgspec omit_defaults): read them with `|| 0`.
"use strict";

const REFRESH_MS = 2000;
const EVENTS_SHOWN = 200;
const NO_LIMIT = 2 ** 20; // a sharing count this large means "no limit" (vNPU templates)

// --- drawing helpers -------------------------------------------------------------------

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "width") node.style.width = value;
    else if (key === "left") node.style.left = value;
    else if (key === "color") node.style.setProperty("--c", value);
    else node.setAttribute(key, String(value)); // title, data-*: never an event handler
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function num(n) {
  return n.toLocaleString("en-US", { maximumFractionDigits: 1 });
}

function mib(n) {
  return `${num(n || 0)} MiB`;
}

function pct(part, whole) {
  return whole ? `${Math.round((100 * (part || 0)) / whole)}%` : "–";
}

function share(part, whole) {
  if (!whole) return "0%";
  return `${Math.max(0, Math.min(100, (100 * (part || 0)) / whole))}%`;
}

function duration(s) {
  s = Math.max(0, Math.round(s || 0));
  const two = (n) => String(n).padStart(2, "0");
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${two(s % 60)}s`;
  return `${Math.floor(s / 3600)}h ${two(Math.floor((s % 3600) / 60))}m`;
}

function clock(ts) {
  return ts ? new Date(ts * 1000).toLocaleTimeString("en-GB", { hour12: false }) : "";
}

function hue(text) {
  let h = 0;
  for (const ch of text) h = (h * 31 + ch.codePointAt(0)) % 360;
  return `hsl(${h} 60% 52%)`;
}

function podName(ref) {
  return ref ? `${ref.namespace}/${ref.name}` : "?";
}

function replace(id, ...children) {
  document.getElementById(id).replaceChildren(...children.flat(Infinity).filter(Boolean));
}

function showError(id, why) {
  const box = document.getElementById(id);
  box.hidden = !why;
  box.textContent = why || "";
}

function meter(name, barNode, value) {
  return el(
    "div",
    { class: "meter" },
    el("span", { class: "meter-name" }, name),
    barNode,
    el("span", { class: "meter-value", title: value }, value),
  );
}

// --- the ledger: nodes, devices, grants --------------------------------------------------

function grantName(g) {
  return `${g.namespace}/${g.pod} ${g.container}`;
}

function grantKind(g) {
  return g.mig_profile || g.vnpu_template || (g.exclusive ? "exclusive" : "");
}

function state(g) {
  return g.bound ? "bound" : "reserved";
}

// One bar of a device: a segment per grant (its share of the device), the rest free.
function bar(name, used, total, grants, amount, describe, unit) {
  const segments = [];
  let drawn = 0;
  for (const g of grants) {
    const value = amount(g);
    if (!value) continue;
    drawn += value;
    const label = `${grantName(g)} · ${describe(value)}`;
    const props = {
      class: `seg ${state(g)}`,
      width: share(value, total),
      color: hue(g.uid || grantName(g)),
      title: `${label}${g.bound ? "" : " (reserved)"}`,
      "data-pod": `${g.namespace}/${g.pod}`,
    };
    segments.push(el("div", props, el("span", {}, label)));
  }
  if ((used || 0) > drawn) {
    const title = "held, not by a grant shown";
    segments.push(el("div", { class: "seg other", width: share(used - drawn, total), title }));
  }
  const value = `${num(used || 0)} / ${unit(total || 0)} · ${pct(used, total)}`;
  return meter(name, el("div", { class: "bar" }, segments), value);
}

function grantLine(g, d) {
  const details = [
    ` ${mib(g.memory_mib)} (${pct(g.memory_mib, d.memory_mib)})`,
    g.cores ? ` · ${g.cores} cores` : "",
    grantKind(g) ? ` · ${grantKind(g)}` : "",
    g.group ? ` · group ${g.group}` : "",
  ];
  return el(
    "li",
    { class: `grant ${state(g)}`, "data-pod": `${g.namespace}/${g.pod}` },
    el("span", { class: "swatch", color: hue(g.uid || grantName(g)) }),
    el("span", { class: "grant-name" }, grantName(g)),
    el("span", { class: "dim" }, details),
    el("span", { class: `state ${state(g)}` }, state(g)),
  );
}

function device(d) {
  const grants = d.grants || [];
  const memory = (g) => g.memory_mib || 0;
  const cores = (g) => g.cores || 0;
  const slots =
    (d.slots || 0) >= NO_LIMIT
      ? meter("slots", el("div", { class: "bar" }), `${num(d.used_slots || 0)} / no limit`)
      : bar("slots", d.used_slots, d.slots, grants, () => 1, () => "1 slot", num);
  return el(
    "div",
    { class: "device", "data-uuid": d.uuid },
    el(
      "div",
      { class: "device-head", title: d.uuid },
      el("strong", {}, `#${d.index || 0} ${d.model}`),
      el("span", { class: "dim" }, ` ${d.vendor} · ${d.mode}`),
      d.healthy === false && el("span", { class: "badge bad" }, "unhealthy"),
      d.cordoned && el("span", { class: "badge warn" }, "cordoned"),
      d.mps && el("span", { class: "badge" }, `mps ${d.mps}`),
    ),
    bar("memory", d.used_memory_mib, d.memory_mib, grants, memory,
      (v) => `${mib(v)} · ${pct(v, d.memory_mib)}`, mib),
    bar("cores", d.used_cores, d.cores, grants, cores,
      (v) => `${v} cores · ${pct(v, d.cores)}`, num),
    slots,
    grants.length > 0 && el("ul", { class: "grants" }, grants.map((g) => grantLine(g, d))),
  );
}

function node(n) {
  const devices = [...(n.devices || [])].sort((a, b) => (a.index || 0) - (b.index || 0));
  const used = devices.reduce((s, d) => s + (d.used_memory_mib || 0), 0);
  const total = devices.reduce((s, d) => s + (d.memory_mib || 0), 0);
  const summary = ` ${devices.length} devices · ${mib(used)} of ${mib(total)}`;
  return el(
    "article",
    { class: "node", "data-node": n.name },
    el(
      "h3",
      {},
      n.name,
      n.unschedulable && el("span", { class: "badge warn" }, "unschedulable"),
      n.refused && el("span", { class: "badge bad", title: n.refused }, "refused"),
      el("small", {}, summary, ` · ${n.pods || 0} pods`),
    ),
    n.refused && el("p", { class: "error" }, n.refused),
    devices.map(device),
  );
}

function drawLedger(view) {
  const nodes = [...(view.nodes || [])].sort((a, b) => a.name.localeCompare(b.name));
  const grants = nodes.flatMap((n) => (n.devices || []).flatMap((d) => d.grants || []));
  const reserved = grants.filter((g) => !g.bound).length;
  const by = view.instance ? ` · ${view.instance}` : "";
  const counts = `${nodes.length} nodes · ${grants.length} grants (${reserved} reserved)`;
  replace("nodes-summary", `${counts}${by}`);
  replace("nodes", nodes.length ? nodes.map(node) : el("p", { class: "dim" }, "no nodes yet"));
}

// --- queues and waiting gangs -------------------------------------------------------------

// How a queue's amounts of one dimension are written: the number, and the unit once.
function amounts(key, scale) {
  if (!key.endsWith(".memory")) return [(n) => num(n || 0), ""];
  if (scale < 10240) return [(n) => num(n || 0), " MiB"];
  return [(n) => num((n || 0) / 1024), " GiB"];
}

function dimension(key, q) {
  const deserved = (q.deserved || {})[key] || 0;
  const allocated = (q.allocated || {})[key] || 0;
  const request = (q.request || {})[key] || 0;
  const cap = q.capability ? q.capability[key] : undefined;
  const scale = Math.max(deserved, allocated, request, cap || 0, 1e-9);
  const [amount, unit] = amounts(key, scale);
  const over = allocated > deserved + 1e-6;
  const title = [
    `allocated ${amount(allocated)}${unit}`,
    `deserved ${amount(deserved)}${unit}`,
    `request ${amount(request)}${unit}`,
    cap !== undefined && `capability ${amount(cap)}${unit}`,
  ];
  const barNode = el(
    "div",
    { class: "bar queue-bar", title: title.filter(Boolean).join(", ") },
    el("div", { class: "request", width: share(request, scale) }),
    el("div", { class: `allocated${over ? " over" : ""}`, width: share(allocated, scale) }),
    el("div", { class: "deserved", left: share(deserved, scale) }),
  );
  const wants = request > allocated ? ` · wants ${amount(request)}${unit}` : "";
  return meter(key, barNode, `${amount(allocated)} / ${amount(deserved)}${unit}${wants}`);
}

// Its past use, decayed, as a part of the cluster (shared/views.py QueueView.usage).
function pastUse(usage) {
  const values = Object.values(usage || {});
  return values.length ? ` · past use ${(100 * Math.max(...values)).toFixed(1)}%` : "";
}

function queue(q) {
  const vectors = [q.deserved, q.allocated, q.request].map((v) => Object.keys(v || {}));
  const keys = [...new Set(vectors.flat())].sort();
  const groups = Object.entries(q.podgroups || {}).map(([phase, n]) => ` · ${n} ${phase}`);
  return el(
    "article",
    { class: "queue", "data-queue": q.name },
    el(
      "h3",
      {},
      q.name,
      (q.state || "Open") !== "Open" && el("span", { class: "badge warn" }, q.state),
      el("small", {}, ` weight ${num(q.weight ?? 1)}`,
        q.priority ? ` · priority ${q.priority}` : "", pastUse(q.usage), groups),
    ),
    keys.length ? keys.map((k) => dimension(k, q)) : el("p", { class: "dim" }, "nothing asked"),
  );
}

function gangRow(g) {
  const pods = Object.entries(g.pods || {}).map(([s, n]) => `${n} ${s}`).join(", ");
  return el(
    "tr",
    { class: g.unresolvable ? "unresolvable" : "", "data-gang": `${g.namespace}/${g.name}` },
    el("td", { class: "gang" }, `${g.namespace}/${g.name}`,
      g.lone && el("span", { class: "dim" }, " (pod)")),
    el("td", {}, g.queue || "default"),
    el("td", { class: "pods" }, pods, dim(`/ min ${g.min_member || 1}`)),
    el("td", { class: "num" }, duration(g.waiting_s)),
    el("td", { class: "why" },
      g.unresolvable && el("span", { class: "badge bad" }, "unresolvable"), g.why || ""),
  );
}

function gangs(list) {
  if (!list.length) return el("p", { class: "dim" }, "none waiting");
  const rows = [...list].sort((a, b) => (b.waiting_s || 0) - (a.waiting_s || 0)).map(gangRow);
  const head = ["gang", "queue", "pods", "waiting", "why"].map((h) => el("th", {}, h));
  const table = [el("thead", {}, el("tr", {}, head)), el("tbody", {}, rows)];
  return el("table", { class: "gangs" }, table);
}

function drawQueues(view) {
  const queues = [...(view.queues || [])].sort((a, b) => a.name.localeCompare(b.name));
  replace("queues", queues.length ? queues.map(queue) : el("p", { class: "dim" }, "no queues"));
  replace("gangs-summary", `${(view.gangs || []).length}`);
  replace("gangs", gangs(view.gangs || []));
}

// --- refreshing the views ---------------------------------------------------------------

const drawn = {};

async function refresh(path, draw, errorId, panelId) {
  const panel = document.getElementById(panelId);
  let answer;
  try {
    const response = await fetch(path, { cache: "no-store" });
    answer = await response.json();
    if (!response.ok) throw new Error(answer.error || `${path}: HTTP ${response.status}`);
  } catch (err) {
    showError(errorId, err.message || String(err));
    panel.classList.add("stale");
    return false;
  }
  showError(errorId, "");
  panel.classList.remove("stale");
  const key = JSON.stringify({ ...answer, taken_at: 0 });
  if (drawn[path] !== key) {
    drawn[path] = key; // an unchanged view is not drawn again (a hovered tooltip stays)
    draw(answer);
  }
  return true;
}

async function tick() {
  const results = await Promise.all([
    refresh("/api/ledger", drawLedger, "nodes-error", "nodes-panel"),
    refresh("/api/queues", drawQueues, "queues-error", "queues-panel"),
  ]);
  const ok = results.every(Boolean);
  const status = document.getElementById("status");
  status.textContent = `${ok ? "up to date" : "partly unavailable"} · ${clock(Date.now() / 1000)}`;
  status.className = `status ${ok ? "ok" : "warn"}`;
  setTimeout(tick, REFRESH_MS);
}

// --- the live event tail ------------------------------------------------------------------

function grantsText(grants) {
  const one = (c, d) => {
    const slice = `${mib(d.memory_mib)}${d.cores ? ` ${d.cores}%` : ""}`;
    const what = d.mig_profile || d.vnpu_template || (d.exclusive ? "whole" : slice);
    return `${c.container}: #${d.index || 0} ${what}`;
  };
  return (grants || []).flatMap((c) => (c.devices || []).map((d) => one(c, d))).join(", ");
}

function dim(text) {
  return el("span", { class: "dim" }, ` ${text || ""}`);
}

function describe(e) {
  switch (e.type) {
    case "allocation.decided":
    case "allocation.bound":
      return [podName(e.pod), ` → ${e.node}`, dim(grantsText(e.grants))];
    case "allocation.failed":
      return [(e.pods || []).map(podName).join(", "), dim(e.message)];
    case "allocation.bind-failed":
      return [podName(e.pod), ` on ${e.node}`, dim(e.error)];
    case "allocation.released":
      return [podName(e.pod), ` from ${e.node}`, dim(e.reason)];
    case "allocation.admitted":
      return [podName(e.pod), ` on ${e.node}`];
    case "allocation.preempting": {
      const victims = (e.victims || []).flatMap((v) => v.pods || []).map(podName);
      const where = ` on ${(e.nodes || []).join(", ")}`;
      return [podName(e.gang), where, dim(`evicting ${victims.join(", ")}`)];
    }
    default:
      return [dim(JSON.stringify(e))];
  }
}

const seen = new Set();

function onEvent(message) {
  let e;
  try {
    e = JSON.parse(message.data);
  } catch {
    return;
  }
  if (e.event_id) {
    if (seen.has(e.event_id)) return; // sent again after a reconnection
    if (seen.size > 10 * EVENTS_SHOWN) seen.clear(); // a replay repeats only the last few
    seen.add(e.event_id);
  }
  const kind = String(e.type || "?").replace(/^allocation\./, "");
  const list = document.getElementById("events");
  list.prepend(
    el(
      "li",
      { class: `event ${kind}`, "data-type": e.type || "" },
      el("time", {}, clock(e.emitted_at)),
      el("span", { class: "kind" }, kind),
      el("span", { class: "what" }, describe(e)),
    ),
  );
  while (list.children.length > EVENTS_SHOWN) list.lastElementChild.remove();
}

function follow() {
  const status = document.getElementById("events-status");
  const source = new EventSource("/api/events");
  source.onopen = () => {
    status.textContent = "live";
    status.className = "ok";
  };
  source.onerror = () => {
    status.textContent = "reconnecting…";
    status.className = "warn";
  };
  source.onmessage = onEvent;
}

follow();
tick();
