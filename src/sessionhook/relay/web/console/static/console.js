// sessionhook console: live updates over Server-Sent Events (GET /console/live).
// No framework, no inline script (the Content-Security-Policy forbids it). Every value that
// came from the server is put in the page with textContent, never as HTML.
"use strict";

(function () {
  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function timelineUrl(session) {
    return "/console/timeline?session=" + encodeURIComponent(session);
  }

  function connect(after, session, onEvent) {
    var url = "/console/live?after=" + encodeURIComponent(after);
    if (session) url += "&session=" + encodeURIComponent(session);
    var state = document.getElementById("live-state");
    var source = new EventSource(url);
    source.onopen = function () { if (state) state.textContent = "live"; };
    source.onerror = function () { if (state) state.textContent = "reconnecting…"; };
    source.addEventListener("event", function (msg) {
      var data;
      try { data = JSON.parse(msg.data); } catch (e) { return; }
      onEvent(data);
    });
    return source;
  }

  // Sessions page: a list of new events, and each session's row kept current.
  function sessionsPage(box) {
    var list = document.getElementById("live-events");
    var table = document.querySelector("#sessions tbody");
    var rows = box.hasAttribute("data-live-rows");
    connect(box.getAttribute("data-live-after"), null, function (ev) {
      var item = el("li", "live-event");
      item.setAttribute("data-event-id", ev.id);
      var link = el("a", null, ev.type);
      link.href = timelineUrl(ev.session);
      item.appendChild(link);
      item.appendChild(el("span", "muted", " " + ev.session + " · " + ev.occurred_at));
      list.insertBefore(item, list.firstChild);
      while (list.children.length > 200) list.removeChild(list.lastChild);
      if (!rows || !table) return;
      var row = null;
      for (var i = 0; i < table.rows.length; i++) {
        if (table.rows[i].getAttribute("data-session") === ev.session) { row = table.rows[i]; break; }
      }
      if (row === null) {
        var empty = table.querySelector("tr.empty");
        if (empty) empty.parentNode.removeChild(empty);
        // Filled in as the server draws a row (the session's title, state, source and
        // account come with the event), not blank until a reload.
        row = el("tr");
        row.setAttribute("data-session", ev.session);
        var name = el("td");
        var a = el("a", "session-link", ev.title || ev.session);
        a.href = timelineUrl(ev.session);
        name.appendChild(a);
        name.appendChild(el("div", "muted small", ev.session));
        row.appendChild(name);
        var state = el("td");
        state.appendChild(el("span", "badge st", ev.state || "?"));
        row.appendChild(state);
        row.appendChild(el("td", "source small", ev.source || ""));
        row.appendChild(el("td", "account", ev.account || ""));
        row.appendChild(el("td", "count", "0"));
        row.appendChild(el("td", "last small", ""));
      } else if (ev.state) {
        var badge = row.querySelector(".badge.st");
        if (badge) badge.textContent = ev.state;
      }
      var count = row.querySelector(".count");
      if (count) count.textContent = String((parseInt(count.textContent, 10) || 0) + 1);
      var last = row.querySelector(".last");
      if (last) {
        last.textContent = ev.type;
        last.appendChild(el("div", "muted", ev.occurred_at));
      }
      row.className = "fresh";
      table.insertBefore(row, table.firstChild);
    });
  }

  // Timeline page: new events of this session appended as they are ingested.
  function timelinePage(list) {
    connect(list.getAttribute("data-live-after"), list.getAttribute("data-live-session"), function (ev) {
      var empty = list.querySelector("li.empty");
      if (empty) list.removeChild(empty);
      if (document.getElementById("event-" + ev.seq)) return;
      var item = el("li", "event new");
      item.id = "event-" + ev.seq;
      item.setAttribute("data-event-id", ev.id);
      var head = el("div", "event-head");
      head.appendChild(el("span", "etype", ev.type));
      head.appendChild(el("span", "muted small", ev.occurred_at + " · " + ev.id));
      item.appendChild(head);
      var note = el("p", "muted small", "New: ");
      var reload = el("a", null, "reload for its deliveries");
      reload.href = window.location.pathname + window.location.search;
      note.appendChild(reload);
      item.appendChild(note);
      list.appendChild(item);
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var box = document.getElementById("live");
    if (box) sessionsPage(box);
    var timeline = document.getElementById("timeline");
    // A page of an older part of the timeline is not live (the next page is).
    if (timeline && timeline.hasAttribute("data-live-after")) timelinePage(timeline);
  });
})();
