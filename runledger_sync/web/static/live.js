/* Live updates for pages whose <main> carries data-live="SECONDS": every few seconds the
 * page is fetched again and its <main> replaces this one. No build step, no library.
 * It pauses while the tab is hidden, while a form has focus (someone is typing or
 * choosing), and when switched off with the header's toggle (remembered per browser).
 * Without JavaScript the pages are complete; this only spares a reload. */
(function () {
  "use strict";
  var main = document.querySelector("main[data-live]");
  if (!main || !window.fetch || !window.DOMParser) {
    return;
  }
  var KEY = "runledger-live";
  var seconds = Math.max(2, parseInt(main.getAttribute("data-live"), 10) || 5);
  var timer = null;
  var inFlight = false;

  function remembered() {
    try { return window.localStorage.getItem(KEY) !== "off"; } catch (e) { return true; }
  }
  function remember(on) {
    try { window.localStorage.setItem(KEY, on ? "on" : "off"); } catch (e) { /* private mode: not kept */ }
  }
  var on = remembered();

  var toggle = document.createElement("button");
  toggle.type = "button";
  toggle.id = "live-toggle";
  toggle.className = "live-toggle";
  // A form someone has started to fill in (boxes ticked on the dead letters, a filter
  // typed) would be wiped by a swap: once changed, the page waits for its submit.
  var edited = false;
  function editing() {
    var active = document.activeElement;
    return edited || !!(active && active !== document.body && active.closest && active.closest("form"));
  }

  function label() {
    var paused = on && editing();
    toggle.textContent = paused ? "Live: paused" : on ? "Live: on" : "Live: off";
    toggle.setAttribute("aria-pressed", on ? "true" : "false");
    toggle.title = paused ? "Paused while you use a form on this page"
                 : on ? "The page updates itself every " + seconds + " s; click to stop"
                 : "Click to update the page every " + seconds + " s";
  }
  label();
  var header = document.querySelector("header");
  (header || document.body).appendChild(toggle);

  function touched() {
    edited = true;
    label();
  }
  main.addEventListener("input", touched);
  main.addEventListener("change", touched);

  function schedule() {
    window.clearTimeout(timer);
    timer = null;
    if (on && !document.hidden) {
      timer = window.setTimeout(refresh, seconds * 1000);
    }
  }

  function swap(html) {
    var page = new window.DOMParser().parseFromString(html, "text/html");
    var fresh = page.querySelector("main");
    if (!fresh) {
      return;
    }
    main.replaceChildren.apply(main, Array.prototype.slice.call(fresh.childNodes).map(function (node) {
      return document.adoptNode(node);
    }));
    if (page.title) {
      document.title = page.title;
    }
    main.setAttribute("data-live-updated", new Date().toISOString());
  }

  var turns = 0;
  function refresh() {
    // Counted on the page, swapped or not: a test (or a curious operator) can tell a turn ran.
    turns += 1;
    main.setAttribute("data-live-turns", String(turns));
    if (!on || document.hidden || inFlight) {
      return schedule();
    }
    label();
    if (editing()) {
      return schedule();
    }
    inFlight = true;
    window.fetch(window.location.href, {credentials: "same-origin", cache: "no-store"})
      .then(function (response) {
        // A redirect (a login page) or an error page is not this page: keep what is shown.
        if (!response.ok || response.redirected) {
          return null;
        }
        return response.text();
      })
      .then(function (html) {
        if (html !== null && !editing()) {
          swap(html);
        }
      })
      .catch(function () { /* offline or the server restarting: try again next turn */ })
      .then(function () {
        inFlight = false;
        schedule();
      });
  }

  toggle.addEventListener("click", function () {
    on = !on;
    remember(on);
    label();
    if (on) {
      refresh();
    } else {
      schedule();
    }
  });
  document.addEventListener("visibilitychange", function () {
    if (document.hidden) {
      schedule();
    } else {
      refresh();
    }
  });
  schedule();
}());
