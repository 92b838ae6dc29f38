/* cdeepfuzz report pages: draws the loss curves (lazily, as they scroll into view) from the
   data embedded in the page, and filters the sites by text and status. */
(function () {
  "use strict";
  var node = document.getElementById("cdf-data");
  if (!node || !window.CDFChart) return;
  var data = JSON.parse(node.textContent);
  function siteSpec(host) {
    var s = data.sites[host.getAttribute("data-site")];
    return {series: [{name: s.name, x: s.s, y: s.l, ev: s.e, color: s.found ? "#c0392b" : "#2c6fbb"}],
            xlabel: "step", ylabel: "suspect loss", xname: "step", yname: "loss", log: false};
  }
  CDFChart.lazy(document.querySelectorAll(".cdf-host[data-site]"), siteSpec);
  var hosts = document.querySelectorAll(".cdf-host[data-chart]");
  if (hosts.length && data.charts) {
    CDFChart.lazy(hosts, function (host) {
      var c = data.charts[host.getAttribute("data-chart")];
      return {series: c.series.map(function (s) { return {name: s.name, x: s.x, y: s.y, step: true}; }),
              xlabel: c.xlabel, ylabel: c.ylabel, xname: c.xname, yname: "steps", height: 300};
    });
  }
  var text = document.getElementById("filter-text"), status = document.getElementById("filter-status");
  function filter() {
    var q = (text && text.value || "").toLowerCase(), st = status && status.value || "";
    document.querySelectorAll("[data-filter]").forEach(function (el) {
      var ok = (!q || el.getAttribute("data-filter").indexOf(q) >= 0) &&
               (!st || el.getAttribute("data-status") === st);
      el.style.display = ok ? "" : "none";
    });
  }
  if (text) text.addEventListener("input", filter);
  if (status) status.addEventListener("change", filter);
})();
