// Keeps a page's counts current without a reload: every 20 s it reads /live.json (same origin,
// the page's own cookies) and writes each number into the element whose data-live names it,
// then says when the numbers were read. No inline script: the CSP allows only this file.
(function () {
  "use strict";
  var EVERY_MS = 20000;
  var stamp = document.getElementById("read-at");
  var targets = document.querySelectorAll("[data-live]");
  if (!stamp) {
    return;
  }
  function show(values, readAt) {
    for (var i = 0; i < targets.length; i++) {
      var key = targets[i].getAttribute("data-live");
      if (Object.prototype.hasOwnProperty.call(values, key)) {
        targets[i].textContent = Number(values[key]).toLocaleString("en-US");
      }
    }
    stamp.textContent = readAt;
    stamp.classList.remove("stale");
  }
  function refresh() {
    fetch("/live.json", { credentials: "same-origin", redirect: "error", cache: "no-store" })
      .then(function (answer) {
        if (!answer.ok) {
          throw new Error("HTTP " + answer.status);
        }
        return answer.json();
      })
      .then(function (data) {
        show(data.values, data.read_at_text);
      })
      .catch(function () {
        // signed out, or the server is away: the numbers stay, marked as old
        stamp.classList.add("stale");
      });
  }
  window.setInterval(refresh, EVERY_MS);
})();
