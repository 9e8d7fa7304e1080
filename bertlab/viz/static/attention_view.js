// bertlab attention view: a head view (query tokens left, key tokens right, one line per
// weight) and a model view (layers x heads thumbnails). Written for bertlab; no third-party
// code, nothing fetched from the network.
//
// Model state (see bertlab/viz/attention_view.py):
//   data     bytes: uint8 weights [layer, head, query, key], row-major; zlib-deflated when
//            shorter than layer*head*query*key; weight = byte * scale / 255
//   shape    [layers, heads, queries, keys]      scale  float
//   tokens   list of strings                      sentence_b_start  int or null
//   view     "head" | "model"                     layer  int
//   heads    selected head indices                pair_filter  "all" | "a->a" | "b->b" | "a->b" | "b->a"
//   controls false: no view buttons or layer drop-down (the page around the view has them)

const SVG_NS = "http://www.w3.org/2000/svg";
const LEVELS = 100; // opacity steps for lines; lines under 1/(2*LEVELS) opacity are not drawn
const ROW_H = 20; // px per token row in the head view
const GAP = 150; // px between the two token columns
const TOP = 30; // px above the first token row (column titles)
const THUMB = 64; // px edge of a model-view thumbnail
const MAX_CHARS = 22; // longer tokens are cut with an ellipsis
const FILTERS = [
  ["all", "All"],
  ["a->a", "Sentence A \u2192 A"],
  ["b->b", "Sentence B \u2192 B"],
  ["a->b", "Sentence A \u2192 B"],
  ["b->a", "Sentence B \u2192 A"],
];

/** Colour of head `h`: hues spread by the golden angle so neighbours differ. */
function headHue(h) {
  return (h * 137.508 + 210) % 360;
}
function headColor(h) {
  return `hsl(${headHue(h).toFixed(1)}, 70%, 45%)`;
}
function headRgb(h) {
  // hsl(hue, 70%, 45%) -> [r, g, b] in 0..255
  const s = 0.7, l = 0.45, hue = headHue(h) / 60;
  const c = (1 - Math.abs(2 * l - 1)) * s;
  const x = c * (1 - Math.abs((hue % 2) - 1));
  const m = l - c / 2;
  const table = [[c, x, 0], [x, c, 0], [0, c, x], [0, x, c], [x, 0, c], [c, 0, x]];
  return table[Math.floor(hue) % 6].map((v) => Math.round((v + m) * 255));
}

function toBytes(value) {
  if (value instanceof Uint8Array) return value;
  if (value instanceof ArrayBuffer) return new Uint8Array(value);
  if (ArrayBuffer.isView(value)) return new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
  throw new Error("attention data is not binary (expected bytes from Python)");
}

async function inflate(bytes) {
  if (typeof DecompressionStream === "undefined") {
    throw new Error("this browser cannot inflate compressed data; build the view with compress=False");
  }
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

/** Decode the model's attention into {bytes, L, H, Q, K, scale}. */
async function decode(model) {
  const [L, H, Q, K] = model.get("shape");
  const n = L * H * Q * K;
  let bytes = toBytes(model.get("data"));
  if (bytes.length < n) bytes = await inflate(bytes);
  if (bytes.length !== n) {
    throw new Error(`attention data holds ${bytes.length} weights, shape [${L}, ${H}, ${Q}, ${K}] needs ${n}`);
  }
  return { bytes, L, H, Q, K, scale: model.get("scale") };
}

/** Query rows and key columns ([start, end)) that a pair filter keeps. */
function spans(filter, nQ, nK, bStart) {
  if (bStart == null || filter === "all") return { rows: [0, nQ], cols: [0, nK] };
  const a = (n) => [0, Math.min(bStart, n)];
  const b = (n) => [Math.min(bStart, n), n];
  const pick = { "a->a": [a(nQ), a(nK)], "b->b": [b(nQ), b(nK)], "a->b": [a(nQ), b(nK)], "b->a": [b(nQ), a(nK)] };
  const [rows, cols] = pick[filter] || [[0, nQ], [0, nK]];
  return { rows, cols };
}

function el(tag, props = {}, children = []) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.appendChild(c);
  return node;
}

function svgEl(tag, attrs = {}) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

function shortToken(t) {
  return t.length > MAX_CHARS ? t.slice(0, MAX_CHARS - 1) + "\u2026" : t;
}

/** Width in px a column of tokens needs (estimate; works before the node is on screen). */
function columnWidth(tokens) {
  const longest = tokens.reduce((m, t) => Math.max(m, shortToken(t).length), 1);
  return Math.min(200, Math.max(100, 8 * longest + 14));
}

function setSelect(select, options, value) {
  const key = JSON.stringify(options);
  if (select.dataset.options !== key) {
    select.replaceChildren(...options.map(([v, label]) => el("option", { value: v, text: label })));
    select.dataset.options = key;
  }
  select.value = String(value);
}

function render({ model, el: host }) {
  const root = el("div", { class: "bl-attn" });
  const headBtn = el("button", { class: "bl-tab", "data-view": "head", text: "Head view", type: "button" });
  const modelBtn = el("button", { class: "bl-tab", "data-view": "model", text: "Model view", type: "button" });
  const layerSel = el("select", { class: "bl-layer", "aria-label": "layer" });
  const layerLabel = el("label", { class: "bl-field" }, [document.createTextNode("Layer "), layerSel]);
  const filterSel = el("select", { class: "bl-filter", "aria-label": "attention between" });
  const filterLabel = el("label", { class: "bl-field" }, [document.createTextNode("Attention "), filterSel]);
  const viewTabs = el("div", { class: "bl-tabs" }, [headBtn, modelBtn]);
  const toolbar = el("div", { class: "bl-toolbar" }, [viewTabs, layerLabel, filterLabel]);
  const chips = el("div", { class: "bl-chips" });
  const body = el("div", { class: "bl-body" });
  const status = el("div", { class: "bl-status" });
  root.append(toolbar, chips, body, status);
  host.appendChild(root);

  const state = { att: null, hover: null, error: null };
  let drawPending = false;
  let loadToken = 0;

  const w = (l, h, i, j) => {
    const a = state.att;
    return (a.bytes[((l * a.H + h) * a.Q + i) * a.K + j] * a.scale) / 255;
  };

  function commit(changes) {
    for (const [k, v] of Object.entries(changes)) model.set(k, v);
    model.save_changes();
  }

  function scheduleDraw() {
    if (drawPending) return;
    drawPending = true;
    queueMicrotask(() => {
      drawPending = false;
      draw();
    });
  }

  async function reload() {
    const mine = ++loadToken;
    try {
      const att = await decode(model);
      if (mine !== loadToken) return;
      state.att = att;
      state.error = null;
    } catch (err) {
      if (mine !== loadToken) return;
      state.att = null;
      state.error = String(err.message || err);
    }
    state.hover = null;
    scheduleDraw();
  }

  function selectedHeads() {
    const H = state.att ? state.att.H : 0;
    return [...new Set(model.get("heads"))].filter((h) => h >= 0 && h < H).sort((a, b) => a - b);
  }

  function drawControls() {
    const { L, H } = state.att;
    const view = model.get("view");
    headBtn.setAttribute("aria-pressed", String(view === "head"));
    modelBtn.setAttribute("aria-pressed", String(view === "model"));
    setSelect(layerSel, Array.from({ length: L }, (_, l) => [String(l), String(l)]), model.get("layer"));
    const own = model.get("controls");  // false: the page around the view picks the view and the layer
    viewTabs.style.display = own ? "" : "none";
    layerLabel.style.display = own && view === "head" ? "" : "none";
    const hasPair = model.get("sentence_b_start") != null;
    setSelect(filterSel, FILTERS, model.get("pair_filter"));
    filterLabel.style.display = hasPair ? "" : "none";

    const chosen = new Set(selectedHeads());
    const buttons = [el("span", { class: "bl-chips-label", text: "Heads" })];
    for (let h = 0; h < H; h++) {
      const on = chosen.has(h);
      const chip = el("button", {
        class: "bl-chip" + (on ? " bl-on" : ""), type: "button", "data-head": String(h),
        "aria-pressed": String(on), title: `head ${h}: click to ${on ? "hide" : "show"}`, text: String(h),
      });
      chip.style.setProperty("--bl-head", headColor(h));
      buttons.push(chip);
    }
    buttons.push(el("button", { class: "bl-small", type: "button", "data-act": "all", text: "all" }));
    buttons.push(el("button", { class: "bl-small", type: "button", "data-act": "none", text: "none" }));
    chips.replaceChildren(...buttons);
    chips.style.display = view === "head" ? "" : "none";
  }

  function draw() {
    if (state.error) {
      body.replaceChildren(el("div", { class: "bl-error", text: state.error }));
      return;
    }
    if (!state.att) return;
    drawControls();
    if (model.get("view") === "model") drawModel();
    else drawHead();
  }

  // ---- head view -------------------------------------------------------------------
  function headGeometry() {
    const { L, Q, K } = state.att;
    const tokens = model.get("tokens");
    const sp = spans(model.get("pair_filter"), Q, K, model.get("sentence_b_start"));
    const layer = Math.min(Math.max(model.get("layer"), 0), L - 1);
    const left = tokens.slice(sp.rows[0], sp.rows[1]);
    const right = tokens.slice(sp.cols[0], sp.cols[1]);
    const leftW = columnWidth(left);
    const rightW = columnWidth(right);
    return { sp, layer, left, right, leftW, rightW, x1: leftW + 6, x2: leftW + 6 + GAP };
  }

  function drawHead() {
    const g = headGeometry();
    const rows = Math.max(g.left.length, g.right.length);
    const width = g.x2 + 6 + g.rightW;
    const height = TOP + rows * ROW_H + 6;
    const svg = svgEl("svg", { class: "bl-head", width, height, viewBox: `0 0 ${width} ${height}` });
    svg.appendChild(svgEl("text", { x: g.x1 - 6, y: 16, "text-anchor": "end", class: "bl-coltitle" })).textContent = "query (from)";
    svg.appendChild(svgEl("text", { x: g.x2 + 6, y: 16, "text-anchor": "start", class: "bl-coltitle" })).textContent = "key (to)";
    const lines = svgEl("g", { class: "bl-lines" });
    svg.appendChild(lines);
    svg.appendChild(tokenColumn("q", g.left, g.sp.rows[0], 0, g.leftW, "end", g.x1 - 6));
    svg.appendChild(tokenColumn("k", g.right, g.sp.cols[0], g.x2, g.rightW, "start", g.x2 + 6));
    svg.addEventListener("mouseleave", () => setHover(null));
    body.replaceChildren(svg);
    drawLines(svg, g);
    status.textContent = "Hover a token to see only its lines; click head chips to show or hide heads.";
  }

  function tokenColumn(side, tokens, offset, x, w, anchor, textX) {
    const col = svgEl("g", { class: `bl-col bl-col-${side}` });
    tokens.forEach((t, r) => {
      const y = TOP + r * ROW_H;
      const tok = svgEl("g", { class: "bl-token", "data-side": side, "data-index": String(offset + r) });
      tok.appendChild(svgEl("rect", { class: "bl-tok-bg", x, y, width: w, height: ROW_H - 2, rx: 3 }));
      tok.appendChild(svgEl("rect", { class: "bl-tok-weight", x, y, width: w, height: ROW_H - 2, rx: 3, opacity: 0 }));
      const text = svgEl("text", { x: textX, y: y + ROW_H / 2, "text-anchor": anchor, "dominant-baseline": "central" });
      text.textContent = shortToken(t);
      tok.appendChild(text);
      tok.appendChild(svgEl("title")).textContent = `${side === "q" ? "query" : "key"} ${offset + r}: ${t}`;
      tok.addEventListener("mouseenter", () => setHover({ side, index: offset + r }));
      col.appendChild(tok);
    });
    return col;
  }

  /** The line-opacity gain the page's theme sets (CSS variable --bl-line-gain), else 1.6. */
  function lineGain() {
    const gain = parseFloat(getComputedStyle(root).getPropertyValue("--bl-line-gain"));
    return Number.isFinite(gain) && gain > 0 ? gain : 1.6;
  }

  function setHover(hover) {
    const same = JSON.stringify(hover) === JSON.stringify(state.hover);
    if (same || model.get("view") !== "head" || !state.att) return;
    state.hover = hover;
    const svg = body.querySelector("svg.bl-head");
    if (svg) drawLines(svg, headGeometry());
  }

  function drawLines(svg, g) {
    const heads = selectedHeads();
    const hover = state.hover;
    const [r0, r1] = hover && hover.side === "q" ? [hover.index, hover.index + 1] : g.sp.rows;
    const [c0, c1] = hover && hover.side === "k" ? [hover.index, hover.index + 1] : g.sp.cols;
    const yL = (i) => TOP + (i - g.sp.rows[0]) * ROW_H + (ROW_H - 2) / 2;
    const yR = (j) => TOP + (j - g.sp.cols[0]) * ROW_H + (ROW_H - 2) / 2;
    const group = svg.querySelector(".bl-lines");
    const paths = [];
    // Opacity = gain x weight / sqrt(heads shown), at most 1. bertviz's weight / heads leaves
    // 12 overlaid heads a faint grey; the gain comes from the page's theme (bertlab.viz.theme:
    // stronger in projector mode, where a washed-out image loses light lines).
    const perHead = lineGain() / Math.sqrt(Math.max(heads.length, 1));
    for (const h of heads) {
      const buckets = new Array(LEVELS + 1).fill("");
      for (let i = r0; i < r1; i++) {
        for (let j = c0; j < c1; j++) {
          const level = Math.round(Math.min(w(g.layer, h, i, j) * perHead, 1) * LEVELS);
          if (level > 0) buckets[level] += `M${g.x1} ${yL(i)}L${g.x2} ${yR(j)}`;
        }
      }
      buckets.forEach((d, level) => {
        if (!d) return;
        paths.push(svgEl("path", {
          class: "bl-line", d, stroke: headColor(h), "stroke-opacity": (level / LEVELS).toFixed(3),
          "data-head": String(h), "data-level": String(level),
        }));
      });
    }
    group.replaceChildren(...paths);
    markWeights(svg, g, heads);
  }

  /** Shade the other column's tokens by their weight to/from the hovered token (mean over heads). */
  function markWeights(svg, g, heads) {
    const hover = state.hover;
    svg.querySelectorAll(".bl-token").forEach((node) => node.classList.remove("bl-hovered"));
    svg.querySelectorAll(".bl-tok-weight").forEach((r) => r.setAttribute("opacity", 0));
    if (!hover || heads.length === 0) return;
    const other = hover.side === "q" ? "k" : "q";
    svg.querySelector(`.bl-token[data-side="${hover.side}"][data-index="${hover.index}"]`)?.classList.add("bl-hovered");
    const fill = heads.length === 1 ? headColor(heads[0]) : "var(--bl-accent)";
    svg.querySelectorAll(`.bl-token[data-side="${other}"]`).forEach((node) => {
      const idx = Number(node.dataset.index);
      const [i, j] = hover.side === "q" ? [hover.index, idx] : [idx, hover.index];
      const mean = heads.reduce((s, h) => s + w(g.layer, h, i, j), 0) / heads.length;
      const rect = node.querySelector(".bl-tok-weight");
      rect.setAttribute("fill", fill);
      rect.setAttribute("opacity", Math.min(mean, 1).toFixed(3));
      node.querySelector("title").textContent = `${other === "q" ? "query" : "key"} ${idx}: ${model.get("tokens")[idx]}  weight ${mean.toFixed(3)}`;
    });
  }

  // ---- model view ------------------------------------------------------------------
  function drawModel() {
    const { L, H, Q, K } = state.att;
    const sp = spans(model.get("pair_filter"), Q, K, model.get("sentence_b_start"));
    const grid = el("div", { class: "bl-grid" });
    grid.style.gridTemplateColumns = `max-content repeat(${H}, ${THUMB}px)`;
    grid.appendChild(el("div", { class: "bl-corner", text: "layer \\ head" }));
    for (let h = 0; h < H; h++) grid.appendChild(el("div", { class: "bl-colhead", text: String(h) }));
    const current = new Set(selectedHeads());
    for (let l = 0; l < L; l++) {
      grid.appendChild(el("div", { class: "bl-rowhead", text: String(l) }));
      for (let h = 0; h < H; h++) {
        const canvas = thumbnail(l, h, sp);
        if (l === model.get("layer") && current.has(h)) canvas.classList.add("bl-current");
        grid.appendChild(canvas);
      }
    }
    body.replaceChildren(grid);
    status.textContent = "Each square: rows = query (from), columns = key (to), darker = more attention (square-root scale). Click one to open it in the head view.";
  }

  function thumbnail(l, h, sp) {
    const [r0, r1] = sp.rows;
    const [c0, c1] = sp.cols;
    const canvas = el("canvas", {
      class: "bl-thumb", width: String(Math.max(c1 - c0, 1)), height: String(Math.max(r1 - r0, 1)),
      "data-layer": String(l), "data-head": String(h), title: `layer ${l}, head ${h}: click to open in the head view`,
    });
    canvas.style.width = `${THUMB}px`;
    canvas.style.height = `${THUMB}px`;
    const ctx = canvas.getContext("2d");
    if (ctx && r1 > r0 && c1 > c0) {
      const img = ctx.createImageData(c1 - c0, r1 - r0);
      const [r, g, b] = headRgb(h);
      let p = 0;
      for (let i = r0; i < r1; i++) {
        for (let j = c0; j < c1; j++) {
          img.data[p] = r;
          img.data[p + 1] = g;
          img.data[p + 2] = b;
          img.data[p + 3] = Math.round(Math.sqrt(Math.min(w(l, h, i, j), 1)) * 255);
          p += 4;
        }
      }
      ctx.putImageData(img, 0, 0);
    }
    return canvas;
  }

  // ---- events ----------------------------------------------------------------------
  headBtn.addEventListener("click", () => commit({ view: "head" }));
  modelBtn.addEventListener("click", () => commit({ view: "model" }));
  layerSel.addEventListener("change", () => commit({ layer: Number(layerSel.value) }));
  filterSel.addEventListener("change", () => commit({ pair_filter: filterSel.value }));
  chips.addEventListener("click", (event) => {
    const button = event.target.closest("button");
    if (!button || !state.att) return;
    const all = Array.from({ length: state.att.H }, (_, h) => h);
    if (button.dataset.act === "all") return commit({ heads: all });
    if (button.dataset.act === "none") return commit({ heads: [] });
    const h = Number(button.dataset.head);
    const chosen = new Set(selectedHeads());
    if (chosen.has(h)) chosen.delete(h);
    else chosen.add(h);
    commit({ heads: all.filter((x) => chosen.has(x)) });
  });
  body.addEventListener("click", (event) => {
    const thumb = event.target.closest("canvas.bl-thumb");
    if (!thumb) return;
    commit({ layer: Number(thumb.dataset.layer), heads: [Number(thumb.dataset.head)], view: "head" });
  });

  let reloadPending = false;
  const onData = () => {
    // data, shape and scale change together: inflate once per batch of changes
    if (reloadPending) return;
    reloadPending = true;
    queueMicrotask(() => {
      reloadPending = false;
      reload();
    });
  };
  const onState = () => {
    state.hover = null;
    scheduleDraw();
  };
  const dataEvents = ["change:data", "change:shape", "change:scale"];
  const stateEvents = ["change:tokens", "change:sentence_b_start", "change:view", "change:layer", "change:heads", "change:pair_filter", "change:controls"];
  dataEvents.forEach((e) => model.on(e, onData));
  stateEvents.forEach((e) => model.on(e, onState));
  const ready = reload();
  const cleanup = () => {
    dataEvents.forEach((e) => model.off(e, onData));
    stateEvents.forEach((e) => model.off(e, onState));
  };
  return ready.then(() => cleanup);
}

export default { render };
