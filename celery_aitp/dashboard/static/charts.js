/* celery_aitp dashboard charts: small, dependency-free SVG drawing (no CDN, works offline).
 * Every chart replaces the content of its container and never uses innerHTML with data,
 * so labels from the store cannot inject markup. */
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var PALETTE = ["#2f6fb2", "#2e9e6e", "#d08b16", "#8a5cc2", "#c8453b", "#3aa5b5", "#7a8699"];

  function el(name, attrs, text) {
    var node = document.createElementNS(NS, name);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function svg(container, width, height, kind, count) {
    while (container.firstChild) container.removeChild(container.firstChild);
    var root = el("svg", { viewBox: "0 0 " + width + " " + height, role: "img",
      "data-chart": kind, "data-points": String(count) });
    container.appendChild(root);
    return root;
  }

  function widthOf(container) {
    return Math.max(320, Math.min(1400, Math.round(container.clientWidth || 640)));
  }

  function empty(container, message) {
    while (container.firstChild) container.removeChild(container.firstChild);
    var div = document.createElement("div");
    div.className = "empty";
    div.textContent = message || "no data yet";
    container.appendChild(div);
  }

  function fmt(v, digits) {
    if (v === null || v === undefined || isNaN(v)) return "–";
    var a = Math.abs(v);
    if (a !== 0 && a < 0.001) return v.toExponential(1);
    if (a >= 1000) return Math.round(v).toLocaleString("en");
    return Number(v.toPrecision(digits || 3)).toString();
  }

  function title(node, text) { node.appendChild(el("title", {}, text)); return node; }

  /* Horizontal bars: rows = [{label, value, color, title, marker}] (marker: a target line). */
  function hbars(container, rows, opts) {
    opts = opts || {};
    if (!rows.length) { empty(container, opts.empty); return; }
    var width = widthOf(container), row = 22, left = opts.labelWidth || 170, right = 70;
    var height = rows.length * row + 8;
    var max = opts.max || Math.max.apply(null, rows.map(function (r) {
      return Math.max(r.value || 0, r.marker || 0); })) || 1;
    var root = svg(container, width, height, "hbars", rows.length);
    var span = width - left - right;
    rows.forEach(function (r, i) {
      var y = 4 + i * row, w = Math.max(0, (r.value || 0) / max * span);
      root.appendChild(el("text", { x: left - 6, y: y + 14, "text-anchor": "end" }, r.label));
      root.appendChild(el("rect", { x: left, y: y + 3, width: span, height: row - 8, fill: "#f0f2f5", rx: 3 }));
      title(root.appendChild(el("rect", { x: left, y: y + 3, width: w, height: row - 8, rx: 3,
        fill: r.color || PALETTE[0], "data-label": r.label, "data-value": String(r.value) })),
        r.title || (r.label + ": " + fmt(r.value)));
      if (r.marker !== undefined && r.marker !== null) {
        var mx = left + r.marker / max * span;
        root.appendChild(el("line", { x1: mx, x2: mx, y1: y + 1, y2: y + row - 3, stroke: "#1d2430", "stroke-width": 2 }));
      }
      root.appendChild(el("text", { x: left + span + 6, y: y + 14 }, (opts.format || fmt)(r.value)));
    });
  }

  /* Grouped vertical bars: groups = labels; series = [{name, color, values}]. */
  function groupedBars(container, groups, series, opts) {
    opts = opts || {};
    if (!groups.length) { empty(container, opts.empty); return; }
    var width = widthOf(container), height = 240, left = 48, bottom = 40, top = 22;
    var values = [];
    series.forEach(function (s) { s.values.forEach(function (v) { if (v !== null) values.push(v); }); });
    var max = opts.max || Math.max.apply(null, values.concat([0])) || 1;
    var root = svg(container, width, height, "grouped", groups.length * series.length);
    var plotH = height - bottom - top, slot = (width - left - 10) / groups.length;
    var bar = Math.min(28, (slot - 10) / series.length);
    [0, 0.5, 1].forEach(function (f) {
      var y = top + plotH * (1 - f);
      root.appendChild(el("line", { x1: left, x2: width - 10, y1: y, y2: y, "class": "grid" }));
      root.appendChild(el("text", { x: left - 6, y: y + 4, "text-anchor": "end" }, (opts.format || fmt)(max * f)));
    });
    groups.forEach(function (g, gi) {
      var x0 = left + gi * slot + (slot - bar * series.length) / 2;
      series.forEach(function (s, si) {
        var v = s.values[gi];
        if (v === null || v === undefined) return;
        var h = v / max * plotH;
        title(root.appendChild(el("rect", { x: x0 + si * bar, y: top + plotH - h, width: bar - 2,
          height: Math.max(h, 0.5), fill: s.color || PALETTE[si % PALETTE.length], rx: 2,
          "data-group": g, "data-series": s.name, "data-value": String(v) })),
          g + " · " + s.name + ": " + (opts.format || fmt)(v));
      });
      root.appendChild(el("text", { x: left + gi * slot + slot / 2, y: height - bottom + 16,
        "text-anchor": "middle" }, g));
    });
    series.forEach(function (s, si) {
      var x = left + si * 130;
      root.appendChild(el("rect", { x: x, y: 4, width: 10, height: 10, fill: s.color || PALETTE[si % PALETTE.length] }));
      root.appendChild(el("text", { x: x + 14, y: 13 }, s.name));
    });
  }

  /* Line chart of [{t (epoch s), v}]. */
  function line(container, points, opts) {
    opts = opts || {};
    if (points.length < 2) { empty(container, opts.empty || "collecting samples…"); return; }
    var width = widthOf(container), height = 200, left = 48, bottom = 24, top = 10, right = 10;
    var t0 = points[0].t, t1 = points[points.length - 1].t;
    var max = Math.max.apply(null, points.map(function (p) { return p.v; })) || 1;
    var root = svg(container, width, height, "line", points.length);
    var px = function (t) { return left + (t - t0) / Math.max(t1 - t0, 1e-9) * (width - left - right); };
    var py = function (v) { return top + (1 - v / max) * (height - top - bottom); };
    [0, 0.5, 1].forEach(function (f) {
      root.appendChild(el("line", { x1: left, x2: width - right, y1: py(max * f), y2: py(max * f), "class": "grid" }));
      root.appendChild(el("text", { x: left - 6, y: py(max * f) + 4, "text-anchor": "end" }, fmt(max * f)));
    });
    var d = points.map(function (p, i) { return (i ? "L" : "M") + px(p.t).toFixed(1) + " " + py(p.v).toFixed(1); }).join(" ");
    root.appendChild(el("path", { d: d + " L" + px(t1).toFixed(1) + " " + py(0) + " L" + left + " " + py(0) + " Z",
      fill: "rgba(47,111,178,.12)", stroke: "none" }));
    root.appendChild(el("path", { d: d, fill: "none", stroke: PALETTE[0], "stroke-width": 2 }));
    root.appendChild(el("text", { x: left, y: height - 6 }, Math.round(t1 - t0) + " s shown"));
  }

  /* Log-log scatter of [{x, y, label}] with the y = x line. */
  function scatter(container, points, opts) {
    opts = opts || {};
    var pts = points.filter(function (p) { return p.x > 0 && p.y > 0; });
    if (!pts.length) { empty(container, opts.empty); return; }
    var width = widthOf(container), height = 320, left = 52, bottom = 34, top = 10, right = 14;
    var all = pts.map(function (p) { return p.x; }).concat(pts.map(function (p) { return p.y; }));
    var lo = Math.log10(Math.min.apply(null, all)), hi = Math.log10(Math.max.apply(null, all));
    lo = Math.floor(lo - 0.05); hi = Math.ceil(hi + 0.05); if (hi <= lo) hi = lo + 1;
    var sx = function (v) { return left + (Math.log10(v) - lo) / (hi - lo) * (width - left - right); };
    var sy = function (v) { return top + (1 - (Math.log10(v) - lo) / (hi - lo)) * (height - top - bottom); };
    var root = svg(container, width, height, "scatter", pts.length);
    for (var e = lo; e <= hi; e++) {
      var v = Math.pow(10, e);
      root.appendChild(el("line", { x1: sx(v), x2: sx(v), y1: top, y2: height - bottom, "class": "grid" }));
      root.appendChild(el("line", { x1: left, x2: width - right, y1: sy(v), y2: sy(v), "class": "grid" }));
      root.appendChild(el("text", { x: sx(v), y: height - bottom + 14, "text-anchor": "middle" }, fmt(v)));
      root.appendChild(el("text", { x: left - 6, y: sy(v) + 4, "text-anchor": "end" }, fmt(v)));
    }
    var a = Math.pow(10, lo), b = Math.pow(10, hi);
    root.appendChild(el("line", { x1: sx(a), y1: sy(a), x2: sx(b), y2: sy(b), stroke: "#9aa4b2", "stroke-dasharray": "4 3" }));
    var colors = {};
    pts.forEach(function (p) {
      if (!(p.group in colors)) colors[p.group] = PALETTE[Object.keys(colors).length % PALETTE.length];
      title(root.appendChild(el("circle", { cx: sx(p.x).toFixed(1), cy: sy(p.y).toFixed(1), r: 3.5,
        fill: colors[p.group], "fill-opacity": 0.7 })), p.label);
    });
    root.appendChild(el("text", { x: (width + left) / 2, y: height - 4, "text-anchor": "middle" }, opts.xLabel || "predicted"));
    root.appendChild(el("text", { x: left + 6, y: top + 12 }, opts.yLabel || "actual"));
  }

  window.AitpCharts = { hbars: hbars, groupedBars: groupedBars, line: line, scatter: scatter,
    fmt: fmt, palette: PALETTE };
})();
