/* The outbox console's small behaviours, without a framework and without inline scripts (the
   Content-Security-Policy forbids them):
   - the "My zone" button of the time-zone toggle carries the browser's IANA zone;
   - the auto-refresh toggle (kept in localStorage) fetches the page in the background every
     few seconds and swaps in the KPI tiles and the table; it pauses while rows are selected, a
     cell is open or the tab is hidden;
   - the redrive counts update themselves every 2 s until no row is left waiting;
   - "/" puts the cursor in the search box (as in Grafana or GitHub), unless one is typing. */
(function () {
  "use strict";

  function zoneButton() {
    var button = document.getElementById("outbox-zone-local");
    if (!button || !window.Intl) return;
    var zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
    if (!zone || zone === "UTC" || zone === "Etc/UTC") return;
    button.value = zone;
    button.textContent = "My zone (" + zone + ")";
    var current = document.getElementById("outbox-zone-current");
    if (current && current.textContent.trim() === zone) button.setAttribute("aria-pressed", "true");
    button.hidden = false;
  }

  // The console's clock is 24-hour ("Updated 18:05:50"), like every other time it shows.
  function clock(date) {
    function two(n) { return (n < 10 ? "0" : "") + n; }
    return two(date.getHours()) + ":" + two(date.getMinutes()) + ":" + two(date.getSeconds());
  }

  function searchShortcut() {
    document.addEventListener("keydown", function (event) {
      if (event.key !== "/" || event.ctrlKey || event.metaKey || event.altKey) return;
      var target = event.target;
      var tag = target && target.tagName;
      if (tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT" || (target && target.isContentEditable)) return;
      var search = document.getElementById("searchbar");
      if (!search) return;
      event.preventDefault();
      search.focus();
      search.select();
    });
  }

  function fetchDocument(url) {
    return fetch(url, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } }).then(function (r) {
      if (!r.ok) throw new Error("HTTP " + r.status);
      return r.text();
    }).then(function (text) {
      return new DOMParser().parseFromString(text, "text/html");
    });
  }

  function autoRefresh() {
    var toggle = document.getElementById("outbox-autorefresh");
    if (!toggle) return;
    var note = document.getElementById("outbox-refreshed");
    var timer = null;

    function busy() {
      return document.hidden ||
        document.querySelector("#result_list input.action-select:checked, #result_list details[open]") !== null;
    }

    function refresh() {
      if (busy()) { if (note) note.textContent = "Auto-refresh paused while rows are selected or opened."; return; }
      fetchDocument(window.location.href).then(function (doc) {
        var pairs = [["#outbox-live-kpis", "#outbox-live-kpis"], ["#result_list tbody", "#result_list tbody"],
                     [".paginator", ".paginator"]];
        pairs.forEach(function (pair) {
          var mine = document.querySelector(pair[0]);
          var theirs = doc.querySelector(pair[1]);
          if (mine && theirs) mine.innerHTML = theirs.innerHTML;
        });
        if (note) note.textContent = "Updated " + clock(new Date());
      }).catch(function (error) {
        if (note) note.textContent = "Refresh failed (" + error.message + "); trying again.";
      });
    }

    function apply() {
      if (timer) { clearInterval(timer); timer = null; }
      var seconds = parseInt(toggle.getAttribute("data-interval"), 10) || 10;
      if (toggle.checked) { timer = setInterval(refresh, seconds * 1000); }
      else if (note) { note.textContent = ""; }
      try { localStorage.setItem("outbox-autorefresh", toggle.checked ? "1" : "0"); } catch (e) { /* private mode */ }
    }

    try { toggle.checked = localStorage.getItem("outbox-autorefresh") === "1"; } catch (e) { /* private mode */ }
    toggle.addEventListener("change", apply);
    apply();
  }

  function redrive() {
    var box = document.getElementById("outbox-redrive-counts");
    if (!box) return;
    function poll() {
      box = document.getElementById("outbox-redrive-counts");
      if (!box || box.getAttribute("data-done") === "1") return;
      fetch(box.getAttribute("data-refresh-url"), { credentials: "same-origin" }).then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.text();
      }).then(function (html) {
        var holder = document.createElement("div");
        holder.innerHTML = html.trim();
        var fresh = holder.querySelector("#outbox-redrive-counts");
        if (fresh) box.replaceWith(fresh);
      }).catch(function () { /* try again on the next tick */ }).then(function () {
        setTimeout(poll, 2000);
      });
    }
    setTimeout(poll, 2000);
  }

  function start() { zoneButton(); autoRefresh(); redrive(); searchShortcut(); }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
