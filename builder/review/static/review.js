// CheXpercept review page: one annotator's cases, decisions saved at once.
// Every decision goes first into localStorage, under a key of its own (so two tabs never overwrite
// each other's), then to the server, which appends it to the annotator's JSON-lines file and fsyncs
// before answering; only then is its key removed. One tab at a time sends (a Web Lock), oldest first,
// so the last decision made wins even across tabs. A closed tab or a server restart therefore loses
// nothing: pending decisions are sent on the next load, by whichever tab is open. A decision the server
// refuses is kept and shown as not saved until the case is decided again; "all decisions saved" is
// shown only when the server has confirmed every one.
"use strict";

(function () {
  const parts = location.pathname.split("/").filter(Boolean);
  const annotator = decodeURIComponent(parts[1] || "");
  const base = "/annotate/" + encodeURIComponent(annotator) + "/";
  const store = "chexpercept-review:" + location.host + ":" + annotator;
  const pendingPrefix = store + ":pending:";   // + client_id -> a decision not confirmed yet
  const refusedPrefix = store + ":refused:";   // + client_id -> {rec, error}: refused by the server
  const legacyKey = store + ":pending";        // the earlier page's single array, moved on load
  const lockName = store + ":send";
  const $ = (id) => document.getElementById(id);
  let cases = [];
  let decisions = {};      // key_id -> {decision, note, time}
  let limits = { note: 10000, body: 65536 };
  let index = 0;
  let memory = {};         // client_id -> rec, when localStorage could not take it
  let retryTimer = null;
  let authProblem = "";
  let storageProblem = "";
  let flushQueued = false;
  let zoom = 1;
  let noteAtOpen = "";
  let lastTime = 0;

  // ------------------------------------------------------------------------------ pending decisions
  function storedUnder(prefix) {
    const out = [];
    for (let i = 0; i < localStorage.length; i++) {
      const k = localStorage.key(i);
      if (k && k.startsWith(prefix)) {
        try { out.push(JSON.parse(localStorage.getItem(k))); } catch (e) { /* not ours */ }
      }
    }
    return out;
  }
  function byTime(a, b) { return (a.client_time - b.client_time) || (a.client_id < b.client_id ? -1 : 1); }
  function pendingRecords() {
    const seen = new Set();
    const all = [];
    for (const r of [...storedUnder(pendingPrefix), ...Object.values(memory)]) {
      if (r && r.client_id && !seen.has(r.client_id)) { seen.add(r.client_id); all.push(r); }
    }
    return all.sort(byTime);
  }
  function refusedRecords() { return storedUnder(refusedPrefix).filter((x) => x && x.rec); }
  function keep(key, value) {
    try { localStorage.setItem(key, JSON.stringify(value)); storageProblem = ""; return true; }
    catch (e) { storageProblem = "the browser cannot keep decisions (" + e.name + "): do not close this tab"; return false; }
  }
  function addPending(rec) { if (!keep(pendingPrefix + rec.client_id, rec)) memory[rec.client_id] = rec; }
  function removePending(id) { localStorage.removeItem(pendingPrefix + id); delete memory[id]; }
  function moveLegacy() {
    let old = null;
    try { old = JSON.parse(localStorage.getItem(legacyKey) || "null"); } catch (e) { old = null; }
    if (!Array.isArray(old)) return;
    old.forEach((rec, i) => {
      if (rec && rec.key_id) {
        rec.client_id = rec.client_id || newId();
        rec.client_time = rec.client_time || i;
        addPending(rec);
      }
    });
    localStorage.removeItem(legacyKey);
  }
  function newId() {
    const a = new Uint32Array(4);
    crypto.getRandomValues(a);
    return Array.from(a, (x) => x.toString(16).padStart(8, "0")).join("");
  }
  function now() { lastTime = Math.max(Date.now(), lastTime + 1); return lastTime; }
  function noteLength(text) { return Array.from(text).length; }  // code points, as the server counts

  // ----------------------------------------------------------------------------------------- status
  function plural(n, word) { return n + " " + word + (n === 1 ? "" : "s"); }
  function allSaved() { return !pendingRecords().length && !refusedRecords().length; }
  function status() {
    const el = $("save-status");
    const pending = pendingRecords().length;
    const refused = refusedRecords();
    const notes = [];
    if (refused.length) {
      notes.push(plural(refused.length, "decision") + " not saved: refused by the server (" +
        refused[refused.length - 1].error + "); decide again");
    }
    if (authProblem) notes.push(plural(pending, "decision") + " not saved yet: " + authProblem);
    else if (pending && retryTimer) notes.push(pending + " not saved yet (retrying)");
    if (storageProblem) notes.push(storageProblem);
    if (notes.length) { el.textContent = notes.join("; "); el.className = "failed"; }
    else if (pending) { el.textContent = "saving " + pending + "..."; el.className = "pending"; }
    else { el.textContent = "all decisions saved"; el.className = "saved"; }
    const decided = cases.filter((c) => decisions[c.key_id] && decisions[c.key_id].decision !== "skip").length;
    $("progress").textContent = decided + " of " + cases.length + " decided";
    $("done").hidden = !(allSaved() && cases.length &&
      cases.every((c) => decisions[c.key_id] && decisions[c.key_id].decision !== "skip"));
    showDecision();
  }
  function showDecision() {
    if (!cases.length) return;
    const c = cases[index];
    const d = decisions[c.key_id];
    const refused = refusedRecords().filter((x) => x.rec.key_id === c.key_id);
    const pending = pendingRecords().some((r) => r.key_id === c.key_id);
    let text = d ? d.decision : "none";
    if (refused.length) text += " (not saved: refused)";
    else if (pending) text += " (not saved yet)";
    $("current-decision").textContent = text;
    $("current-decision").dataset.decision = d ? d.decision : "";
  }

  // ------------------------------------------------------------------------------------ sending
  function scheduleRetry(ms) {
    if (!retryTimer) retryTimer = setTimeout(() => { retryTimer = null; flush(); }, ms);
  }
  async function send(rec) {
    // "ok", "refused" (with the server's reason), "auth" or "retry"
    let r;
    try {
      r = await fetch(base + "api/decision", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(rec),
        credentials: "same-origin",
      });
    } catch (e) { return ["retry", String(e)]; }
    const body = await r.json().catch(() => ({}));
    if (r.ok && body.ok) return ["ok", ""];
    if (r.status === 401) return ["auth", body.error || "not signed in"];
    if (r.status >= 400 && r.status < 500 && r.status !== 408 && r.status !== 429) {
      return ["refused", body.error || ("HTTP " + r.status)];
    }
    return ["retry", body.error || ("HTTP " + r.status)];
  }
  async function flushLocked() {
    for (;;) {
      const rec = pendingRecords()[0];
      if (!rec) break;
      const [outcome, reason] = await send(rec);
      if (outcome === "ok") {
        authProblem = "";
        removePending(rec.client_id);
      } else if (outcome === "refused") {
        keep(refusedPrefix + rec.client_id, { rec: rec, error: reason });
        removePending(rec.client_id);
      } else {
        authProblem = outcome === "auth" ? reason : "";
        scheduleRetry(outcome === "auth" ? 5000 : 2000);
        break;
      }
      status();
    }
    status();
  }
  function flush() {
    if (flushQueued) return;
    flushQueued = true;
    const run = async () => { flushQueued = false; await flushLocked(); };
    if (navigator.locks) navigator.locks.request(lockName, run);  // one sending tab at a time
    else run();
  }

  // ---------------------------------------------------------------------------------- decisions
  function noteCheck() {
    const n = noteLength($("note").value);
    const over = n > limits.note;
    $("note-count").textContent = n.toLocaleString("en-US") + " / " + limits.note.toLocaleString("en-US") + " characters";
    $("note-count").className = over ? "over" : "";
    $("note-error").hidden = !over;
    $("note-error").textContent = over
      ? "The note is " + (n - limits.note).toLocaleString("en-US") + " characters too long: shorten it to decide (nothing is cut)."
      : "";
    return !over;
  }
  function record(decision, note) {
    const c = cases[index];
    const rec = { key_id: c.key_id, decision: decision, note: note, client_id: newId(), client_time: now() };
    for (const x of refusedRecords()) {
      if (x.rec.key_id === c.key_id) localStorage.removeItem(refusedPrefix + x.rec.client_id);
    }
    decisions[c.key_id] = { decision: decision, note: note, time: rec.client_time };
    addPending(rec);
    noteAtOpen = note;
    status();
    flush();
  }
  function keepNote() {
    // a note edited on a decided case is saved with that case's decision when leaving it
    if (!cases.length) return true;
    const c = cases[index];
    const note = $("note").value;
    const d = decisions[c.key_id];
    if (!d || note === noteAtOpen) return true;
    if (!noteCheck()) return false;
    record(d.decision, note);
    return true;
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
    cxr.src = base + "image/" + key + "/cxr";
    if (c.has_overlay) $("overlay").src = base + "image/" + key + "/overlay";
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
    $("note").value = d ? d.note || "" : "";
    noteAtOpen = $("note").value;
    noteCheck();
    document.body.dataset.key = c.key_id;
    applyView();
    status();
  }

  function go(i) { if (keepNote()) show(i); else $("note").focus(); }
  function decide(decision) {
    if (!cases.length) return;
    if (!noteCheck()) { $("note").focus(); return; }  // never cut a note, never drop the decision silently
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
  $("note").addEventListener("input", noteCheck);
  $("note").addEventListener("blur", keepNote);
  window.addEventListener("beforeunload", (ev) => {
    if (!allSaved()) { ev.preventDefault(); ev.returnValue = ""; }
  });
  window.addEventListener("online", flush);
  // another tab of this annotator decided, or its decision was confirmed: show it, and help send
  window.addEventListener("storage", (ev) => {
    if (!ev.key || !ev.key.startsWith(store)) return;
    if (ev.newValue && ev.key.startsWith(pendingPrefix)) {
      try {
        const rec = JSON.parse(ev.newValue);
        const d = decisions[rec.key_id];
        if (!d || !(d.time > rec.client_time)) {
          decisions[rec.key_id] = { decision: rec.decision, note: rec.note, time: rec.client_time };
        }
      } catch (e) { /* not ours */ }
      flush();
    }
    status();
  });

  async function start() {
    $("who").textContent = "\u00b7 annotator " + annotator;
    document.title = "CheXpercept review \u00b7 " + annotator;
    moveLegacy();
    let data;
    try {
      const r = await fetch(base + "api/cases", { cache: "no-store", credentials: "same-origin" });
      if (!r.ok) {
        const body = await r.json().catch(() => ({}));
        throw new Error(body.error || ("HTTP " + r.status));
      }
      data = await r.json();
    } catch (e) {
      $("load-error").textContent = "cannot load the cases (" + e.message + "); is chexpercept review running?";
      $("load-error").hidden = false;
      return;
    }
    cases = data.cases;
    limits = data.limits || limits;
    decisions = data.decisions || {};
    for (const p of pendingRecords()) {  // not saved yet: the newest wins
      decisions[p.key_id] = { decision: p.decision, note: p.note, time: p.client_time };
    }
    $("banner").hidden = !data.synthetic;
    let first = cases.findIndex((c) => !decisions[c.key_id]);
    if (first < 0) first = cases.findIndex((c) => decisions[c.key_id].decision === "skip");
    show(first < 0 ? 0 : first);
    document.body.dataset.ready = "1";
    flush();
  }
  start();
})();
