// The zdmq status page: polls GET /v1/status once a second and draws what it says.
// With client tokens configured the endpoint answers 401: the page asks for a token,
// keeps it in sessionStorage and sends it as "Authorization: Bearer".
"use strict";

const TOKEN_KEY = "zdmq-token";
const POLL_MS = 1000;
const SERIES = [
  ["push", "var(--push)"], ["pop", "var(--pop)"], ["receive", "var(--receive)"], ["ack", "var(--ack)"],
];
const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k === "style") node.style.cssText = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

const fmt = (n) => (n >= 100 || Number.isInteger(n) ? Math.round(n).toLocaleString() : n.toFixed(1));

function duration(s) {
  if (s == null) return "";
  if (s < 120) return `${Math.round(s)}s`;
  if (s < 7200) return `${Math.round(s / 60)}m`;
  return `${(s / 3600).toFixed(1)}h`;
}

// ---- nodes ------------------------------------------------------------------------------
function renderNodes(nodes) {
  const box = $("nodes");
  box.replaceChildren(...nodes.map((n) => {
    const state = !n.up ? "down" : n.status !== "ok" ? "failed" : n.leaving ? "leaving" : "up";
    const pill = !n.up ? "down" : n.status !== "ok" ? n.status : n.leaving ? "leaving" : n.status;
    const card = el("div", {class: `node ${state}`, "data-node": n.id, "data-up": String(n.up)},
      el("div", {class: "title"}, el("span", {class: "id"}, n.id),
        el("span", {class: "pill"}, pill)),
      el("div", {class: "url"}, n.url));
    if (!n.up || n.status !== "ok") card.append(el("div", {class: "facts bad"}, n.detail || ""));
    if (n.up) {
      const r = n.rate || {};
      card.append(el("div", {class: "facts"},
        `up ${duration(n.uptime_s)} · ${fmt(n.messages || 0)} messages stored`));
      card.append(el("div", {class: "facts"},
        `push ${fmt(r.push || 0)}/s · pop+receive ${fmt((r.pop || 0) + (r.receive || 0))}/s · ` +
        `ack ${fmt(r.ack || 0)}/s`));
      const groups = Object.entries(n.groups || {});
      if (groups.length) {
        const rows = groups.flatMap(([g, s]) => {
          const row = el("tr", {"data-group": g},
            el("td", {}, g), el("td", {class: `role-${s.role}`}, s.role),
            el("td", {}, s.leader || "?"), el("td", {}, s.term),
            el("td", {}, `${s.commit ?? ""}/${s.applied ?? ""}`));
          const lag = Object.entries(s.lag || {});
          if (!lag.length) return [row];
          // The leader's view of its followers: log entries each is behind.
          const high = lag.some(([, v]) => v > 1000);
          return [row, el("tr", {class: "lag", "data-lag": g},
            el("td", {}), el("td", {colspan: "4", class: high ? "lag-high" : ""},
              `follower lag: ${lag.map(([p, v]) => `${p} ${fmt(v)}`).join(", ")}`))];
        });
        card.append(el("table", {},
          el("tr", {}, ...["group", "role", "leader", "term", "commit/applied"]
            .map((h) => el("th", {}, h))),
          ...rows));
      }
    }
    return card;
  }));
}

// ---- rates chart --------------------------------------------------------------------------
function renderRates(rates) {
  const chart = $("chart");
  const W = 900, H = 220, L = 48, B = 20, T = 8;
  const n = rates.push.length;
  let max = 1;
  for (const [name] of SERIES) for (const v of rates[name]) if (v > max) max = v;
  const nice = niceMax(max);
  const x = (i) => L + ((W - L - 4) * i) / Math.max(n - 1, 1);
  const y = (v) => T + (H - T - B) * (1 - v / nice);
  const parts = [];
  for (let k = 0; k <= 4; k++) {
    const v = (nice * k) / 4;
    parts.push(svg("line", {class: "grid", x1: L, x2: W, y1: y(v), y2: y(v)}));
    const label = svg("text", {x: L - 6, y: y(v) + 4, "text-anchor": "end"});
    label.textContent = fmt(v);
    parts.push(label);
  }
  for (const [sec, text] of [[0, "-5m"], [Math.floor(n / 2), "-2.5m"], [n - 1, "now"]]) {
    const label = svg("text", {x: x(sec), y: H - 5, "text-anchor": sec === 0 ? "start" : sec === n - 1 ? "end" : "middle"});
    label.textContent = text;
    parts.push(label);
  }
  for (const [name, color] of SERIES) {
    const pts = rates[name].map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    parts.push(svg("polyline", {points: pts, stroke: color, "data-series": name}));
  }
  chart.replaceChildren(...parts);
  $("legend").replaceChildren(...SERIES.map(([name, color]) =>
    el("span", {"data-rate": name}, el("span", {class: "swatch", style: `background:${color}`}),
      `${name} ${fmt(rates.current[name])}/s`)));
}

function niceMax(v) {
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

// ---- queues -------------------------------------------------------------------------------
function renderQueues(status) {
  const ids = status.nodes.map((n) => n.id);
  let max = 1;
  for (const q of status.queues) for (const d of Object.values(q.depth)) if (d > max) max = d;
  $("queues").tBodies[0].replaceChildren(...status.queues.map((q) =>
    el("tr", {"data-queue": q.queue},
      el("td", {class: "name"}, q.queue),
      el("td", {class: "num", "data-field": "messages"}, fmt(q.messages)),
      el("td", {class: "num"}, fmt(q.in_flight)),
      el("td", {class: "num"}, fmt(q.delayed)),
      el("td", {}, el("div", {class: "bars"}, ...ids.map((id) => {
        const d = q.depth[id] || 0;
        return el("div", {class: "bar", "data-node": id},
          el("span", {class: "label"}, id),
          el("span", {class: "track"}, el("div", {class: "fill", style: `width:${(100 * d) / max}%`})),
          el("span", {class: "value"}, fmt(d)));
      }))))));
  const more = status.queues_more ? `, ${status.queues_more} more not shown` : "";
  $("queue-count").textContent = `(${status.queues_seen} with messages${more})`;
}

// ---- moves --------------------------------------------------------------------------------
// The rebalancer's progress (GET /v1/cluster/moves, as `zdmq cluster moves` shows it): the
// moves done against those plus the steps still planned, the move under way, the time left
// at the mean time of the last moves done. Shown only while there is work.
function renderMoves(moves) {
  const box = $("moves");
  const active = moves && (moves.current || moves.pending_steps > 0 || (moves.leaving || []).length);
  box.hidden = !active;
  if (!active) return;
  const done = moves.moves_done || 0, pending = moves.pending_steps || 0, total = done + pending;
  const took = (moves.done || []).filter((p) => p.done).map((p) => p.elapsed_s);
  const mean = took.length ? took.reduce((a, b) => a + b, 0) / took.length : null;
  const cur = moves.current;
  let left = "";
  if (pending) {
    left = mean == null ? " · time left: estimating"
      : ` · about ${duration(Math.max(pending * mean - (cur ? cur.elapsed_s : 0), 0))} left`;
  }
  $("moves-summary").textContent = `(${done} of ${total} steps done${left})`;
  $("moves-fill").style.width = `${total ? (100 * done) / total : 100}%`;
  box.dataset.done = String(done);
  box.dataset.total = String(total);
  let text = "";
  if (cur) {
    text = `now: group ${cur.group}: ${cur.remove || "(none)"} → ${cur.add || "(none)"}, ${cur.step}`;
    if (cur.commit_index) {
      text += `, ${fmt(cur.matched)} of ${fmt(cur.commit_index)} entries (${fmt(cur.entries_per_s)}/s)`;
    }
    if (cur.snapshot_size) {
      const mib = (b) => (b / 1048576).toFixed(1);
      text += `, ${mib(cur.bytes)} of ${mib(cur.snapshot_size)} MiB (${mib(cur.bytes_per_s)} MiB/s)`;
    }
    if (cur.messages) {
      text += `, ${fmt(cur.messages)} messages`;
    }
    text += `, ${duration(cur.elapsed_s)}`;
  }
  $("moves-current").textContent = text;
  $("moves-leaving").textContent = (moves.leaving || []).length ? `leaving: ${moves.leaving.join(", ")}` : "";
  $("moves-error").textContent = moves.last_error ? `last error: ${moves.last_error}` : "";
}

// ---- polling ------------------------------------------------------------------------------
function render(status) {
  const up = status.nodes.filter((n) => n.up).length;
  const epoch = status.epoch != null ? ` · map epoch ${status.epoch}` : "";
  $("summary").textContent = `${up} of ${status.nodes.length} nodes up · replication ${status.replication}` +
    `${epoch} · served by ${status.node}`;
  $("updated").textContent = `updated ${new Date(status.time * 1000).toLocaleTimeString()}`;
  renderMoves(status.moves);
  renderNodes(status.nodes);
  renderRates(status.rates);
  renderQueues(status);
}

function showLogin(message) {
  $("main").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("summary").textContent = "sign in";
}

async function poll() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = token ? {Authorization: `Bearer ${token}`} : {};
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), 3000);
  try {
    const reply = await fetch("/v1/status", {headers, signal: abort.signal, cache: "no-store"});
    if (reply.status === 401 || reply.status === 403) {
      if (token) sessionStorage.removeItem(TOKEN_KEY);
      showLogin(token ? "that token was refused" : "");
      return;
    }
    const body = await reply.json();
    if (!reply.ok) throw new Error(body.error ? `${body.error.code}: ${body.error.message}` : reply.statusText);
    $("problem").hidden = true;
    $("login").hidden = true;
    $("main").hidden = false;
    render(body);
  } catch (e) {
    $("problem").hidden = false;
    $("problem").textContent = `cannot reach this node's status: ${e.message || e}`;
  } finally {
    clearTimeout(timer);
  }
}

$("login").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
  $("token").value = "";
  poll();
});

async function loop() {
  for (;;) {
    const started = Date.now();
    if ($("login").hidden || sessionStorage.getItem(TOKEN_KEY)) await poll();
    await new Promise((r) => setTimeout(r, Math.max(POLL_MS - (Date.now() - started), 100)));
  }
}
loop();
