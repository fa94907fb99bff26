// The attnkit attention viewer: reads the JSON payload, draws tokens, heads and heatmaps.
// User text is only ever set with textContent.
"use strict";
const DATA = JSON.parse(document.getElementById("attnkit-data").textContent);
const $ = (id) => document.getElementById(id);
function bytes(b64) { const s = atob(b64); const out = new Uint8Array(s.length); for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i); return out; }
const VIEWS = DATA.views.map((v) => Object.assign({}, v, {
  indexArr: new Uint16Array(bytes(v.index).buffer), weightArr: bytes(v.weight), thumbArr: bytes(v.thumb),
}));
const state = { view: 0, layer: 0, head: 0, focus: null, pinned: null };
let spans = { q: [], k: [] };

function option(select, value, text) { const o = document.createElement("option"); o.value = value; o.textContent = text; select.appendChild(o); }
function current() { return VIEWS[state.view]; }
function rowEntries(v, layer, head, i) {  // [[key index, weight], ...] largest first
  const base = ((layer * v.heads + head) * v.L + i) * v.k, out = [];
  for (let r = 0; r < v.k; r++) { const w = v.weightArr[base + r] / 255; if (w > 0) out.push([v.indexArr[base + r], w]); }
  return out;
}
function columnEntries(v, layer, head, j) {  // [[query index, weight], ...] largest first
  const out = [], start = (layer * v.heads + head) * v.L * v.k;
  for (let i = 0; i < v.L; i++) {
    const base = start + i * v.k;
    for (let r = 0; r < v.k; r++) if (v.indexArr[base + r] === j) { const w = v.weightArr[base + r] / 255; if (w > 0) out.push([i, w]); break; }
  }
  return out.sort((a, b) => b[1] - a[1]);
}

function buildControls() {
  $("title").textContent = DATA.title;
  VIEWS.forEach((v, i) => option($("view"), i, v.name));
  $("view").onchange = () => { state.view = +$("view").value; state.layer = state.head = 0; state.focus = state.pinned = null; render(true); };
  $("layer").onchange = () => { state.layer = +$("layer").value; render(false); };
  $("head").onchange = () => { state.head = +$("head").value; render(false); };
  $("direction").onchange = () => paint();
}

function tokenBlock(title, tokens, role) {
  const section = document.createElement("div");
  const h = document.createElement("h2"); h.textContent = title; section.appendChild(h);
  const box = document.createElement("div"); box.className = "tokens"; box.dataset.role = role;
  const list = tokens.map((t, i) => {
    const s = document.createElement("span"); s.className = "tok"; s.textContent = t; s.title = t; s.dir = "auto"; s.dataset.index = i; s.dataset.role = role;
    s.addEventListener("mouseenter", () => { state.focus = [role, i]; paint(); });
    s.addEventListener("mouseleave", () => { state.focus = null; paint(); });
    s.addEventListener("click", () => { const p = state.pinned; state.pinned = p && p[0] === role && p[1] === i ? null : [role, i]; paint(); });
    box.appendChild(s); box.appendChild(document.createTextNode(" "));
    return s;
  });
  section.appendChild(box);
  return [section, list];
}

function buildBlocks() {
  const v = current(), blocks = $("blocks");
  blocks.replaceChildren();
  if (v.self) {
    const [section, list] = tokenBlock("tokens", v.queries, "both"); blocks.appendChild(section); spans = { q: list, k: list };
  } else {
    const [ks, kl] = tokenBlock("keys (source)", v.keys, "k"), [qs, ql] = tokenBlock("queries (target)", v.queries, "q");
    blocks.appendChild(ks); blocks.appendChild(qs); spans = { q: ql, k: kl };
  }
  $("direction-box").style.display = v.self ? "" : "none";
}

function paint() {
  const v = current(), active = state.focus || state.pinned;
  for (const list of [spans.q, spans.k]) for (const s of list) { s.style.background = ""; s.classList.remove("hl", "top", "focus", "pinned"); s.removeAttribute("data-weight"); }
  if (state.pinned) { const [role, i] = state.pinned; (role === "k" ? spans.k : spans.q)[i].classList.add("pinned"); }
  if (!active) { showDetails(null); return; }
  const [role, i] = active;
  const asQuery = role === "q" || (role === "both" && $("direction").value === "to");
  const entries = asQuery ? rowEntries(v, state.layer, state.head, i) : columnEntries(v, state.layer, state.head, i);
  const targets = asQuery ? spans.k : spans.q, colour = asQuery ? "33, 102, 204" : "230, 120, 20";
  (role === "k" ? spans.k : spans.q)[i].classList.add("focus");
  entries.forEach(([j, w], r) => {
    const s = targets[j];
    s.style.background = `rgba(${colour}, ${Math.min(1, 0.12 + 0.88 * Math.sqrt(w)).toFixed(3)})`;
    s.dataset.weight = w.toFixed(3);
    if (w >= 0.1) s.classList.add("hl");
    if (r === 0) s.classList.add("top");
  });
  showDetails(active);
}

function table(title, entries, tokens) {
  const wrap = document.createElement("div");
  const h = document.createElement("h2"); h.textContent = title; wrap.appendChild(h);
  const t = document.createElement("table");
  for (const [j, w] of entries.slice(0, 8)) {
    const tr = t.insertRow(); tr.insertCell().textContent = tokens[j]; tr.insertCell().textContent = w.toFixed(3);
  }
  if (!entries.length) { const tr = t.insertRow(); tr.insertCell().textContent = "(nothing in the kept top entries)"; }
  wrap.appendChild(t); return wrap;
}

function showDetails(active) {
  const v = current(), box = $("details");
  box.replaceChildren();
  if (!active) { const h = document.createElement("h2"); h.textContent = "token"; box.appendChild(h);
    const d = document.createElement("div"); d.className = "muted"; d.textContent = "hover a token (click to pin it)"; box.appendChild(d); return; }
  const [role, i] = active;
  const h = document.createElement("h2"); h.textContent = `layer ${state.layer}, head ${state.head}: token ${i} `;
  const name = document.createElement("code"); name.textContent = (role === "k" ? v.keys : v.queries)[i]; h.appendChild(name); box.appendChild(h);
  if (role !== "k") box.appendChild(table("attends to", rowEntries(v, state.layer, state.head, i), v.keys));
  if (role !== "q") box.appendChild(table("attended by", columnEntries(v, state.layer, state.head, i), v.queries));
}

function drawHeatmap() {
  const v = current(), canvas = $("heatmap");
  canvas.width = v.S; canvas.height = v.L;
  const ctx = canvas.getContext("2d"), image = ctx.createImageData(v.S, v.L), px = image.data;
  for (let p = 0; p < px.length; p += 4) { px[p] = px[p + 1] = px[p + 2] = 255; px[p + 3] = 255; }
  const start = (state.layer * v.heads + state.head) * v.L * v.k;
  let peak = 1;  // shade relative to the head's largest kept weight, so diffuse heads still show
  for (let e = start; e < start + v.L * v.k; e++) peak = Math.max(peak, v.weightArr[e]);
  for (let i = 0; i < v.L; i++) for (let r = 0; r < v.k; r++) {
    const w = v.weightArr[start + i * v.k + r]; if (!w) continue;
    const p = 4 * (i * v.S + v.indexArr[start + i * v.k + r]), level = Math.round(255 * w / peak);
    px[p] = px[p + 1] = 255 - level; px[p + 2] = 255 - Math.round(level * 0.3);
  }
  ctx.putImageData(image, 0, 0);
  $("heatmap-title").textContent = `${v.name}: layer ${state.layer}, head ${state.head}`;
  const c = v.coverage[state.layer * v.heads + state.head];
  $("coverage").textContent = `${v.L} x ${v.S} tokens; top ${v.k} entries per row kept, ${(100 * c).toFixed(1)}% of this head's weight`;
}

function buildOverview() {
  const v = current(), box = $("overview");
  box.replaceChildren();
  box.style.gridTemplateColumns = `40px repeat(${v.heads}, 1fr)`;
  box.appendChild(document.createElement("div"));
  for (let h = 0; h < v.heads; h++) { const d = document.createElement("div"); d.className = "label"; d.textContent = `h${h}`; box.appendChild(d); }
  const cells = v.tq * v.tk;
  for (let l = 0; l < v.layers; l++) {
    const d = document.createElement("div"); d.className = "label"; d.textContent = `L${l}`; box.appendChild(d);
    for (let h = 0; h < v.heads; h++) {
      const canvas = document.createElement("canvas"); canvas.width = v.tk; canvas.height = v.tq;
      canvas.dataset.layer = l; canvas.dataset.head = h; canvas.title = `layer ${l}, head ${h}`;
      const ctx = canvas.getContext("2d"), image = ctx.createImageData(v.tk, v.tq), px = image.data, base = (l * v.heads + h) * cells;
      for (let c = 0; c < cells; c++) { const w = v.thumbArr[base + c]; px[4 * c] = px[4 * c + 1] = 255 - w; px[4 * c + 2] = 255 - Math.round(w * 0.3); px[4 * c + 3] = 255; }
      ctx.putImageData(image, 0, 0);
      canvas.addEventListener("click", () => { state.layer = l; state.head = h; render(false); });
      box.appendChild(canvas);
    }
  }
}

function render(rebuild) {
  const v = current();
  if (rebuild) {
    $("view").value = state.view;
    for (const [id, n] of [["layer", v.layers], ["head", v.heads]]) { $(id).replaceChildren(); for (let i = 0; i < n; i++) option($(id), i, i); }
    buildBlocks(); buildOverview();
  }
  $("layer").value = state.layer; $("head").value = state.head;
  for (const c of $("overview").querySelectorAll("canvas")) c.classList.toggle("selected", +c.dataset.layer === state.layer && +c.dataset.head === state.head);
  drawHeatmap(); paint();
  document.body.dataset.ready = "1";
}

buildControls();
render(true);
