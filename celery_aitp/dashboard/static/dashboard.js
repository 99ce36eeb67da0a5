/* celery_aitp dashboard: polls the page's /api endpoint and redraws in place.
 * Text goes in with textContent only (never innerHTML), so store values cannot inject markup. */
(function () {
  "use strict";
  var body = document.body, C = window.AitpCharts, fmt = C.fmt;
  var prefix = body.dataset.prefix || "", page = body.dataset.page, api = body.dataset.api;
  var refreshMs = parseInt(body.dataset.refreshMs, 10) || 2000;
  var COLORS = { routed: "#2e9e6e", fallback: "#9aa4b2", error: "#c8453b", miss: "#d08b16" };

  function $(id) { return document.getElementById(id); }
  function set(id, text) { var n = $(id); if (n) n.textContent = (text === null || text === undefined) ? "–" : String(text); }
  function pct(v) { return v === null || v === undefined ? "–" : (100 * v).toFixed(1) + "%"; }
  function secs(v) { return v === null || v === undefined ? "–" : fmt(v) + " s"; }
  function when(t) { return t ? new Date(t * 1000).toLocaleTimeString() : "–"; }
  function node(tag, attrs, children) {
    var n = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === "text") n.textContent = attrs[k];
      else if (k === "className") n.className = attrs[k];
      else n.setAttribute(k, attrs[k]);
    });
    (children || []).forEach(function (c) { n.appendChild(typeof c === "string" ? document.createTextNode(c) : c); });
    return n;
  }
  function badge(text, kind) { return node("span", { className: "badge " + (kind || ""), text: text }); }
  function cell(content, attrs) {
    var td = node("td", attrs || {});
    if (content instanceof Node) td.appendChild(content); else td.textContent = content === null || content === undefined ? "–" : String(content);
    return td;
  }
  function fill(tableId, rows) {
    var tbody = $(tableId).querySelector("tbody");
    while (tbody.firstChild) tbody.removeChild(tbody.firstChild);
    rows.forEach(function (r) { tbody.appendChild(r); });
  }
  function link(path, text) { return node("a", { href: prefix + path, text: text }); }
  /* A link out (Flower's page of a worker or task), when the API gives one. */
  function outLink(url, text, title) { return url ? node("a", { href: url, text: text, title: title, rel: "noopener", className: "out" }) : text; }

  function status(data) {
    var h = data && data.health, pill = $("status");
    if (!h) { pill.textContent = "live"; pill.className = "pill ok"; return; }
    var ok = h.store_ok && h.broker_ok;
    pill.textContent = ok ? "store and broker ok" : (!h.store_ok ? "store unreachable" : "broker unreachable");
    pill.className = "pill " + (ok ? "ok" : "bad");
  }

  /* --- pages ------------------------------------------------------------------------ */

  function overview(d) {
    var s = d.stage;
    set("stage-value", s.stage);
    set("stage-sub", (s.stage === "split" ? "split " + fmt(s.split.percent) + "% · " : "") +
      (s.changed_by ? "by " + s.changed_by + " at " + when(s.changed_at) : "from the policy"));
    set("rate-value", d.decisions_per_s === null ? "–" : fmt(d.decisions_per_s));
    var w = d.decisions.window;
    var t = d.decisions.total;
    set("routed-value", pct(w.total ? w.routed_share : t.routed_share));
    set("routed-sub", w.total ? w.total + " decisions in the window, " + w.fallback + " fell back"
      : t.total + " decisions in all, " + t.fallback + " fell back");
    set("workers-value", d.workers.alive);
    set("queued-value", d.queued);
    set("orphaned-sub", d.orphaned_queues.length ? d.orphaned_queues.length + " orphaned queue(s)!" : "no orphaned queue");
    set("model-value", d.model && d.model.loaded ? d.model.version : "cold start");
    set("model-sub", d.model && d.model.age_s !== null && d.model.age_s !== undefined ? "trained " + fmt(d.model.age_s) + " s ago" : "per-task estimates");
    C.line($("rate-chart"), d.rate_history);
    C.hbars($("sla-chart"), d.sla.map(function (r) {
      return { label: r.tier + " (≤ " + fmt(r.sla_s) + " s" + (r.wait_p95_s !== null && r.wait_p95_s !== undefined ? ", p95 wait " + fmt(r.wait_p95_s) + " s" : "") + (r.clock_skew ? ", " + r.clock_skew + " clock skew" : "") + ")", value: r.hit_rate === null ? 0 : r.hit_rate,
        color: r.hit_rate !== null && r.hit_rate < 0.95 ? COLORS.miss : COLORS.routed,
        title: r.tier + ": " + r.hits + " of " + r.n + " runs met the SLA" };
    }), { max: 1, format: pct, empty: "no runs in the window" });
    var windowed = {};
    w.reasons.forEach(function (r) { windowed[r.reason] = r; });
    var shown = w.total ? w : d.decisions.total;
    set("reasons-hint", w.total ? "last " + w.total + " decisions (window)" : "since the counters began (nothing new in the window)");
    C.hbars($("reasons-chart"), shown.reasons.map(function (r) {
      return { label: r.reason, value: r.share, color: r.routed ? COLORS.routed : (r.error ? COLORS.error : COLORS.fallback) };
    }), { max: 1, format: pct, empty: "no decisions yet" });
    fill("reasons-table", d.decisions.total.reasons.map(function (r) {
      var win = windowed[r.reason];
      return node("tr", { "data-reason": r.reason }, [cell(r.reason),
        cell(badge(r.routed ? "routed" : (r.error ? "error" : "fallback"), r.routed ? "ok" : (r.error ? "bad" : ""))),
        cell(win ? win.count : 0, { className: "num", "data-field": "count" }), cell(win ? pct(win.share) : "–", { className: "num" }),
        cell(r.count, { className: "num", "data-field": "total" })]);
    }));
  }

  function tenants(d) {
    set("fairness-value", d.fairness_index === null ? "–" : d.fairness_index.toFixed(3));
    set("entropy-value", d.priority_entropy === null ? "–" : d.priority_entropy.toFixed(2));
    set("entropy-sub", "0 = one tier for all, 1 = tiers used evenly" + (d.demoted.length ? "; demoted: " + d.demoted.join(", ") : ""));
    set("window-value", fmt(d.window_s) + " s");
    var rows = d.tenants.filter(function (t) { return t.known || t.runs; });
    C.groupedBars($("share-chart"), rows.map(function (t) { return t.tenant; }), [
      { name: "share of work", color: "#2f6fb2", values: rows.map(function (t) { return t.share; }) },
      { name: "fair share", color: "#9aa4b2", values: rows.map(function (t) { return t.fair_share; }) }
    ], { max: 1, format: pct });
    var groups = [], p50 = [], p95 = [];
    rows.forEach(function (t) { d.tiers.forEach(function (tier) {
      var s = t.wait[tier]; if (!s || !s.n) return;
      groups.push(t.tenant + "/" + tier); p50.push(s.p50); p95.push(s.p95);
    }); });
    C.groupedBars($("wait-chart"), groups, [{ name: "p50", color: "#2e9e6e", values: p50 },
      { name: "p95", color: "#d08b16", values: p95 }], { format: fmt, empty: "no runs in the window" });
    var head = $("tenants-table").querySelector("thead");
    while (head.firstChild) head.removeChild(head.firstChild);
    var cols = ["tenant", "weight", "max tier", "runs", "run time s", "share", "fair share"];
    d.tiers.forEach(function (t) { cols.push(t + " wait p50 / p95 s"); });
    head.appendChild(node("tr", {}, cols.map(function (c, i) { return node("th", { text: c, className: i > 2 ? "num" : "" }); })));
    fill("tenants-table", rows.map(function (t) {
      var cells = [cell(t.tenant), cell(t.weight), cell(t.max_tier),
        cell(t.runs, { className: "num", "data-field": "runs" }), cell(fmt(t.runtime_s), { className: "num" }),
        cell(pct(t.share), { className: "num", "data-field": "share" }),
        cell(t.fair_share === null ? "idle" : pct(t.fair_share), { className: "num", "data-field": "fair_share" })];
      d.tiers.forEach(function (tier) {
        var s = t.wait[tier];
        cells.push(cell(s && s.n ? fmt(s.p50) + " / " + fmt(s.p95) : "–", { className: "num" }));
      });
      return node("tr", { "data-tenant": t.tenant }, cells);
    }));
  }

  function queues(d) {
    set("total-value", d.total_depth);
    set("orphaned-value", d.orphaned.length);
    var def = d.queues.filter(function (q) { return q.kind === "default"; })[0];
    set("default-value", def ? def.depth : "–");
    set("default-sub", d.default_queue + (def && def.oldest_age_s !== null ? " · oldest " + fmt(def.oldest_age_s) + " s" : ""));
    var showIdle = $("show-idle").checked;
    var visible = d.queues.filter(function (q) { return showIdle || q.kind !== "tier" || q.live || q.depth; });
    C.hbars($("depth-chart"), visible.filter(function (q) { return q.depth || q.live || q.kind === "default"; }).map(function (q) {
      return { label: q.queue, value: q.depth || 0, color: q.orphaned ? COLORS.error : (q.kind === "default" ? "#7a8699" : "#2f6fb2"),
        title: q.queue + ": " + q.depth + " waiting" + (q.orphaned ? " (orphaned)" : "") };
    }), { labelWidth: 220, empty: "no queue has messages or consumers" });
    fill("queues-table", visible.map(function (q) {
      var state = q.kind === "default" ? badge("default", "info") : (q.orphaned ? badge("orphaned", "bad") : (q.spilling ? badge("spilling (" + fmt(q.spilling) + " waiting per slot)", "warn") : (q.live ? badge("served", "ok") : badge("no consumer"))));
      return node("tr", { "data-queue": q.queue, className: q.orphaned ? "orphaned" : (q.kind === "default" ? "default" : "") }, [
        cell(q.queue), cell(q.kind), cell(q.tenant), cell(q.accelerator), cell(q.tier),
        cell(q.depth, { className: "num", "data-field": "depth" }),
        cell(q.oldest_age_s === null ? "–" : fmt(q.oldest_age_s), { className: "num", "data-field": "age" }),
        cell(q.consumers.join(", ") || (q.kind === "default" ? "standard workers" : "none")), cell(state)]);
    }));
  }

  function workers(d) {
    var alive = d.workers.filter(function (w) { return w.alive; });
    set("alive-value", alive.length);
    set("alive-sub", d.workers.length + " known, advertisement TTL " + fmt(d.ttl_s) + " s");
    var classes = {};
    alive.forEach(function (w) { classes[w.accelerator] = (classes[w.accelerator] || 0) + 1; });
    set("classes-value", Object.keys(classes).sort().map(function (k) { return k + " × " + classes[k]; }).join(", ") || "none");
    set("ttl-hint", "seconds since the last advertisement; the marker is the TTL");
    C.hbars($("heartbeat-chart"), d.workers.map(function (w) {
      return { label: w.worker, value: w.heartbeat_age_s || 0, marker: d.ttl_s, color: w.alive ? COLORS.routed : COLORS.error };
    }), { labelWidth: 220, max: Math.max(d.ttl_s * 1.5, 1), format: function (v) { return fmt(v) + " s"; }, empty: "no AITP worker has advertised" });
    fill("workers-table", d.workers.map(function (w) {
      return node("tr", { "data-worker": w.worker, className: w.alive ? "" : "dead" }, [
        cell(outLink(w.flower_url, w.worker, "this worker in Flower"), { "data-field": "worker" }), cell(w.accelerator, { "data-field": "class" }), cell(w.tenants.join(", "), { "data-field": "tenants" }),
        cell(w.tiers.join(", "), { "data-field": "tiers" }), cell(w.queues.length, { className: "num" }),
        cell(w.default_queue ? "yes" : "no"), cell(fmt(w.heartbeat_age_s), { className: "num" }),
        cell(w.alive ? badge("live", "ok") : badge("expired", "bad"))]);
    }));
  }

  function predictions(d) {
    var m = d.model || {};
    set("model-value", m.loaded ? m.version : "cold start");
    set("model-sub", m.loaded ? (m.age_s !== null && m.age_s !== undefined ? "trained " + fmt(m.age_s) + " s ago" : "trained model") : "no trained model in the store");
    set("mae-value", d.overall ? secs(d.overall.mae_s) : "–");
    set("mae-sub", d.overall ? d.overall.n + " runs, mean relative error " + pct(d.overall.mre) : "no run with a prediction yet");
    set("without-value", d.runs_without_prediction);
    C.scatter($("scatter-chart"), d.points.map(function (p) {
      return { x: p.predicted_s, y: p.actual_s, group: p.task, label: p.task + ": predicted " + fmt(p.predicted_s) + " s, actual " + fmt(p.actual_s) + " s" };
    }), { xLabel: "predicted s", yLabel: "actual s", empty: "no run with a prediction in the window" });
    C.hbars($("error-chart"), d.by_task.map(function (t) {
      return { label: t.task, value: t.mae_s, color: t.bias_s < 0 ? COLORS.miss : "#2f6fb2",
        title: t.task + ": MAE " + fmt(t.mae_s) + " s over " + t.n + " runs (" + (t.bias_s < 0 ? "under" : "over") + "-predicts)" };
    }), { labelWidth: 220, format: function (v) { return fmt(v) + " s"; } });
    fill("errors-table", d.by_task.map(function (t) {
      return node("tr", { "data-task": t.task }, [cell(t.task), cell(t.n, { className: "num", "data-field": "n" }),
        cell(fmt(t.mean_predicted_s), { className: "num" }), cell(fmt(t.mean_actual_s), { className: "num" }),
        cell(fmt(t.mae_s), { className: "num", "data-field": "mae" }), cell(pct(t.mre), { className: "num" }),
        cell(fmt(t.bias_s), { className: "num" })]);
    }));
  }

  function tasks(d) {
    var counts = {};
    d.tasks.forEach(function (t) { var k = t.tier || "none"; counts[k] = (counts[k] || 0) + 1; });
    C.hbars($("tier-chart"), Object.keys(counts).sort().map(function (k) {
      return { label: "tier " + k, value: counts[k] };
    }), { empty: "no decisions recorded yet" });
    fill("tasks-table", d.tasks.map(function (t) {
      return node("tr", { "data-task-id": t.task_id }, [cell(when(t.decided_at)), cell(link("/tasks/" + encodeURIComponent(t.task_id), t.task_id)),
        cell(t.task), cell(t.tenant), cell(t.tier), cell(t.accelerator), cell(t.queue),
        cell(t.routed ? badge("routed", "ok") : badge("fallback")), cell(t.reason)]);
    }));
  }

  function task(d) {
    var dec = d.decision || {}, run = d.run || {}, p = d.prediction;
    set("outcome-value", dec.routed ? "routed" : (d.decision ? "fallback" : "–"));
    set("outcome-sub", (dec.reason || "") + (dec.queue ? " · " + dec.queue : ""));
    set("tier-value", dec.tier || d.sla.tier);
    set("tier-sub", (dec.tenant ? "tenant " + dec.tenant : "") + (dec.accelerator ? " · " + dec.accelerator : ""));
    set("predicted-value", secs(p.predicted_runtime_s));
    set("predicted-sub", (p.source ? "source " + p.source : "no prediction source recorded") +
      (p.predicted_p90_s !== null ? " · p90 " + fmt(p.predicted_p90_s) + " s" : ""));
    set("wait-value", secs(run.wait_s));
    set("wait-sub", d.sla.sla_s !== null ? "SLA " + fmt(d.sla.sla_s) + " s: " + (d.sla.clock_skew ? "unknown (clock skew)" : d.sla.met === null ? "not run yet" : (d.sla.met ? "met" : "missed")) : "");
    var flower = $("flower-link");
    if (flower && d.flower_url) { flower.href = d.flower_url; $("flower-row").hidden = false; }
    set("score-hint", d.score !== null ? "score " + fmt(d.score) + (d.tier_story ? " · " + d.tier_story : "") : "");
    C.hbars($("factors-chart"), d.factors.map(function (f) {
      var c = f.contribution !== null ? f.contribution : f.value;
      return { label: f.factor, value: Math.abs(c), color: c < 0 ? COLORS.error : "#2f6fb2",
        title: f.factor + ": value " + fmt(f.value) + " × weight " + fmt(f.weight) + " → " + fmt(c) };
    }), { empty: "no priority factors recorded (declared tier only)" });
    C.hbars($("runtime-chart"), [{ label: "predicted", value: p.predicted_runtime_s || 0, color: "#2f6fb2" },
      { label: "actual", value: p.actual_runtime_s || 0, color: "#2e9e6e" }].filter(function (r) { return r.value; }),
      { format: function (v) { return fmt(v) + " s"; }, empty: "not predicted or not run yet" });
    var rows = [];
    Object.keys(d.decision || {}).forEach(function (k) { rows.push([k, d.decision[k]]); });
    if (d.profile) rows.push(["profile", JSON.stringify(d.profile)]);
    d.factors.forEach(function (f) { rows.push(["factor " + f.factor, fmt(f.value) + " × " + fmt(f.weight) + " = " + fmt(f.contribution)]); });
    if (d.tier_story) rows.push(["tier steps", d.tier_story]);
    if (d.note) rows.push(["note", d.note]);
    Object.keys(d.run || {}).forEach(function (k) { rows.push(["run " + k, run[k]]); });
    fill("decision-table", rows.map(function (r) {
      return node("tr", { "data-key": r[0] }, [node("th", { text: r[0] }), cell(typeof r[1] === "object" && r[1] !== null ? JSON.stringify(r[1]) : r[1])]);
    }));
  }

  var formReady = false;
  function stage(d) {
    set("stage-value", d.stage);
    set("stage-sub", d.stored ? "set in the store" : "from the policy (never changed)");
    set("split-value", fmt(d.split.percent) + "%");
    set("split-sub", ["tenants", "tasks", "tiers"].map(function (k) { return k + ": " + (d.split[k].length ? d.split[k].join(", ") : "all"); }).join(" · "));
    fill("history-table", d.history.map(function (h) {
      var from = h.old ? h.old.stage + (h.old.stage === "split" ? " " + fmt((h.old.split || {}).percent) + "%" : "") : "–";
      var to = h["new"] ? h["new"].stage + (h["new"].stage === "split" ? " " + fmt((h["new"].split || {}).percent) + "%" : "") : "–";
      return node("tr", {}, [cell(when(h.at)), cell(h.who), cell(from), cell(to)]);
    }));
    var form = $("stage-form");
    if (form && !formReady) {
      formReady = true;
      form.querySelector("input[value='" + d.stage + "']").checked = true;
      $("split-percent").value = d.split.percent;
      $("split-tenants").value = d.split.tenants.join(", ");
      $("split-tasks").value = d.split.tasks.join(", ");
      $("split-tiers").value = d.split.tiers.join(", ");
      $("split-uncertainty").value = d.split.max_uncertainty === null ? "" : d.split.max_uncertainty;
    }
  }

  function list(id) { return $(id).value.split(",").map(function (s) { return s.trim(); }).filter(Boolean); }

  function submitStage(ev) {
    ev.preventDefault();
    var chosen = document.querySelector("#stage-form input[name=stage]:checked");
    var result = $("stage-result"), button = $("stage-submit");
    var unc = $("split-uncertainty").value;
    var doc = { stage: chosen ? chosen.value : "", split: { percent: parseFloat($("split-percent").value || "0"),
      tenants: list("split-tenants"), tasks: list("split-tasks"), tiers: list("split-tiers"),
      max_uncertainty: unc === "" ? null : parseFloat(unc) } };
    button.disabled = true;
    fetch(prefix + "/api/stage", { method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-AITP-CSRF": body.dataset.csrf }, body: JSON.stringify(doc) })
      .then(function (r) { return r.json().then(function (j) { return { ok: r.ok, body: j }; }); })
      .then(function (r) {
        result.className = r.ok ? "ok" : "bad";
        result.textContent = r.ok ? "applied: " + r.body.stage.stage : r.body.error;
        formReady = false;
        poll();
      })
      .catch(function (e) { result.className = "bad"; result.textContent = String(e); })
      .then(function () { button.disabled = false; });
  }

  var RENDER = { overview: overview, tenants: tenants, queues: queues, workers: workers,
    predictions: predictions, tasks: tasks, task: task, stage: stage };
  var last = null;

  function poll() {
    return fetch(prefix + "/api/" + api, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.json().then(function (j) { return { ok: r.ok, status: r.status, body: j }; }); })
      .then(function (r) {
        var banner = $("error");
        if (!r.ok && !(page === "task" && r.status === 404)) throw new Error(r.body.error || ("HTTP " + r.status));
        if (page === "task" && !r.body.found) { banner.hidden = false; banner.textContent = "No decision or run recorded for this task id (yet)."; }
        else banner.hidden = true;
        last = r.body;
        RENDER[page](r.body);
        status(r.body);
        set("updated", new Date().toLocaleTimeString());
        body.dataset.loaded = String((parseInt(body.dataset.loaded || "0", 10)) + 1);
      })
      .catch(function (e) {
        var banner = $("error");
        banner.hidden = false;
        banner.textContent = "Could not refresh: " + e.message;
        $("status").className = "pill bad";
        $("status").textContent = "dashboard unreachable";
      });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var form = $("stage-form");
    if (form) form.addEventListener("submit", submitStage);
    var search = $("task-search");
    if (search) search.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var id = $("task-id-input").value.trim();
      if (id) window.location.href = prefix + "/tasks/" + encodeURIComponent(id);
    });
    var idle = $("show-idle");
    if (idle) idle.addEventListener("change", function () { if (last) queues(last); });
    poll();
    setInterval(poll, refreshMs);
  });
})();
