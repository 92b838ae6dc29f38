/* cdeepfuzz report charts: interactive line charts drawn on a canvas, with no dependency and
   nothing loaded from the network (the report inlines this file).

   CDFChart.create(host, spec) draws into the element `host`:
     spec = {series: [{name, x: [...], y: [...] (null for a gap), color?, step?: bool,
                       ev?: {eventName: [point index, ...]}}],
             xlabel, ylabel, height?, log?: bool}
   Interactions: the mouse wheel zooms the x axis around the pointer (with Shift: the y axis),
   a drag zooms into the dragged box, a double click (or "reset") shows everything again,
   hovering shows the nearest point, and "log scale" switches the y axis to a symmetric log
   scale (0, the edge of an op's domain, stays in view).
   CDFChart.lazy(nodes, specOf) draws each node only once it scrolls into view. */
(function () {
  "use strict";
  var PAD = {l: 62, r: 14, t: 10, b: 38};
  var COLORS = ["#2c6fbb", "#c0392b", "#27ae60", "#8e44ad", "#d68910", "#16a085", "#7f8c8d",
                "#e84393", "#34495e", "#b9770e", "#1abc9c", "#5d6d7e"];
  var EVENT_STYLE = {trigger: ["star", "#c0392b", 7], mutation: ["tri", "#222", 4],
                     refresh: ["square", "#222", 4]};
  var state = {rendered: 0, firstRenderMs: null};

  function fmt(v) {
    if (v === null || v === undefined || !isFinite(v)) return String(v);
    if (v === 0) return "0";
    var a = Math.abs(v);
    if (a >= 1e5 || a < 1e-3) return v.toExponential(2);
    return String(+v.toPrecision(4));
  }

  function niceStep(span, n) {
    var raw = span / Math.max(n, 1), p = Math.pow(10, Math.floor(Math.log10(raw))), e = raw / p;
    return p * (e >= 7.5 ? 10 : e >= 3.5 ? 5 : e >= 1.5 ? 2 : 1);
  }

  function linTicks(a, b, n) {
    if (!(b > a)) return [a];
    var s = niceStep(b - a, n), out = [];
    for (var v = Math.ceil(a / s) * s; v <= b + s * 1e-9; v += s) out.push(Math.abs(v) < s * 1e-9 ? 0 : v);
    return out;
  }

  function Chart(host, spec) {
    this.host = host;
    this.spec = spec;
    this.series = spec.series.map(function (s, i) {
      return {name: s.name, x: s.x, y: s.y, ev: s.ev || {}, step: !!s.step,
              color: s.color || COLORS[i % COLORS.length]};
    });
    this.log = !!spec.log;
    this.c = this.symlogConstant();
    this.view = null;           // {x0, x1, y0, y1, yAuto}; y in the scale's own units
    this.build();
    this.reset();
    var t = (window.performance && performance.now) ? performance.now() : 0;
    state.rendered += 1;
    if (state.firstRenderMs === null) {
      state.firstRenderMs = t;
      document.documentElement.setAttribute("data-first-chart-ms", String(Math.round(t)));
    }
    host.cdfChart = this;
  }

  /* the symmetric log scale is log10(1 + |y| / c): c is the smallest positive value shown */
  Chart.prototype.symlogConstant = function () {
    var c = Infinity;
    this.series.forEach(function (s) {
      for (var i = 0; i < s.y.length; i++) {
        var v = s.y[i] === null ? NaN : Math.abs(s.y[i]);
        if (v > 0 && v < c) c = v;
      }
    });
    return isFinite(c) ? Math.min(Math.max(c, 1e-12), 1) : 1e-3;
  };

  Chart.prototype.ty = function (y) {
    if (!this.log) return y;
    return (y < 0 ? -1 : 1) * Math.log10(1 + Math.abs(y) / this.c);
  };

  Chart.prototype.inv = function (t) {
    if (!this.log) return t;
    return (t < 0 ? -1 : 1) * this.c * (Math.pow(10, Math.abs(t)) - 1);
  };

  Chart.prototype.build = function () {
    var self = this, doc = document;
    this.host.innerHTML = "";
    this.host.classList.add("cdf-chart");
    var bar = doc.createElement("div");
    bar.className = "cdf-bar";
    var label = doc.createElement("label");
    this.logBox = doc.createElement("input");
    this.logBox.type = "checkbox";
    this.logBox.className = "cdf-log";
    this.logBox.checked = this.log;
    label.appendChild(this.logBox);
    label.appendChild(doc.createTextNode(" log scale"));
    this.resetButton = doc.createElement("button");
    this.resetButton.type = "button";
    this.resetButton.className = "cdf-reset";
    this.resetButton.textContent = "reset zoom";
    var hint = doc.createElement("span");
    hint.className = "cdf-hint";
    hint.textContent = "wheel: zoom (Shift: y) · drag: zoom to box · double-click: reset";
    bar.appendChild(label);
    bar.appendChild(this.resetButton);
    bar.appendChild(hint);
    var plot = doc.createElement("div");
    plot.className = "cdf-plot";
    this.canvas = doc.createElement("canvas");
    this.tip = doc.createElement("div");
    this.tip.className = "cdf-tip";
    this.dot = doc.createElement("div");
    this.dot.className = "cdf-dot";
    this.box = doc.createElement("div");
    this.box.className = "cdf-box";
    [this.canvas, this.dot, this.box, this.tip].forEach(function (n) { plot.appendChild(n); });
    this.host.appendChild(bar);
    this.host.appendChild(plot);
    this.plot = plot;
    if (this.series.length > 1) {
      var legend = doc.createElement("div");
      legend.className = "cdf-legend";
      this.series.forEach(function (s) {
        var item = doc.createElement("span");
        var sw = doc.createElement("i");
        sw.style.background = s.color;
        item.appendChild(sw);
        item.appendChild(doc.createTextNode(s.name));
        legend.appendChild(item);
      });
      this.host.appendChild(legend);
    }
    this.logBox.addEventListener("change", function () { self.setLog(self.logBox.checked); });
    this.resetButton.addEventListener("click", function () { self.reset(); });
    var c = this.canvas;
    c.addEventListener("wheel", function (e) { self.onWheel(e); }, {passive: false});
    c.addEventListener("mousedown", function (e) { self.onDown(e); });
    c.addEventListener("mousemove", function (e) { self.onMove(e); });
    c.addEventListener("mouseleave", function () { self.hideTip(); });
    c.addEventListener("dblclick", function () { self.reset(); });
    window.addEventListener("mouseup", function (e) { self.onUp(e); });
    if (window.ResizeObserver) {
      var w = 0;
      new ResizeObserver(function () {
        if (plot.clientWidth !== w) { w = plot.clientWidth; self.draw(); }
      }).observe(plot);
    }
  };

  /* the extent of the data in x, and in y (scale units) over [x0, x1] */
  Chart.prototype.xExtent = function () {
    var a = Infinity, b = -Infinity;
    this.series.forEach(function (s) {
      if (s.x.length) { a = Math.min(a, s.x[0]); b = Math.max(b, s.x[s.x.length - 1]); }
    });
    if (!isFinite(a)) { a = 0; b = 1; }
    if (a === b) { a -= 1; b += 1; }
    return [a, b];
  };

  Chart.prototype.yExtent = function (x0, x1) {
    var a = Infinity, b = -Infinity, self = this;
    this.series.forEach(function (s) {
      var i = Math.max(0, self.index(s, x0) - 1);
      for (; i < s.x.length; i++) {
        if (s.x[i] > x1) { if (s.step && s.y[i - 1] !== null && i > 0) { var t = self.ty(s.y[i - 1]); a = Math.min(a, t); b = Math.max(b, t); } break; }
        var v = s.y[i];
        if (v === null || !isFinite(v)) continue;
        var u = self.ty(v);
        if (u < a) a = u;
        if (u > b) b = u;
      }
    });
    if (!isFinite(a)) { a = 0; b = 1; }
    if (a > 0 && (this.log || a < b * 0.5)) a = 0;     // 0, the edge of the domain, in view
    if (a === b) { b = a + (Math.abs(a) || 1); }
    var pad = (b - a) * 0.05;
    return [a - (a === 0 ? 0 : pad), b + pad];
  };

  /* the first point index with x >= v (binary search: x is sorted) */
  Chart.prototype.index = function (s, v) {
    var lo = 0, hi = s.x.length;
    while (lo < hi) { var m = (lo + hi) >> 1; if (s.x[m] < v) lo = m + 1; else hi = m; }
    return lo;
  };

  Chart.prototype.reset = function () {
    var x = this.xExtent(), y = this.yExtent(x[0], x[1]);
    this.view = {x0: x[0], x1: x[1], y0: y[0], y1: y[1], yAuto: true};
    this.draw();
  };

  Chart.prototype.setLog = function (on) {
    this.log = !!on;
    this.logBox.checked = this.log;
    var v = this.view;
    var y = this.yExtent(v.x0, v.x1);
    v.y0 = y[0]; v.y1 = y[1]; v.yAuto = true;
    this.draw();
  };

  Chart.prototype.getView = function () {
    var v = this.view;
    return {x0: v.x0, x1: v.x1, y0: this.inv(v.y0), y1: this.inv(v.y1), log: this.log};
  };

  Chart.prototype.zoomX = function (x0, x1) {
    if (!(x1 > x0)) return;
    var v = this.view;
    v.x0 = x0; v.x1 = x1;
    if (v.yAuto) { var y = this.yExtent(x0, x1); v.y0 = y[0]; v.y1 = y[1]; }
    this.draw();
  };

  Chart.prototype.rect = function () {
    var w = this.plot.clientWidth || 400, h = this.spec.height || 240;
    return {w: w, h: h, l: PAD.l, t: PAD.t, r: w - PAD.r, b: h - PAD.b};
  };

  Chart.prototype.px = function (x, r) { var v = this.view; return r.l + (x - v.x0) / (v.x1 - v.x0) * (r.r - r.l); };
  Chart.prototype.py = function (t, r) { var v = this.view; return r.b - (t - v.y0) / (v.y1 - v.y0) * (r.b - r.t); };

  Chart.prototype.yTicks = function () {
    var v = this.view;
    if (!this.log) return linTicks(v.y0, v.y1, 5);
    var lo = this.inv(v.y0), hi = this.inv(v.y1), out = [];
    if (lo <= 0 && hi >= 0) out.push(0);
    var top = Math.max(Math.abs(lo), Math.abs(hi));
    var k0 = Math.floor(Math.log10(this.c)), k1 = Math.ceil(Math.log10(Math.max(top, this.c)));
    var every = Math.max(1, Math.ceil((k1 - k0 + 1) / 6));
    for (var k = k1; k >= k0; k -= every) {
      var d = Math.pow(10, k);
      if (d >= lo && d <= hi) out.push(d);
      if (-d >= lo && -d <= hi) out.push(-d);
    }
    if (out.length < 2) return linTicks(lo, hi, 4);
    return out;
  };

  Chart.prototype.draw = function () {
    var r = this.rect(), dpr = window.devicePixelRatio || 1, c = this.canvas, self = this;
    c.width = Math.round(r.w * dpr);
    c.height = Math.round(r.h * dpr);
    c.style.width = r.w + "px";
    c.style.height = r.h + "px";
    var g = c.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, r.w, r.h);
    g.font = "11px system-ui, sans-serif";
    g.strokeStyle = "#e3e3e3";
    g.fillStyle = "#444";
    g.lineWidth = 1;
    var v = this.view;
    // grid and ticks
    g.textAlign = "center";
    g.textBaseline = "top";
    linTicks(v.x0, v.x1, Math.max(2, Math.floor((r.r - r.l) / 90))).forEach(function (x) {
      var p = Math.round(self.px(x, r)) + 0.5;
      g.beginPath(); g.moveTo(p, r.t); g.lineTo(p, r.b); g.stroke();
      g.fillText(fmt(x), p, r.b + 4);
    });
    g.textAlign = "right";
    g.textBaseline = "middle";
    this.yTicks().forEach(function (y) {
      var p = Math.round(self.py(self.ty(y), r)) + 0.5;
      if (p < r.t - 1 || p > r.b + 1) return;
      g.beginPath(); g.moveTo(r.l, p); g.lineTo(r.r, p); g.stroke();
      g.fillText(fmt(y), r.l - 5, p);
    });
    g.strokeStyle = "#888";
    g.strokeRect(r.l + 0.5, r.t + 0.5, r.r - r.l, r.b - r.t);
    g.textAlign = "center";
    g.textBaseline = "bottom";
    g.fillText(this.spec.xlabel || "", (r.l + r.r) / 2, r.h - 2);
    g.save();
    g.translate(12, (r.t + r.b) / 2);
    g.rotate(-Math.PI / 2);
    g.textBaseline = "middle";
    g.fillText((this.spec.ylabel || "") + (this.log ? " (log)" : ""), 0, 0);
    g.restore();
    // the series, clipped to the plot area
    g.save();
    g.beginPath();
    g.rect(r.l, r.t, r.r - r.l, r.b - r.t);
    g.clip();
    this.series.forEach(function (s) {
      var i0 = Math.max(0, self.index(s, v.x0) - 1), i1 = Math.min(s.x.length, self.index(s, v.x1) + 1);
      g.strokeStyle = s.color;
      g.lineWidth = 1.4;
      g.beginPath();
      var pen = false, lastY = 0;
      for (var i = i0; i < i1; i++) {
        var y = s.y[i];
        if (y === null || !isFinite(y)) { pen = false; continue; }
        var X = self.px(s.x[i], r), Y = self.py(self.ty(y), r);
        if (!pen) { g.moveTo(X, Y); pen = true; }
        else if (s.step) { g.lineTo(X, lastY); g.lineTo(X, Y); }
        else g.lineTo(X, Y);
        lastY = Y;
      }
      g.stroke();
      Object.keys(s.ev).forEach(function (name) {
        var st = EVENT_STYLE[name] || ["dot", "#555", 2.5];
        g.fillStyle = st[1];
        s.ev[name].forEach(function (i) {
          if (i < i0 || i >= i1) return;
          var y = s.y[i];
          var X = self.px(s.x[i], r), Y = self.py(self.ty(y === null || !isFinite(y) ? 0 : y), r);
          shape(g, st[0], X, Y, st[2]);
        });
      });
    });
    g.restore();
  };

  function shape(g, kind, x, y, s) {
    g.beginPath();
    if (kind === "square") g.rect(x - s / 2, y - s / 2, s, s);
    else if (kind === "tri") { g.moveTo(x, y - s); g.lineTo(x + s, y + s * 0.7); g.lineTo(x - s, y + s * 0.7); g.closePath(); }
    else if (kind === "star") {
      for (var k = 0; k < 10; k++) {
        var a = Math.PI / 5 * k - Math.PI / 2, q = k % 2 ? s * 0.45 : s;
        if (k) g.lineTo(x + q * Math.cos(a), y + q * Math.sin(a)); else g.moveTo(x + q * Math.cos(a), y + q * Math.sin(a));
      }
      g.closePath();
    } else g.arc(x, y, s, 0, 2 * Math.PI);
    g.fill();
  }

  Chart.prototype.local = function (e) {
    var b = this.canvas.getBoundingClientRect();
    return {x: e.clientX - b.left, y: e.clientY - b.top};
  };

  Chart.prototype.onWheel = function (e) {
    e.preventDefault();
    var r = this.rect(), p = this.local(e), v = this.view;
    var f = Math.exp(Math.max(-1, Math.min(1, (e.deltaY || 0) * 0.002)));
    if (e.shiftKey) {
      var ty = v.y0 + (r.b - p.y) / (r.b - r.t) * (v.y1 - v.y0);
      v.y0 = ty - (ty - v.y0) * f; v.y1 = ty + (v.y1 - ty) * f; v.yAuto = false;
      this.draw();
    } else {
      var tx = v.x0 + (p.x - r.l) / (r.r - r.l) * (v.x1 - v.x0);
      this.zoomX(tx - (tx - v.x0) * f, tx + (v.x1 - tx) * f);
    }
    this.hideTip();
  };

  Chart.prototype.onDown = function (e) {
    if (e.button !== 0) return;
    this.drag = this.local(e);
    e.preventDefault();
  };

  Chart.prototype.onUp = function (e) {
    if (!this.drag) return;
    var a = this.drag, b = this.local(e), r = this.rect(), v = this.view;
    this.drag = null;
    this.box.style.display = "none";
    if (Math.abs(b.x - a.x) < 5) return;
    var X = function (p) { return v.x0 + (Math.min(Math.max(p, r.l), r.r) - r.l) / (r.r - r.l) * (v.x1 - v.x0); };
    var Y = function (p) { return v.y0 + (r.b - Math.min(Math.max(p, r.t), r.b)) / (r.b - r.t) * (v.y1 - v.y0); };
    var x0 = X(Math.min(a.x, b.x)), x1 = X(Math.max(a.x, b.x));
    if (Math.abs(b.y - a.y) >= 5) {
      v.y0 = Y(Math.max(a.y, b.y)); v.y1 = Y(Math.min(a.y, b.y)); v.yAuto = false;
    }
    this.zoomX(x0, x1);
  };

  Chart.prototype.hideTip = function () {
    this.tip.style.display = "none";
    this.dot.style.display = "none";
  };

  Chart.prototype.onMove = function (e) {
    var p = this.local(e), r = this.rect(), v = this.view, self = this;
    if (this.drag) {
      var b = this.box.style, a = this.drag;
      b.display = "block";
      b.left = Math.min(a.x, p.x) + "px"; b.width = Math.abs(p.x - a.x) + "px";
      b.top = Math.min(a.y, p.y) + "px"; b.height = Math.max(Math.abs(p.y - a.y), 2) + "px";
      return;
    }
    if (p.x < r.l || p.x > r.r || p.y < r.t || p.y > r.b) { this.hideTip(); return; }
    var xv = v.x0 + (p.x - r.l) / (r.r - r.l) * (v.x1 - v.x0), best = null;
    this.series.forEach(function (s) {
      var i = self.index(s, xv);
      [i - 1, i].forEach(function (j) {
        if (j < 0 || j >= s.x.length) return;
        var y = s.y[j], X = self.px(s.x[j], r);
        var Y = (y === null || !isFinite(y)) ? r.b : self.py(self.ty(y), r);
        var d = Math.abs(X - p.x) * 3 + Math.abs(Y - p.y) * (self.series.length > 1 ? 1 : 0);
        if (best === null || d < best.d) best = {d: d, s: s, j: j, X: X, Y: Y};
      });
    });
    if (!best) { this.hideTip(); return; }
    var s = best.s, j = best.j, events = [];
    Object.keys(s.ev).forEach(function (n) { if (s.ev[n].indexOf(j) >= 0) events.push(n); });
    var y = s.y[j];
    this.tip.textContent = (this.series.length > 1 ? s.name + "\n" : "") + (this.spec.xname || "step") + " " + fmt(s.x[j]) +
      "\n" + (this.spec.yname || "loss") + " " + (y === null ? "not finite" : fmt(y)) + (events.length ? "\n" + events.join(", ") : "");
    var t = this.tip.style;
    t.display = "block";
    t.left = Math.min(best.X + 10, r.w - 150) + "px";
    t.top = Math.max(best.Y - 40, 0) + "px";
    var d = this.dot.style;
    d.display = "block";
    d.left = (best.X - 4) + "px";
    d.top = (best.Y - 4) + "px";
    d.borderColor = s.color;
  };

  function lazy(nodes, specOf) {
    nodes = Array.prototype.slice.call(nodes);
    var make = function (n) { if (!n.cdfChart) new Chart(n, specOf(n)); };
    if (!window.IntersectionObserver) { nodes.forEach(make); return; }
    var io = new IntersectionObserver(function (entries) {
      entries.forEach(function (en) {
        if (en.isIntersecting) { io.unobserve(en.target); make(en.target); }
      });
    }, {rootMargin: "300px"});
    nodes.forEach(function (n) { io.observe(n); });
  }

  window.CDFChart = {
    create: function (host, spec) { return new Chart(host, spec); },
    lazy: lazy,
    state: state,
    fmt: fmt
  };
})();
