#!/usr/bin/python3
"""Plots of ddp-bench's JSON files and of a step timeline (Chrome trace), as PNG.

  bench/plot.py collective OUT.png A.json [B.json ...]   busbw against size, one line per file
                                                          (labelled by the options its command does
                                                          not share with the others'), each with its
                                                          baseline dashed; every command below
  bench/plot.py step OUT.png STEP.json                    each configuration's step, split into
                                                          compute, wait for reductions, update
                                                          and the rest, per world size
  bench/plot.py trace OUT.png TRACE.json                  per step of rank 0: the reduction time,
                                                          and the part of it that ran while
                                                          backward computed

Needs matplotlib (Debian: python3-matplotlib). scripts/results.sh runs them all for docs/results.md.
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def caption(doc):
    return f"{doc['command']}\n{doc['date']}, {doc['machine']['cpu']}, {doc['machine']['cores']} threads"


def options(command):
    """A ddp-bench command's options as "flag value" groups, without the program and --out."""
    words = command.split()[1:]
    groups, i = [], 0
    while i < len(words):
        if words[i].startswith("-") and i + 1 < len(words) and not words[i + 1].startswith("-"):
            groups.append(f"{words[i]} {words[i + 1]}")
            i += 2
        else:
            groups.append(words[i])
            i += 1
    return [g for g in groups if not g.startswith("--out ")]


def distinguishing_labels(docs, paths):
    """Each file's label: the options of its command that not every file's command has (the
    backend, --bind 1, -n 20, ...); the file's name where the commands do not differ."""
    groups = [options(d["command"]) for d in docs]
    common = set.intersection(*(set(g) for g in groups))
    labels = [" ".join(g for g in gs if g not in common) for gs in groups]
    if len(docs) == 1:
        labels = [docs[0]["title"].split(";")[0]]
    return [lab if lab and labels.count(lab) == 1 else os.path.basename(p) for lab, p in zip(labels, paths)]


def shorten(text, limit=60):
    """text up to its first parenthesis, cut at a word boundary when still over limit."""
    text = text.split(" (")[0].strip()
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0] + " ..."


def collective(out, files):
    fig, ax = plt.subplots(figsize=(10, 5))
    docs = []
    for path in files:
        with open(path) as f:
            docs.append(json.load(f))
    for doc, label in zip(docs, distinguishing_labels(docs, files)):
        rows = doc["rows"]
        # Broadcast has only the in-place form.
        key = "oop_busbw" if any(isinstance(r["oop_busbw"], (int, float)) for r in rows) else "ip_busbw"
        sizes = [r["size(B)"] for r in rows]
        line, = ax.plot(sizes, [r[key] for r in rows], marker="o", label=f"ddp: {label}")
        base = doc["notes"][0].split(";")[0].removeprefix("base: ")
        ax.plot(sizes, [r["base_bw"] for r in rows], linestyle="--", color=line.get_color(),
                label=f"baseline of {label}: {shorten(base)}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("GB/s (busbw; baseline bandwidth dashed)")
    ax.grid(True, which="both", alpha=0.3)
    # Beside the axes, where it covers no line.
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    collectives = sorted({d["title"].split(" on ")[0] for d in docs})
    ax.set_title(f"{', '.join(collectives)}: busbw against size", fontsize=9)
    # Every file's command, date and machine, under the plot.
    fig.text(0.01, -0.01, "\n".join(caption(d).replace("\n", "; ") for d in docs), fontsize=6, va="top",
             ha="left", family="monospace")
    fig.tight_layout()
    fig.savefig(out, dpi=110, bbox_inches="tight")


def step(out, path):
    with open(path) as f:
        doc = json.load(f)
    rows = [r for r in doc["rows"] if r["slot"] != "no sync"]
    worlds = sorted({r["ranks"] for r in doc["rows"]})
    fig, axes = plt.subplots(1, len(worlds), figsize=(6 * len(worlds), 5), sharey=True, squeeze=False)
    for ax, world in zip(axes[0], worlds):
        these = [r for r in rows if r["ranks"] == world]
        names = [f"{r['slot']}\n{r['policy']}" for r in these]
        compute = [r["compute(ms)"] for r in these]
        wait = [r["wait(ms)"] for r in these]
        update = [r["update(ms)"] for r in these]
        rest = [max(0.0, r["step(ms)"] - c - w - u) for r, c, w, u in zip(these, compute, wait, update)]
        x = range(len(these))
        bottom = [0.0] * len(these)
        for values, label in ((compute, "compute"), (wait, "wait for reductions"), (update, "update"), (rest, "rest")):
            ax.bar(x, values, bottom=bottom, label=label)
            bottom = [b + v for b, v in zip(bottom, values)]
        no_sync = [r for r in doc["rows"] if r["ranks"] == world and r["slot"] == "no sync"]
        if no_sync:
            ax.axhline(no_sync[0]["step(ms)"], color="black", linestyle="--", label="the same step by hand, no ddp")
        ax.set_xticks(list(x), names, rotation=60, ha="right", fontsize=7)
        ax.set_title(f"{world} rank(s)")
        ax.set_ylabel("ms per step")
        ax.legend(fontsize=7)
    fig.suptitle(caption(doc), fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def trace(out, path):
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e["ph"] == "X" and e["pid"] == 0]
    steps = {}
    for e in events:
        s = steps.setdefault(e["args"]["step"], {"backward": [], "reductions": []})
        if e["tid"] == 0 and e["name"] == "backward":
            s["backward"].append((e["ts"], e["ts"] + e["dur"]))
        if e["tid"] == 1:
            s["reductions"].append((e["ts"], e["ts"] + e["dur"]))
    xs, total, overlapped = [], [], []
    for n in sorted(steps):
        s = steps[n]
        if not s["reductions"]:
            continue
        xs.append(n)
        total.append(sum(b - a for a, b in s["reductions"]) / 1e3)
        both = 0.0
        for a, b in s["reductions"]:
            for c, d in s["backward"]:
                both += max(0.0, min(b, d) - max(a, c))
        overlapped.append(both / 1e3)
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot(xs, total, linewidth=0.8, label="reductions (ms)")
    ax.plot(xs, overlapped, linewidth=0.8, label="of which while backward ran (ms)")
    ax.set_xlabel("step")
    ax.set_ylabel("ms")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    share = sum(overlapped) / sum(total) if total else 0.0
    ax.set_title(f"{os.path.basename(path)}: rank 0, {len(xs)} steps, {100 * share:.0f}% of the reduction time overlapped backward",
                 fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv):
    if len(argv) < 4 or argv[1] not in ("collective", "step", "trace"):
        sys.exit(__doc__)
    kind, out, inputs = argv[1], argv[2], argv[3:]
    if kind == "collective":
        collective(out, inputs)
    elif kind == "step":
        step(out, inputs[0])
    else:
        trace(out, inputs[0])
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv)
