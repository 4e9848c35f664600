// The inbox's only script (served from /static; the Content-Security-Policy allows no other). Pages work without it:
// it listens to /events and, when what a page shows changed, fetches the page's region again and puts it in place,
// keeping the focused control (by its id) and anything typed into a field of the region.
(function () {
  "use strict";
  var region = document.getElementById("region");
  if (!region || !window.EventSource || !window.fetch) { return; }
  var url = region.getAttribute("data-region");
  var watch = region.getAttribute("data-watch");
  var busy = false, again = false;

  function typed() {
    var kept = {};
    region.querySelectorAll("input[id], textarea[id], select[id]").forEach(function (el) {
      if (el.type === "hidden") { return; }
      kept[el.id] = el.type === "checkbox" ? el.checked : el.value;
    });
    return kept;
  }

  function restore(kept, focusedId, openDetails) {
    Object.keys(kept).forEach(function (id) {
      var el = document.getElementById(id);
      if (!el || !region.contains(el)) { return; }
      if (el.type === "checkbox") { el.checked = kept[id]; } else { el.value = kept[id]; }
    });
    openDetails.forEach(function (index) {
      var details = region.querySelectorAll("details")[index];
      if (details) { details.open = true; }
    });
    if (focusedId) {
      var target = document.getElementById(focusedId);
      if (target && region.contains(target)) { target.focus(); }
    }
  }

  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } }).then(function (response) {
      if (!response.ok) { throw new Error("HTTP " + response.status); }
      return response.text();
    }).then(function (html) {
      var active = document.activeElement;
      var focusedId = active && region.contains(active) ? active.id : "";
      var kept = typed();
      var openDetails = [];
      region.querySelectorAll("details").forEach(function (d, i) { if (d.open) { openDetails.push(i); } });
      var fresh = new DOMParser().parseFromString(html, "text/html");
      region.replaceChildren.apply(region, Array.prototype.slice.call(fresh.body.childNodes));
      restore(kept, focusedId, openDetails);
    }).catch(function () { /* the next event tries again */ }).finally(function () {
      busy = false;
      if (again) { again = false; refresh(); }
    });
  }

  var source = new EventSource("/events");
  // A change between the page's rendering and this stream's opening (the worker carrying the turn on right after a
  // decision, say) is told to nobody: look once when the stream opens (and again after each reconnection).
  source.addEventListener("open", function () { refresh(); });
  source.addEventListener("change", function (event) {
    var change;
    try { change = JSON.parse(event.data); } catch (e) { return; }
    if (watch === "*" || change.all || (change.sessions || []).indexOf(watch) !== -1) { refresh(); }
  });
  window.addEventListener("pagehide", function () { source.close(); });
}());
