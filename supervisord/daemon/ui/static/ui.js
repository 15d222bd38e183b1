// jobsup's page script: live updates over Server-Sent Events. One stream
// per page. Our own code only; the pages work without it (minus live updates).
"use strict";
(function () {
  const live = document.getElementById("live");
  function setLive(state) { if (live) { live.className = "live " + state; live.title = state === "on" ? "live updates" : "reconnecting"; } }

  // Confirm before state-changing buttons.
  for (const form of document.querySelectorAll("form[data-confirm]")) {
    form.addEventListener("submit", (ev) => { if (!window.confirm(form.dataset.confirm)) ev.preventDefault(); });
  }

  // A stream that reconnects by itself with an explicit cursor: the URL is
  // rebuilt on each attempt so the server resumes exactly where we are.
  function follow(urlFor, handlers) {
    let es = null, delay = 1000;
    function open() {
      es = new EventSource(urlFor());
      es.onopen = () => { setLive("on"); delay = 1000; };
      for (const [name, fn] of Object.entries(handlers)) {
        es.addEventListener(name, (ev) => { if (ev.lastEventId) cursor.seq = Number(ev.lastEventId); fn(JSON.parse(ev.data)); });
      }
      es.onerror = () => {
        setLive("off"); es.close();
        setTimeout(open, delay); delay = Math.min(delay * 2, 5000);   // at most one request a second or slower
      };
    }
    open();
    window.addEventListener("beforeunload", () => es && es.close());
  }
  const cursor = { seq: 0 };

  function fmt(at) { return at ? at.replace("T", " ").slice(0, 19) : ""; }
  function duration(s) {
    if (s < 10) return s.toFixed(1) + "s";
    s = Math.floor(s);
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
    return Math.floor(s / 3600) + "h" + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + "m";
  }
  function size(n) {
    for (const [unit, b] of [["TiB", 2 ** 40], ["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]]) {
      if (n >= b) return (n / b).toFixed(1) + " " + unit;
    }
    return Math.floor(n) + " B";
  }
  // An element whose data-started/data-ended give the elapsed time it shows.
  function tickElapsed(el) {
    if (!el || !el.dataset.started) return;
    const end = el.dataset.ended ? Date.parse(el.dataset.ended) : Date.now();
    el.textContent = duration(Math.max(0, (end - Date.parse(el.dataset.started)) / 1000));
  }
  function badge(phase) { const s = document.createElement("span"); s.className = "badge " + phase; s.textContent = phase; return s; }

  // -- the runs list ------------------------------------------------------------
  const table = document.getElementById("runs");
  if (table) {
    cursor.seq = Number(table.dataset.after || 0);
    const filters = JSON.parse(table.dataset.filters || "{}");
    const labels = JSON.parse(table.dataset.labels || "{}");
    const firstPage = table.dataset.firstPage === "true";
    // The name filter is a shell glob (fnmatch's *, ?, [...], [!...]), as `jobsup runs --name`.
    function globRe(glob) {
      let re = "";
      for (let i = 0; i < glob.length; i++) {
        const c = glob[i];
        if (c === "*") re += ".*";
        else if (c === "?") re += ".";
        else if (c === "[" && glob.indexOf("]", i + 2) > i) {
          const end = glob.indexOf("]", i + 2);
          let set = glob.slice(i + 1, end).replace(/\\/g, "\\\\");
          if (set[0] === "!") set = "^" + set.slice(1);
          re += "[" + set + "]"; i = end;
        } else re += c.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
      }
      return new RegExp("^" + re + "$", "s");
    }
    const nameRe = filters.name ? globRe(filters.name) : null;
    const matches = (r) => ["phase", "project", "backend"].every((k) => !filters[k] || filters[k] === r[k])
      && (!nameRe || nameRe.test(r.name))
      && (!filters.sweep || filters.sweep === r.sweep_id)
      && Object.entries(labels).every(([k, v]) => (r.labels || {})[k] === v);
    function link(href, text, cls) { const a = document.createElement("a"); a.href = href; a.textContent = text; if (cls) a.className = cls; return a; }
    follow(() => "/stream?after=" + cursor.seq, {
      run: (r) => {
        let row = document.getElementById("run-" + r.id);
        if (!row) {
          if (!firstPage || !matches(r)) return;
          const empty = table.querySelector("tr.empty"); if (empty) empty.remove();
          row = document.createElement("tr"); row.id = "run-" + r.id; row.dataset.run = r.id;
          const cells = ["mono", "phase", "reason", "", "", "", "exit", "time", "time started", "elapsed", "gpus", "usage", "time updated", "mono sweep", "labels"];
          for (const c of cells) { const td = document.createElement("td"); if (c) td.className = c; row.appendChild(td); }
          const a = document.createElement("a"); a.href = "/runs/" + r.id; a.textContent = r.id; row.cells[0].appendChild(a);
          row.cells[3].textContent = r.project; row.cells[4].textContent = r.name; row.cells[5].textContent = r.backend;
          row.cells[7].textContent = fmt(r.created_at);
          if (r.sweep_id) {
            row.cells[13].append(link("/?sweep=" + encodeURIComponent(r.sweep_id), r.sweep_id), " ", link("/sweeps/" + r.sweep_id, "\u25A6"));
          }
          for (const [k, v] of Object.entries(r.labels || {}).sort()) {
            row.cells[14].append(link("/?label=" + encodeURIComponent(k + "=" + v), k + "=" + v, "label"), " ");
          }
          table.tBodies[0].prepend(row);
        } else if (filters.phase && filters.phase !== r.phase) {
          row.remove(); return;
        }
        row.cells[1].replaceChildren(badge(r.phase));
        row.cells[2].textContent = r.reason || "";
        row.cells[6].textContent = r.exit_code === null ? "" : r.exit_code;
        row.cells[8].textContent = fmt(r.started_at);
        row.cells[9].dataset.started = r.started_at || ""; row.cells[9].dataset.ended = r.ended_at || "";
        tickElapsed(row.cells[9]);
        row.cells[10].textContent = (r.gpus || []).join(",");
        row.cells[11].textContent = r.usage && r.usage.max_rss_bytes ? size(r.usage.max_rss_bytes) : "";
        row.cells[12].textContent = fmt(r.updated_at);
        row.classList.remove("flash"); void row.offsetWidth; row.classList.add("flash");
      },
    });
    // Elapsed times tick while runs run.
    setInterval(() => { for (const el of table.querySelectorAll("td.elapsed")) if (!el.dataset.ended) tickElapsed(el); }, 1000);
  }

  // -- a sweep's results table ------------------------------------------------------
  const sweep = document.getElementById("sweep");
  if (sweep && sweep.dataset.live === "true") {
    const id = sweep.dataset.sweep;
    const columns = JSON.stringify(JSON.parse(sweep.dataset.columns || "[]"));
    const body = document.getElementById("results").tBodies[0];
    cursor.seq = Number(sweep.dataset.after || 0);
    follow(() => "/sweeps/" + id + "/stream?after=" + cursor.seq, {
      rows: (ev) => {
        // A new column (a first metric) or a new run: the table's shape changed.
        if (JSON.stringify(ev.columns) !== columns) { window.location.reload(); return; }
        for (const [run, html] of Object.entries(ev.rows)) {
          const old = document.getElementById("run-" + run);
          if (!old) { window.location.reload(); return; }
          const t = document.createElement("tbody"); t.innerHTML = html;
          const row = t.firstElementChild;
          old.replaceWith(row);
          row.classList.remove("flash"); void row.offsetWidth; row.classList.add("flash");
        }
        const t = document.createElement("dl"); t.innerHTML = ev.counts;
        document.getElementById("counts").replaceWith(t.firstElementChild);
        if (ev.done) {
          document.getElementById("sweep-state").firstChild.textContent = "Every run has ended. ";
          sweep.dataset.live = "false";
        }
      },
    });
  }

  // -- one run ------------------------------------------------------------------
  const run = document.getElementById("run");
  if (run && run.dataset.live === "true") {
    const id = run.dataset.run;
    cursor.seq = Number(run.dataset.after || 0);
    let line = Number(run.dataset.line || 0);
    const log = document.getElementById("log");
    const count = document.getElementById("linecount");
    let phase = document.getElementById("phase").textContent;
    function stick() { return log.scrollTop + log.clientHeight >= log.scrollHeight - 8; }
    follow(() => "/runs/" + id + "/stream?after=" + cursor.seq + "&line=" + line, {
      lines: (rows) => {
        const atBottom = stick();
        const frag = document.createDocumentFragment();
        for (const [n, stream, text] of rows) {
          if (n <= line) continue;            // already shown: never twice
          const span = document.createElement("span"); span.className = "ln " + stream; span.dataset.n = n;
          const i = document.createElement("i"); i.textContent = n; span.appendChild(i);
          span.appendChild(document.createTextNode(text + "\n"));
          frag.appendChild(span); line = n;
        }
        log.appendChild(frag);
        const none = document.getElementById("nolog"); if (none && line > 0) none.remove();
        if (count) count.textContent = line + " lines";
        if (atBottom) log.scrollTop = log.scrollHeight;
      },
      run: (r) => {
        document.getElementById("phase").replaceWith(Object.assign(badge(r.phase), { id: "phase" }));
        document.getElementById("reason").textContent = r.reason || "—";
        document.getElementById("message").textContent = r.message || "—";
        document.getElementById("exit").textContent = r.exit_code === null ? "—" : r.exit_code;
        document.getElementById("updated").textContent = fmt(r.updated_at) + " UTC";
        const el = document.getElementById("elapsed");
        if (el) { el.dataset.started = r.started_at || ""; el.dataset.ended = r.ended_at || ""; tick(); }
        const st = document.getElementById("started"); if (st && r.started_at) st.textContent = fmt(r.started_at) + " UTC";
        const en = document.getElementById("ended"); if (en && r.ended_at) en.textContent = fmt(r.ended_at) + " UTC";
        if (r.terminal) { const c = document.getElementById("cancel"); if (c) c.closest("form").remove(); }
        if (r.phase !== phase) {
          phase = r.phase;
          fetch("/runs/" + id + "/timeline", { credentials: "same-origin" })
            .then((resp) => resp.ok ? resp.text() : null)
            .then((html) => { if (html) { const t = document.createElement("div"); t.innerHTML = html; document.getElementById("timeline").replaceWith(t.firstElementChild); } });
        }
      },
    });
    log.scrollTop = log.scrollHeight;

    // The elapsed time ticks while the run runs.
    function tick() { tickElapsed(document.getElementById("elapsed")); }
    setInterval(tick, 1000);

    // "load earlier" without leaving the page.
    const earlier = document.getElementById("earlier");
    let first = Number(run.dataset.firstLine || 1);
    if (earlier) {
      earlier.addEventListener("click", (ev) => {
        ev.preventDefault();
        const from = Math.max(0, first - 1 - 1000);
        fetch("/runs/" + id + "/lines?after=" + from + "&limit=" + (first - 1 - from), { credentials: "same-origin" })
          .then((resp) => resp.json())
          .then((body) => {
            const frag = document.createDocumentFragment();
            for (const [n, stream, text] of body.lines) {
              const span = document.createElement("span"); span.className = "ln " + stream; span.dataset.n = n;
              const i = document.createElement("i"); i.textContent = n; span.appendChild(i);
              span.appendChild(document.createTextNode(text + "\n")); frag.appendChild(span);
            }
            const h = log.scrollHeight;
            log.prepend(frag); log.scrollTop += log.scrollHeight - h;
            first = from + 1;
            if (first <= 1) earlier.remove(); else earlier.href = "/runs/" + id + "?before_line=" + first;
          });
      });
    }
  }
})();
