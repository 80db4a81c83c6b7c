// corral dashboard: live updates without a framework (no build step, no external requests).
// 1. #live[data-live=N]: every N seconds, the page's live part is fetched again (?partial=1) and
//    swapped in, unless the user is typing in it or it is unchanged; the log viewer inside it is
//    kept as it is.
// 2. #log[data-job]: the job's output, fetched from GET /jobs/{id}/logs from where the last read
//    ended, decoded as a stream (a character split across two reads stays whole), appended as text.
(function () {
  "use strict";

  function partialUrl() {
    var url = new URL(window.location.href);
    url.searchParams.set("partial", "1");
    return url.toString();
  }

  function startLive(live) {
    var every = Number(live.dataset.live || "2") * 1000;
    var last = live.innerHTML;
    function tick() {
      var active = document.activeElement;
      if (active && live.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName)) {
        return window.setTimeout(tick, every);
      }
      fetch(partialUrl(), { headers: { Accept: "text/html" }, cache: "no-store" })
        .then(function (response) { return response.ok ? response.text() : null; })
        .then(function (html) {
          if (html !== null && html !== last) {
            // the log keeps its node (and what it has read so far) across the swap
            var kept = ["log", "log-state"].map(function (id) { return document.getElementById(id); });
            var scrolls = kept.map(function (node) { return node ? node.scrollTop : 0; });
            live.innerHTML = html;
            last = html;
            kept.forEach(function (node, index) {
              var fresh = node && document.getElementById(node.id);
              if (fresh && fresh !== node) {
                fresh.replaceWith(node);
                node.scrollTop = scrolls[index];  // a node put back in the page starts at the top
              }
            });
            document.dispatchEvent(new CustomEvent("corral:updated"));
          }
        })
        .catch(function () {})
        .finally(function () { window.setTimeout(tick, every); });
    }
    window.setTimeout(tick, every);
  }

  function jobHead() { return document.querySelector("#live .job-head"); }

  function startLogs(log) {
    var job = log.dataset.job;
    var attempt = log.dataset.attempt;
    var state = document.getElementById("log-state");
    var offset = 0;
    var decoder = new TextDecoder("utf-8");
    var finished = false;
    function say(text) { if (state) { state.textContent = text; } }
    function tick() {
      var url = "/jobs/" + encodeURIComponent(job) + "/logs?offset=" + offset;
      if (attempt) { url += "&attempt=" + encodeURIComponent(attempt); }
      var head = jobHead();
      var ended = head && head.dataset.terminal === "yes" || (head && attempt && head.dataset.attempt !== attempt);
      fetch(url, { cache: "no-store" })
        .then(function (response) {
          if (!response.ok) { throw new Error("logs answered " + response.status); }
          var start = Number(response.headers.get("X-Corral-Log-Start") || "0");
          var size = Number(response.headers.get("X-Corral-Log-Size") || "0");
          if (start > offset && offset === 0 && start > 0) {
            log.appendChild(document.createTextNode("[" + start + " earlier bytes were dropped]\n"));
          }
          return response.arrayBuffer().then(function (buffer) {
            if (buffer.byteLength) {
              var atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
              log.appendChild(document.createTextNode(decoder.decode(buffer, { stream: true })));
              if (atBottom) { log.scrollTop = log.scrollHeight; }
            }
            offset = start + buffer.byteLength;
            return offset < size;
          });
        })
        .then(function (more) {
          if (more) { return tick(); }
          if (ended) {
            finished = true;
            say(log.textContent ? "The attempt has ended: this is its whole output." : "The attempt wrote nothing.");
            return;
          }
          say("Following: new output appears as it is written.");
          window.setTimeout(tick, 1000);
        })
        .catch(function (error) { say(String(error)); window.setTimeout(tick, 3000); });
    }
    if (attempt) { tick(); } else {
      say("Waiting for the job to start.");
      document.addEventListener("corral:updated", function wait() {
        var head = jobHead();
        if (head && head.dataset.attempt && head.dataset.attempt !== "0" && !finished) {
          document.removeEventListener("corral:updated", wait);
          attempt = head.dataset.attempt;
          log.dataset.attempt = attempt;
          tick();
        }
      });
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    var live = document.getElementById("live");
    if (live && live.dataset.live) { startLive(live); }
    var log = document.getElementById("log");
    if (log && log.dataset.job) { startLogs(log); }
  });
})();
