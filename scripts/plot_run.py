#!/usr/bin/python3
"""Plots an eps job from its master's events log: one PNG.

    scripts/plot_run.py DATA_DIR [--out FILE.png]

DATA_DIR is the master's --data-dir (it holds events.jsonl). Three panels
over the job's time: the train loss (the current epoch's mean so far, from
the master's progress samples, and each finished epoch's), the eval AUC,
and records/s with the number of live workers (and, with the autoscaler,
its target and the free GPUs at each decision). Membership changes and
failures are marked on every panel: workers joining, leaving and dying,
servers dying, recoveries, checkpoints and master restarts. Writes
DATA_DIR/run.png unless --out says otherwise, and prints the path.

Uses Debian's python3-matplotlib (run it with /usr/bin/python3).
"""

import argparse
import json
import os
import sys

# Event name -> (label, colour, line style, line width).
MARKS = {
    "worker_joined": ("worker joined", "#2e9e4f", ":", 1.0),
    "worker_left": ("worker left", "#888888", ":", 1.0),
    "worker_dead": ("worker died", "#c93c3c", "-", 1.2),
    "server_dead": ("server died", "#8b0000", "--", 2.0),
    "recovered": ("recovered from a checkpoint", "#e8590c", "-", 2.0),
    "master_resumed": ("master restarted", "#7048e8", "-.", 1.5),
    "job_resuming": ("job resumed", "#7048e8", "-.", 1.5),
    "checkpoint_failed": ("checkpoint failed", "#f08c00", ":", 1.5),
    "scale_up": ("autoscaler grew", "#1c7ed6", "-", 1.5),
    "scale_down": ("autoscaler shrank", "#862e9c", "-", 1.5),
    "worker_replaced": ("worker replaced", "#c2255c", "--", 1.2),
    "server_joined": ("server joined", "#0b7285", "-", 1.5),
    "server_drained": ("server drained", "#495057", "-", 1.5),
    "partition_move_failed": ("partition move failed", "#e67700", ":", 1.2),
}


def read_events(path):
    events = []
    with open(path, encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, 1):
            line = line.strip()
            if not line:
                continue
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError as error:
                print(f"plot_run.py: {path}:{number}: skipping a line that is not JSON ({error})",
                      file=sys.stderr)
    return [e for e in events if isinstance(e.get("time"), (int, float))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", help="the master's --data-dir (holds events.jsonl)")
    parser.add_argument("--out", help="PNG to write (default DATA_DIR/run.png)")
    args = parser.parse_args()
    events_path = os.path.join(args.data_dir, "events.jsonl")
    if not os.path.isfile(events_path):
        print(f"plot_run.py: no {events_path}: is {args.data_dir} a master's --data-dir?",
              file=sys.stderr)
        return 2
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_run.py: needs matplotlib: apt-get install python3-matplotlib, and run it "
              "with /usr/bin/python3", file=sys.stderr)
        return 1
    events = read_events(events_path)
    if not events:
        print(f"plot_run.py: {events_path} holds no events yet", file=sys.stderr)
        return 2
    start = min(e["time"] for e in events)
    t = lambda e: e["time"] - start
    progress = [e for e in events if e["event"] == "progress"]
    job = next((e.get("job") for e in events if e["event"] == "job_started"), None)

    figure, (loss_ax, auc_ax, rate_ax) = plt.subplots(
        3, 1, figsize=(11, 9), sharex=True, gridspec_kw={"height_ratios": [3, 2, 3]})
    figure.suptitle(f"eps job {job or os.path.basename(os.path.abspath(args.data_dir))}")

    running = [(t(e), e["train_loss"]) for e in progress if e.get("train_loss") is not None]
    if running:
        loss_ax.plot(*zip(*running), color="#d9480f", label="epoch so far")
    finished = [(t(e), e["train_loss"]) for e in events
                if e["event"] == "epoch_finished" and e.get("train_loss") is not None]
    if finished:
        loss_ax.plot(*zip(*finished), "o", color="#862e9c", label="finished epoch")
    loss_ax.set_ylabel("train loss")
    if running or finished:
        loss_ax.legend(loc="upper right", fontsize=8)

    aucs = [(t(e), e["eval_auc"]) for e in events
            if e["event"] == "evaluation_finished" and e.get("eval_auc") is not None]
    if aucs:
        auc_ax.plot(*zip(*aucs), "D", color="#2e9e4f")
        for x, y in aucs:
            auc_ax.annotate(f"{y:.4f}", (x, y), textcoords="offset points", xytext=(-8, 6),
                            ha="right", fontsize=9)
    else:
        auc_ax.text(0.5, 0.5, "no evaluation yet", transform=auc_ax.transAxes, ha="center",
                    color="#888888")
    auc_ax.set_ylabel("eval AUC")

    if progress:
        rate_ax.plot([t(e) for e in progress], [e.get("records_per_s", 0) for e in progress],
                     color="#2a7de1", label="records/s")
        workers_ax = rate_ax.twinx()
        workers_ax.step([t(e) for e in progress], [e.get("workers", 0) for e in progress],
                        where="post", color="#495057", alpha=0.6, label="live workers")
        # The autoscaler's decisions against the worker count: the target
        # it set, and the free GPUs it read then.
        decisions = [e for e in events if e["event"] in ("scale_up", "scale_down")]
        if decisions:
            times = [t(e) for e in decisions] + [t(progress[-1])]
            targets = [e["target"] for e in decisions]
            workers_ax.step(times, targets + targets[-1:], where="post", color="#1c7ed6",
                            linestyle="--", label="autoscaler target")
            workers_ax.plot(times[:-1], [e.get("free_gpus", 0) for e in decisions], "^",
                            color="#2b8a3e", label="free GPUs (at a decision)")
        workers_ax.set_ylabel("live workers" + (", GPUs" if decisions else ""))
        workers_ax.set_ylim(bottom=0)
        workers_ax.yaxis.get_major_locator().set_params(integer=True)
    rate_ax.set_ylabel("records/s")
    rate_ax.set_ylim(bottom=0)
    rate_ax.set_xlabel("seconds since the job started")

    labelled = set()
    for event in events:
        mark = MARKS.get(event["event"])
        if mark is None:
            continue
        label, color, style, width = mark
        for ax in (loss_ax, auc_ax, rate_ax):
            ax.axvline(t(event), color=color, linestyle=style, linewidth=width, alpha=0.8,
                       label=None if label in labelled or ax is not rate_ax else label)
        labelled.add(label)
    checkpoints = [t(e) for e in events if e["event"] == "checkpoint"]
    if checkpoints:
        rate_ax.plot(checkpoints, [0] * len(checkpoints), "|", color="#1864ab", markersize=12,
                     label="checkpoint")
    handles, labels = rate_ax.get_legend_handles_labels()
    if progress:
        more_handles, more_labels = workers_ax.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    if handles:
        rate_ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.25),
                       ncol=4, fontsize=8, frameon=False)
    for ax in (loss_ax, auc_ax, rate_ax):
        ax.grid(alpha=0.3)
    figure.tight_layout()
    out = args.out or os.path.join(args.data_dir, "run.png")
    figure.savefig(out, dpi=100)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
