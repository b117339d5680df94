/* CheXpercept report: tabs and the case viewer. Self-contained, no network, works from file://.
 *
 * Data arrive as scripts: data/index.js calls CHX.index({...}); data/cases/<file>.js calls
 * CHX.case(key, {...}) and is loaded only when that case is opened. Every text from the data is
 * inserted with textContent, never as HTML.
 */
(function () {
  "use strict";

  var PAGE = 100; // cases listed per "show more"
  var state = { run: null, cmp: "", lesion: "", path: "", fail: "", caseKey: null, shown: PAGE };
  var index = null;
  var cases = {}; // key -> payload
  var pending = {}; // key -> [callbacks]

  function $(id) { return document.getElementById(id); }

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (k) {
        if (k === "text") node.textContent = attrs[k];
        else if (k === "cls") node.className = attrs[k];
        else node.setAttribute(k, attrs[k]);
      });
    }
    (children || []).forEach(function (c) { if (c) node.appendChild(c); });
    return node;
  }

  function runById(id) {
    for (var i = 0; i < index.runs.length; i++) if (index.runs[i].id === id) return index.runs[i];
    return null;
  }

  function failLabel(f) {
    if (f === null || f === undefined) return "not run";
    if (f === 0) return "passed all";
    return "fails at S" + f;
  }

  /* ---------------------------------------------------------------- tabs */
  function showTab(name) {
    var tabs = document.querySelectorAll("[data-tab]");
    for (var i = 0; i < tabs.length; i++) {
      var t = tabs[i];
      var on = t.getAttribute("data-tab") === name;
      t.classList.toggle("active", on);
      var panel = $("tab-" + t.getAttribute("data-tab"));
      if (panel) panel.hidden = !on;
    }
  }

  /* --------------------------------------------------------------- state */
  function readHash() {
    var h = window.location.hash.replace(/^#/, "");
    if (!h) return;
    h.split("&").forEach(function (kv) {
      var i = kv.indexOf("=");
      if (i < 0) return;
      var k = decodeURIComponent(kv.slice(0, i)), v = decodeURIComponent(kv.slice(i + 1));
      if (k === "case") state.caseKey = v;
      else if (k in state) state[k] = v;
    });
  }

  function writeHash() {
    var parts = ["run", "cmp", "lesion", "path", "fail"].map(function (k) {
      return k + "=" + encodeURIComponent(state[k] || "");
    });
    if (state.caseKey) parts.push("case=" + encodeURIComponent(state.caseKey));
    var h = "#" + parts.join("&");
    if (window.location.hash !== h) history.replaceState(null, "", h);
  }

  /* ------------------------------------------------------------- filters */
  function fillSelect(id, options, value) {
    var s = $(id);
    s.textContent = "";
    options.forEach(function (o) {
      var opt = el("option", { value: o[0], text: o[1] });
      s.appendChild(opt);
    });
    s.value = value;
    if (s.value !== value && options.length) s.value = options[0][0];
    return s.value;
  }

  function buildFilters() {
    var runs = index.runs.map(function (r) { return [r.id, r.label]; });
    state.run = fillSelect("f-run", runs, state.run || (runs.length ? runs[0][0] : ""));
    fillCompare();
    state.lesion = fillSelect("f-lesion", [["", "all lesions"]].concat(index.lesions.map(function (l) { return [l, l]; })), state.lesion);
    state.path = fillSelect("f-path", [["", "all paths"]].concat(index.paths.map(function (p) { return [p, p]; })), state.path);
    var fails = [["", "any"], ["0", "passed all stages"]];
    [1, 2, 3, 4].forEach(function (k) { fails.push([String(k), "Stage " + k + " (" + index.stages[k] + ")"]); });
    state.fail = fillSelect("f-fail", fails, state.fail);
    ["f-run", "f-cmp", "f-lesion", "f-path", "f-fail"].forEach(function (id) {
      $(id).addEventListener("change", onFilter);
    });
    $("more").addEventListener("click", function () { state.shown += PAGE; renderList(); });
  }

  function fillCompare() {
    var opts = [["", "no comparison"]];
    index.runs.forEach(function (r) { if (r.id !== state.run) opts.push([r.id, r.label]); });
    state.cmp = fillSelect("f-cmp", opts, state.cmp === state.run ? "" : state.cmp);
  }

  function onFilter(ev) {
    var id = ev.target.id;
    var key = { "f-run": "run", "f-cmp": "cmp", "f-lesion": "lesion", "f-path": "path", "f-fail": "fail" }[id];
    state[key] = ev.target.value;
    if (key === "run") fillCompare();
    state.shown = PAGE;
    renderList();
    if (state.caseKey) openCase(state.caseKey);
    writeHash();
  }

  function matches() {
    var out = [];
    var fails = index.fail[state.run] || [];
    for (var i = 0; i < index.cases.length; i++) {
      var c = index.cases[i];
      if (state.lesion && c[1] !== state.lesion) continue;
      if (state.path && c[2] !== state.path) continue;
      var f = fails[i];
      if (state.fail !== "" && (f === null || f === undefined || String(f) !== state.fail)) continue;
      out.push(i);
    }
    return out;
  }

  /* ---------------------------------------------------------------- list */
  function renderList() {
    var list = $("case-list");
    list.textContent = "";
    var idx = matches();
    $("case-count").textContent = idx.length + " of " + index.cases.length + " cases";
    var fails = index.fail[state.run] || [];
    idx.slice(0, state.shown).forEach(function (i) {
      var c = index.cases[i];
      var f = fails[i];
      var item = el("li", { cls: "case-item" + (c[0] === state.caseKey ? " selected" : ""), "data-key": c[0] }, [
        el("span", { cls: "case-key", text: c[0] }),
        el("span", { cls: "tag", text: c[1] }),
        el("span", { cls: "tag path-" + c[2], text: c[2] }),
        el("span", { cls: "fail " + (f === 0 ? "ok" : (f ? "bad" : "na")), text: failLabel(f) })
      ]);
      item.addEventListener("click", function () { openCase(c[0]); writeHash(); });
      list.appendChild(item);
    });
    $("more").hidden = idx.length <= state.shown;
    if (!idx.length) list.appendChild(el("li", { cls: "empty", text: "No case matches these filters." }));
  }

  /* -------------------------------------------------------------- loading */
  function loadCase(key, file, cb) {
    if (cases[key]) { cb(cases[key]); return; }
    if (pending[key]) { pending[key].push(cb); return; }
    pending[key] = [cb];
    var s = document.createElement("script");
    s.src = "data/cases/" + file;
    s.onerror = function () {
      delete pending[key];
      $("case-detail").textContent = "Could not load " + s.src + " (is the report folder complete?)";
    };
    document.head.appendChild(s);
  }

  function fileOf(key) {
    for (var i = 0; i < index.cases.length; i++) if (index.cases[i][0] === key) return index.cases[i][3];
    return null;
  }

  function openCase(key) {
    var file = fileOf(key);
    if (!file) return;
    state.caseKey = key;
    var items = document.querySelectorAll(".case-item");
    for (var i = 0; i < items.length; i++) items[i].classList.toggle("selected", items[i].getAttribute("data-key") === key);
    loadCase(key, file, renderCase);
  }

  /* --------------------------------------------------------------- detail */
  function optionText(q, i) {
    if (q.options && i >= 1 && i <= q.options.length) return i + " (" + q.options[i - 1] + ")";
    return String(i);
  }

  function answerText(q, idx) {
    if (!idx || !idx.length || (idx.length === 1 && idx[0] === -1)) return "nothing readable";
    return idx.map(function (i) { return optionText(q, i); }).join(", ");
  }

  function imageStrip(images) {
    if (!images || !images.length) return null;
    var strip = el("div", { cls: "images" });
    images.forEach(function (im) {
      var name = im.name.split("/").pop();
      if (im.src) {
        var img = el("img", { src: im.src, alt: name, title: im.name, loading: "lazy" });
        strip.appendChild(el("a", { href: im.src, target: "_blank", rel: "noopener", cls: "thumb" }, [img, el("span", { text: name })]));
      } else {
        strip.appendChild(el("div", { cls: "thumb missing", title: im.name }, [el("span", { text: name + " (not on this disk)" })]));
      }
    });
    return strip;
  }

  function answerCard(q, run, t) {
    var card = el("div", { cls: "answer" });
    card.appendChild(el("div", { cls: "run-label", text: run.label }));
    if (!t) {
      card.appendChild(el("div", { cls: "na", text: "not asked in this run" }));
      return card;
    }
    card.classList.add(t.correct ? "correct" : "wrong");
    card.appendChild(el("div", { cls: "verdict", text: t.correct ? "\u2713 correct" : "\u2717 wrong" }));
    if (t.oracle_text) card.appendChild(el("div", { cls: "oracle" }, [el("b", { text: "Oracle text shown before this question: " }), el("span", { text: t.oracle_text })]));
    if (t.user_text) card.appendChild(el("details", { cls: "user-text" }, [el("summary", { text: "Text this model saw" }), el("pre", { text: t.user_text })]));
    card.appendChild(el("div", { cls: "label", text: "Raw answer" }));
    card.appendChild(el("pre", { cls: "raw", text: t.response === null || t.response === undefined ? "(no response)" : t.response }));
    card.appendChild(el("div", { cls: "parsed" }, [el("b", { text: "Read as: " }), el("span", { text: answerText(q, t.parsed) + "  [" + t.status + "]" })]));
    if (t.error) card.appendChild(el("div", { cls: "error" }, [el("b", { text: "Backend error: " }), el("span", { text: t.error })]));
    if (t.patched_to) card.appendChild(el("div", { cls: "patched" }, [el("b", { text: "History patched to: " }), el("span", { text: t.patched_to })]));
    return card;
  }

  function renderCase(data) {
    cases[data.key] = data;
    if (data.key !== state.caseKey) return;
    var box = $("case-detail");
    box.textContent = "";
    var shown = [state.run].concat(state.cmp ? [state.cmp] : []).map(runById).filter(Boolean);
    box.classList.toggle("side-by-side", shown.length > 1);
    var head = el("div", { cls: "case-head" }, [
      el("h3", { text: data.key }),
      el("span", { cls: "tag", text: data.lesion }),
      el("span", { cls: "tag path-" + data.path, text: data.path })
    ]);
    shown.forEach(function (r) {
      var rr = data.runs[r.id];
      head.appendChild(el("span", { cls: "fail " + (rr && rr.first_fail === 0 ? "ok" : (rr ? "bad" : "na")), text: r.label + ": " + failLabel(rr ? rr.first_fail : null) }));
    });
    box.appendChild(head);
    data.turns.forEach(function (q, n) {
      var turn = el("section", { cls: "turn" });
      turn.appendChild(el("h4", { text: "Turn " + (n + 1) + " \u00b7 Stage " + q.stage + " \u00b7 " + q.task.replace("_", " ") }));
      turn.appendChild(el("pre", { cls: "question", text: q.text }));
      var strip = imageStrip(q.images);
      if (strip) turn.appendChild(strip);
      var gold = answerText(q, q.gold) + (q.gold_text && (!q.options || !q.options.length) ? " (" + q.gold_text + ")" : "");
      turn.appendChild(el("div", { cls: "gold" }, [el("b", { text: "Gold: " }), el("span", { text: gold })]));
      var answers = el("div", { cls: "answers cols-" + shown.length });
      shown.forEach(function (r) {
        var rr = data.runs[r.id];
        answers.appendChild(answerCard(q, r, rr ? rr.turns[q.task] : null));
      });
      turn.appendChild(answers);
      box.appendChild(turn);
    });
  }

  /* ----------------------------------------------------------------- boot */
  window.CHX = {
    index: function (data) { index = data; },
    case: function (key, data) {
      cases[key] = data;
      var cbs = pending[key] || [];
      delete pending[key];
      cbs.forEach(function (cb) { cb(data); });
    }
  };

  document.addEventListener("DOMContentLoaded", function () {
    var tabs = document.querySelectorAll("[data-tab]");
    for (var i = 0; i < tabs.length; i++) {
      tabs[i].addEventListener("click", function (ev) { ev.preventDefault(); showTab(this.getAttribute("data-tab")); });
    }
    if (!index) { showTab("summary"); return; }
    readHash();
    buildFilters();
    renderList();
    if (state.caseKey) { showTab("cases"); openCase(state.caseKey); } else showTab("summary");
    writeHash();
    window.addEventListener("hashchange", function () {
      state.caseKey = null;
      readHash();
      state.run = fillSelect("f-run", index.runs.map(function (r) { return [r.id, r.label]; }), state.run);
      fillCompare();
      ["lesion", "path", "fail"].forEach(function (k) { $("f-" + k).value = state[k]; state[k] = $("f-" + k).value; });
      state.shown = PAGE;
      renderList();
      if (state.caseKey) { showTab("cases"); openCase(state.caseKey); }
    });
  });
})();
