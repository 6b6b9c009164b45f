#include "master/http/status_page.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace eps {
namespace {

std::string EscapeHtml(absl::string_view text) {
  return absl::StrReplaceAll(text, {{"&", "&amp;"},
                                    {"<", "&lt;"},
                                    {">", "&gt;"},
                                    {"\"", "&quot;"},
                                    {"'", "&#39;"}});
}

constexpr absl::string_view kHead = R"html(<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>eps: )html";

constexpr absl::string_view kBody = R"html(</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; margin: 0 0 .3em; }
h2 { font-size: 1.1em; margin: 1.2em 0 .4em; }
.state { display: inline-block; padding: .1em .6em; border-radius: .8em; color: #fff; background: #888; }
.state.running { background: #2a7de1; } .state.finished { background: #2e9e4f; }
.state.failed { background: #c93c3c; }
.bar { height: .8em; background: #e4e4e4; border-radius: .4em; overflow: hidden; max-width: 40em; }
.bar > div { height: 100%; background: #2a7de1; width: 0; }
.kv { display: flex; flex-wrap: wrap; gap: .4em 2em; margin: .6em 0; }
.kv span b { font-variant-numeric: tabular-nums; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { padding: .2em .8em; border-bottom: 1px solid #ddd; text-align: right; }
th:first-child, td:first-child { text-align: left; }
td.alive { color: #2e9e4f; } td.dead, td.fenced { color: #c93c3c; } td.left { color: #888; }
#error { color: #c93c3c; white-space: pre-wrap; }
canvas { border: 1px solid #ddd; max-width: 100%; }
.legend span { margin-right: 1.5em; } .loss { color: #d9480f; } .rate { color: #2a7de1; }
</style></head>
<body data-rendered="0">
<h1>eps job <span id="job"></span> <span id="state" class="state">loading</span></h1>
<div id="error"></div>
<div class="bar"><div id="progress"></div></div>
<div class="kv" id="summary"></div>
<h2>Loss and throughput</h2>
<div class="legend"><span class="loss">&#9644; train loss (epoch so far)</span><span class="rate">&#9644; records/s</span></div>
<canvas id="chart" width="900" height="260" data-points="0"></canvas>
<h2>Workers</h2><table id="workers"></table>
<h2>Servers</h2><table id="servers"></table>
<h2>Checkpoints, recovery and partition moves</h2><div class="kv" id="checkpoints"></div>
<div id="autoscale-section"><h2>Autoscaler</h2><div class="kv" id="autoscale"></div></div>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
function text(value) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "number") {
    if (Number.isInteger(value)) return value.toLocaleString("en-US");
    return Math.abs(value) >= 100 ? value.toFixed(0) : value.toPrecision(4);
  }
  return String(value);
}
function duration(seconds) {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) return "?";
  seconds = Math.round(seconds);
  const h = Math.floor(seconds / 3600), m = Math.floor(seconds / 60) % 60, s = seconds % 60;
  return (h ? h + "h" : "") + (h || m ? m + "m" : "") + s + "s";
}
function cell(row, value, cls) {
  const td = row.insertCell();
  td.textContent = text(value);
  if (cls) td.className = cls;
}
function table(element, headers, rows) {
  element.replaceChildren();
  const head = element.createTHead().insertRow();
  for (const h of headers) {
    const th = document.createElement("th");
    th.textContent = h;
    head.appendChild(th);
  }
  const body = element.createTBody();
  for (const values of rows) {
    const row = body.insertRow();
    values.forEach((v, i) => cell(row, v, headers[i] === "state" ? String(v) : ""));
  }
}
function pairs(element, entries) {
  element.replaceChildren();
  for (const [key, value] of entries) {
    const span = document.createElement("span");
    span.append(key + ": ");
    const b = document.createElement("b");
    b.textContent = value;
    span.appendChild(b);
    element.appendChild(span);
  }
}
function plot(history) {
  const canvas = $("chart"), ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 60;
  ctx.clearRect(0, 0, w, h);
  canvas.dataset.points = String(history.length);
  ctx.fillStyle = "#888";
  ctx.font = "12px sans-serif";
  if (history.length < 2) {
    ctx.fillText("waiting for progress samples (one per job.progress_interval_s)", pad, h / 2);
    return;
  }
  const t0 = history[0].elapsed_s, t1 = history[history.length - 1].elapsed_s;
  const x = (t) => pad + (w - 2 * pad) * (t - t0) / Math.max(1e-9, t1 - t0);
  const series = (key, color, side) => {
    const points = history.filter((p) => typeof p[key] === "number");
    if (!points.length) return;
    let lo = Math.min(...points.map((p) => p[key])), hi = Math.max(...points.map((p) => p[key]));
    if (key === "records_per_s") lo = 0;
    if (hi - lo < 1e-12) { hi += 1; lo -= key === "records_per_s" ? 0 : 1; }
    const y = (v) => h - pad + (2 * pad - h) * (v - lo) / (hi - lo);
    ctx.strokeStyle = color;
    ctx.lineWidth = 2;
    ctx.beginPath();
    points.forEach((p, i) => (i ? ctx.lineTo : ctx.moveTo).call(ctx, x(p.elapsed_s), y(p[key])));
    ctx.stroke();
    ctx.fillStyle = color;
    ctx.textAlign = side === "left" ? "right" : "left";
    const at = side === "left" ? pad - 4 : w - pad + 4;
    ctx.fillText(text(hi), at, pad);
    ctx.fillText(text(lo), at, h - pad);
  };
  ctx.strokeStyle = "#ccc";
  ctx.strokeRect(pad, pad, w - 2 * pad, h - 2 * pad);
  series("train_loss", "#d9480f", "left");
  series("records_per_s", "#2a7de1", "right");
  ctx.fillStyle = "#888";
  ctx.textAlign = "center";
  ctx.fillText(duration(t0) + " … " + duration(t1) + " since the master started", w / 2, h - 12);
}
function render(s) {
  $("job").textContent = s.job;
  $("state").textContent = s.state + (s.phase !== s.state ? " · " + s.phase : "");
  $("state").className = "state " + s.state;
  const last = s.history && s.history.length ? s.history[s.history.length - 1] : null;
  const fraction = s.state === "finished" ? 1 : last ? last.pass_fraction : 0;
  $("progress").style.width = (100 * fraction).toFixed(1) + "%";
  const m = s.metrics || {};
  pairs($("summary"), [
    ["epoch", s.epoch + "/" + s.epochs],
    ["pass", (100 * fraction).toFixed(1) + "%"],
    ["shards todo/doing/done", s.shards.todo + "/" + s.shards.doing + "/" + s.shards.done],
    ["records trained", text(s.records_trained)],
    ["records/s", text(s.records_per_s)],
    ["ETA", duration(s.eta_s)],
    ["loss (epoch so far)", text(m.epoch_loss_so_far)],
    ["train loss (last epoch)", text(m.train_loss)],
    ["eval AUC", text(m.eval_auc)],
    ["eval log loss", text(m.eval_logloss)],
    ["elapsed", duration(s.elapsed_s)],
  ]);
  $("error").textContent = s.error ? "job: " + s.error : "";
  table($("workers"), ["worker", "state", "host", "pid", "device", "records", "records/s"],
        (s.workers || []).map((w) => [w.id, w.state, w.host, w.pid ? String(w.pid) : "–", w.device, w.records,
                                      w.records_per_s]));
  table($("servers"), ["server", "state", "endpoint", "partitions", "rows", "rows on disk",
                       "hit rate"],
        (s.servers || []).map((v) => [v.id, v.state, v.endpoint, v.partitions, v.rows,
                                      v.rows_on_disk, v.hit_rate]));
  const c = s.checkpoints || {}, r = s.recovery || {};
  const entries = [["written", text(c.written)], ["failed", text(c.failed)],
                   ["workers paused", text(c.pause_s) + " s"],
                   ["last", c.last ? "#" + c.last.checkpoint + ", " + text(c.last.bytes) +
                                     " bytes, pause " + text(c.last.pause_ms) + " ms" : "–"],
                   ["recoveries", text(r.recoveries)]];
  const mv = s.moves || {};
  entries.push(["partition moves",
                text(mv.done) + " done, " + text(mv.failed) + " failed, " + text(mv.queued) +
                    " queued; " + text(mv.rows) + " rows, longest unavailable " +
                    text(mv.longest_unavailable_ms) + " ms"]);
  if (mv.in_progress) {
    const p = mv.in_progress;
    entries.push(["moving", "partition " + p.partition + ": ps[" + p.from + "] to ps[" + p.to +
                            "], " + p.step]);
  }
  if (mv.last_error) entries.push(["last move error", mv.last_error]);
  if (r.in_progress) {
    entries.push(["recovering", r.in_progress.reason + " (waiting for servers: " +
                                (r.in_progress.waiting_for_servers || []).join(", ") + ")"]);
  }
  pairs($("checkpoints"), entries);
  // With no autoscaler /status says {"source": "none"}: the section says off.
  const a = s.autoscale || {source: "none"};
  if (a.source === "none") {
    pairs($("autoscale"), [["autoscaler", "off (autoscale.source = none)"]]);
  } else {
    const d = a.last_decision || {};
    pairs($("autoscale"), [
      ["source · launcher", a.source + " · " + a.launcher],
      ["free GPUs", a.signal_error ? "no signal: " + a.signal_error : text(a.free_gpus)],
      ["others' pending GPUs", text(a.pending_gpus)],
      ["workers target/launched", text(a.target_workers) + "/" + text(a.live_workers) +
                                  " (" + text(a.min_workers) + " to " + text(a.max_workers) + ")"],
      ["replaced", text((a.fleet || {}).restarts)],
      ["last decision", d.action ? d.action + ": " + (d.rule || "") : "none yet"],
    ]);
  }
  plot(s.history || []);
  document.body.dataset.rendered = String(Number(document.body.dataset.rendered) + 1);
}
function fail(message) {
  $("error").textContent = message;
  document.body.dataset.error = message;
}
window.addEventListener("error", (e) => fail("script error: " + e.message));
async function refresh() {
  try {
    const response = await fetch("/status", {cache: "no-store"});
    if (!response.ok) throw new Error("GET /status: HTTP " + response.status);
    render(await response.json());
  } catch (e) {
    fail("cannot reach the master: " + e.message);
  }
  setTimeout(refresh, 2000);
}
refresh();
</script>
</body></html>
)html";

}  // namespace

std::string StatusPage(absl::string_view job_name) {
  return absl::StrCat(kHead, EscapeHtml(job_name), kBody);
}

}  // namespace eps
