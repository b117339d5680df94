// CheXpercept review page: one annotator's cases, decisions saved at once.
// Every decision goes first into localStorage (pending), then to the server, which appends it to the
// annotator's JSON-lines file and fsyncs before answering; only then does it leave the pending list.
// A closed tab or a server restart therefore loses nothing: pending decisions are sent on the next load.
"use strict";

(function () {
  const parts = location.pathname.split("/").filter(Boolean);
  const annotator = decodeURIComponent(parts[1] || "");
  const pendingKey = "chexpercept-review:" + location.host + ":" + annotator + ":pending";
  const $ = (id) => document.getElementById(id);
  let cases = [];
  let decisions = {};
  let index = 0;
  let pending = [];
  let sending = false;
  let retryTimer = null;
  let zoom = 1;
  let noteAtOpen = "";

  function loadPending() {
    try { pending = JSON.parse(localStorage.getItem(pendingKey) || "[]"); } catch (e) { pending = []; }
  }
  function savePending() {
    localStorage.setItem(pendingKey, JSON.stringify(pending));
  }
  function newId() {
    const a = new Uint32Array(4);
    crypto.getRandomValues(a);
    return Array.from(a, (x) => x.toString(16).padStart(8, "0")).join("");
  }

  function status() {
    const el = $("save-status");
    if (pending.length === 0) { el.textContent = "all decisions saved"; el.className = "saved"; }
    else if (retryTimer) { el.textContent = pending.length + " not saved yet (retrying)"; el.className = "failed"; }
    else { el.textContent = "saving " + pending.length + "..."; el.className = "pending"; }
    const decided = cases.filter((c) => decisions[c.key_id] && decisions[c.key_id].decision !== "skip").length;
    $("progress").textContent = decided + " of " + cases.length + " decided";
    $("done").hidden = !(cases.length && cases.every((c) => decisions[c.key_id] && decisions[c.key_id].decision !== "skip"));
  }

  async function flush() {
    if (sending) return;
    sending = true;
    try {
      while (pending.length) {
        const rec = pending[0];
        let ok = false;
        try {
          const r = await fetch("/api/" + encodeURIComponent(annotator) + "/decision", {
            method: "POST",
            headers: { "Content-Type": "application/json" },
            body: JSON.stringify(rec),
          });
          if (r.status === 400) {  // the server will never take it (not this annotator's case): drop, say so
            const body = await r.json().catch(() => ({}));
            $("load-error").textContent = "decision not accepted by the server: " + (body.error || r.status);
            $("load-error").hidden = false;
            ok = true;
          } else {
            ok = r.ok;
          }
        } catch (e) { ok = false; }
        if (!ok) {
          if (!retryTimer) retryTimer = setTimeout(() => { retryTimer = null; flush(); }, 2000);
          status();
          return;
        }
        pending.shift();
        savePending();
        status();
      }
    } finally {
      sending = false;
    }
    status();
  }

  function record(decision, note) {
    const c = cases[index];
    const rec = { key_id: c.key_id, decision: decision, note: note, client_id: newId() };
    decisions[c.key_id] = { decision: decision, note: note };
    pending.push(rec);
    savePending();
    noteAtOpen = note;
    status();
    flush();
  }

  function keepNote() {
    // a note edited on a decided case is saved with that case's decision when leaving it
    if (!cases.length) return;
    const c = cases[index];
    const note = $("note").value;
    const d = decisions[c.key_id];
    if (d && note !== noteAtOpen) record(d.decision, note);
  }

  function applyView() {
    $("overlay").style.opacity = String($("opacity").value / 100);
    $("overlay").hidden = !$("show-mask").checked || !(cases[index] && cases[index].has_overlay);
    $("stage").style.height = (zoom * 100) + "%";
    $("zoom-level").textContent = Math.round(zoom * 100) + "%";
  }

  function show(i) {
    if (!cases.length) return;
    index = Math.max(0, Math.min(cases.length - 1, i));
    const c = cases[index];
    const key = encodeURIComponent(c.key_id);
    const cxr = $("cxr");
    cxr.onload = () => { $("stage").style.aspectRatio = cxr.naturalWidth + " / " + cxr.naturalHeight; };
    cxr.src = "/image/" + key + "/cxr";
    if (c.has_overlay) $("overlay").src = "/image/" + key + "/overlay";
    else $("overlay").removeAttribute("src");
    $("case-index").textContent = "Case " + (index + 1) + " / " + cases.length + " \u00b7 " + c.key_id;
    $("lesion").textContent = c.lesion;
    $("question").textContent = c.positive
      ? "Is the red lesion mask optimal for this " + c.lesion + "?"
      : "Is this image truly free of " + c.lesion + "?";
    $("sentence").textContent = c.sentence || "(none)";
    $("instruction").textContent = c.instruction || "";
    $("location").textContent = c.location && c.location.length ? "[" + c.location.join(", ") + "]" : "";
    $("section").textContent = c.section || "";
    const d = decisions[c.key_id];
    $("current-decision").textContent = d ? d.decision : "none";
    $("current-decision").dataset.decision = d ? d.decision : "";
    $("note").value = d ? d.note || "" : "";
    noteAtOpen = $("note").value;
    document.body.dataset.key = c.key_id;
    applyView();
    status();
  }

  function go(i) { keepNote(); show(i); }
  function decide(decision) {
    if (!cases.length) return;
    record(decision, $("note").value);
    $("note").blur();
    show(index + 1 < cases.length ? index + 1 : index);
  }
  function nextOpen() {
    for (let k = 1; k <= cases.length; k++) {
      const j = (index + k) % cases.length;
      const d = decisions[cases[j].key_id];
      if (!d || d.decision === "skip") { go(j); return; }
    }
  }
  function setZoom(z) { zoom = Math.max(1, Math.min(8, z)); applyView(); }
  function setOpacity(delta) {
    const el = $("opacity");
    el.value = String(Math.max(0, Math.min(100, Number(el.value) + delta)));
    applyView();
  }

  document.addEventListener("keydown", (ev) => {
    const t = ev.target;
    const typing = t && (t.tagName === "TEXTAREA" || (t.tagName === "INPUT" && t.type === "text"));
    if (typing) {
      if (ev.key === "Escape") { t.blur(); ev.preventDefault(); }
      return;
    }
    if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const k = ev.key;
    const actions = {
      a: () => decide("accept"), r: () => decide("reject"), s: () => decide("skip"),
      ArrowRight: () => go(index + 1), ArrowLeft: () => go(index - 1), u: nextOpen,
      m: () => { $("show-mask").checked = !$("show-mask").checked; applyView(); },
      "[": () => setOpacity(-10), "]": () => setOpacity(10),
      "+": () => setZoom(zoom * 1.5), "=": () => setZoom(zoom * 1.5), "-": () => setZoom(zoom / 1.5),
      "0": () => setZoom(1), n: () => $("note").focus(),
      "?": () => { $("help").open = !$("help").open; },
    };
    const f = actions[k.length === 1 ? k.toLowerCase() : k];
    if (f) { ev.preventDefault(); f(); }
  });

  $("accept").addEventListener("click", () => decide("accept"));
  $("reject").addEventListener("click", () => decide("reject"));
  $("skip").addEventListener("click", () => decide("skip"));
  $("prev").addEventListener("click", () => go(index - 1));
  $("next").addEventListener("click", () => go(index + 1));
  $("next-open").addEventListener("click", nextOpen);
  $("show-mask").addEventListener("change", applyView);
  $("opacity").addEventListener("input", applyView);
  $("zoom-in").addEventListener("click", () => setZoom(zoom * 1.5));
  $("zoom-out").addEventListener("click", () => setZoom(zoom / 1.5));
  $("zoom-reset").addEventListener("click", () => setZoom(1));
  $("note").addEventListener("blur", keepNote);
  window.addEventListener("beforeunload", (ev) => {
    if (pending.length) { ev.preventDefault(); ev.returnValue = ""; }
  });
  window.addEventListener("online", flush);

  async function start() {
    $("who").textContent = "\u00b7 annotator " + annotator;
    document.title = "CheXpercept review \u00b7 " + annotator;
    loadPending();
    let data;
    try {
      const r = await fetch("/api/" + encodeURIComponent(annotator) + "/cases", { cache: "no-store" });
      if (!r.ok) throw new Error("HTTP " + r.status);
      data = await r.json();
    } catch (e) {
      $("load-error").textContent = "cannot load the cases (" + e.message + "); is chexpercept review running?";
      $("load-error").hidden = false;
      return;
    }
    cases = data.cases;
    decisions = data.decisions || {};
    for (const p of pending) decisions[p.key_id] = { decision: p.decision, note: p.note };  // not saved yet
    $("banner").hidden = !data.synthetic;
    let first = cases.findIndex((c) => !decisions[c.key_id]);
    if (first < 0) first = cases.findIndex((c) => decisions[c.key_id].decision === "skip");
    show(first < 0 ? 0 : first);
    document.body.dataset.ready = "1";
    flush();
  }
  start();
})();
