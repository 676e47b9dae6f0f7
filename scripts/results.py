#!/usr/bin/python3
"""The measurements of docs/results.md, and the page itself (Debian's python3, standard library only).

  scripts/results.py measure DIR NAME KIND [--exit N] -- COMMAND...
      runs COMMAND, and writes DIR/NAME.json: what the command measured (KIND says how to read it:
      bench, a ddp-bench subcommand that wrote DIR/NAME.json itself with --out; example, the
      Fashion-MNIST example's output; torch, bench/torch_vs_pytorch.sh's table; kernels, Google
      Benchmark's JSON in DIR/NAME.json; timed, only how long it took), with the command line, the
      date, the machine (hardware threads, CPU model) and the load average before and after it.
      A command that exits otherwise than N (default 0) fails the measurement.
  scripts/results.py skip DIR NAME REASON
      records that NAME was not measured in this run, and why (the page says so).
  scripts/results.py test-times DIR FILE
      DIR/test_command.json from the stage times scripts/test.sh wrote to FILE (BUILD/test-times.txt).
  scripts/results.py render TEMPLATE DIR PAGE
      fills TEMPLATE's {{NAME}} placeholders from DIR's files and writes PAGE.
  scripts/results.py check PAGE [ROOT]
      the page parses: every section has a table or says what was not measured, every table has
      its command line before it, no placeholder is left, every image it shows exists; with ROOT,
      every link from ROOT's docs/ and README.md into results.md names a heading of the page.

scripts/results.sh runs them in order; see there.
"""
import datetime
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import time

# ---------------------------------------------------------------------------------------------
# measure


def machine():
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"threads": os.cpu_count(), "cpu": model}


def load1():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return None


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_example(text):
    """The example's epoch lines and summary."""
    epochs = []
    for m in re.finditer(r"^epoch (\d+)/\d+: train loss ([\d.]+), train accuracy ([\d.]+)%, test accuracy ([\d.]+)%"
                         r".*?([\d.]+) s, (\d+) samples/s$", text, re.M):
        epochs.append({"epoch": int(m[1]), "train_loss": float(m[2]), "train_accuracy": float(m[3]),
                       "test_accuracy": float(m[4]), "seconds": float(m[5]), "samples/s": int(m[6])})
    summary = {}
    for key, pattern in (("test_accuracy", r"test accuracy\s+([\d.]+)%"),
                         ("training_s", r"training time\s+([\d.]+) s"),
                         ("wall_s", r"\(wall ([\d.]+) s"),
                         ("samples/s", r"throughput\s+(\d+) samples/s")):
        m = re.search(r"^  " + pattern, text, re.M)
        if m:
            summary[key] = float(m[1])
    m = re.search(r"^  policies\s+(.*)$", text, re.M)
    if m:
        summary["policies"] = m[1].strip()
    m = re.search(r"^  memory\s+([\d.]+) MiB on rank 0 between steps.*?(?:, ([\d.]+) MiB at most in a step)?$", text, re.M)
    if m:
        summary["memory_mib"] = float(m[1])
        if m[2]:
            summary["memory_peak_mib"] = float(m[2])
    if not epochs or "test_accuracy" not in summary:
        raise ValueError("no epoch line or summary in the example's output")
    return {"epochs": epochs, "summary": summary}


def parse_torch(text):
    rows = []
    for m in re.finditer(r"^(\S.*?)\s{2,}(\d+)\s+([\d.]+%|-)\s*$", text, re.M):
        rows.append({"setup": m[1].strip(), "samples/s": int(m[2]), "test_accuracy": m[3]})
    notes = [line for line in text.splitlines() if line.startswith(("ddp::torch /", "share of the ceiling"))]
    if not rows:
        raise ValueError("no table in bench/torch_vs_pytorch.sh's output")
    return {"rows": rows, "notes": notes}


def parse_gpt(text):
    """bench/gpt_vs_pytorch.sh's output: tokens/s at 1 and 2 ranks per implementation, the ratios,
    and the validation losses at equal steps per seed."""
    rows = []
    for m in re.finditer(r"^(ddp::nn \(char_gpt\)|ddp::torch \(char_gpt_torch\)|PyTorch DDP \(Python, gloo\))"
                         r"\s+(\d+)\s+(\d+)\s+([\d.]+)x", text, re.M):
        rows.append({"setup": m[1], "rank1": int(m[2]), "rank2": int(m[3]), "scaling": float(m[4])})
    losses = []
    for m in re.finditer(r"^((?:ddp::nn|ddp::torch|PyTorch DDP)[^\d\n]*?)((?:\s+\d\.\d{4}){2,})\s*$", text, re.M):
        values = [float(v) for v in m[2].split()]
        losses.append({"setup": m[1].strip(), "seeds": values[:-1], "mean": values[-1]})
    notes = [line for line in text.splitlines() if line.startswith(("ratio to PyTorch", "mean validation loss", "# recipe"))]
    if not rows:
        raise ValueError("no tokens/s table in bench/gpt_vs_pytorch.sh's output")
    return {"rows": rows, "losses": losses, "notes": notes}


def measure(args):
    out_dir, name, kind = args[0], args[1], args[2]
    rest = args[3:]
    expected = 0
    if rest[:1] == ["--exit"]:
        expected, rest = int(rest[1]), rest[2:]
    assert rest[:1] == ["--"], "usage: measure DIR NAME KIND [--exit N] -- COMMAND..."
    command = rest[1:]
    path = os.path.join(out_dir, name + ".json")
    if kind in ("bench", "kernels") and os.path.exists(path):
        os.remove(path)
    run = {"command": shlex.join(command), "date": utc_now(), "machine": machine(), "load_before": load1()}
    start = time.monotonic()
    proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run["wall_s"] = round(time.monotonic() - start, 2)
    run["load_after"] = load1()
    run["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)
    run["exit"] = proc.returncode
    sys.stdout.write(proc.stdout)
    if proc.returncode != expected:
        sys.exit(f"results: {name}: `{run['command']}` exited {proc.returncode}, not {expected}")
    if kind in ("bench", "kernels"):
        with open(path) as f:
            doc = json.load(f)
    elif kind == "example":
        doc = parse_example(proc.stdout)
    elif kind == "torch":
        doc = parse_torch(proc.stdout)
    elif kind == "gpt":
        doc = parse_gpt(proc.stdout)
    elif kind == "timed":
        doc = {}
    elif kind == "ddp_run":  # ddp-run's report (--report FILE), and the example's epochs when it ran the example
        with open(command[command.index("--report") + 1]) as f:
            doc = {"report": json.load(f)}
        try:
            doc.update(parse_example(proc.stdout))
        except ValueError:
            pass
    else:
        sys.exit(f"results: unknown kind {kind}")
    doc["run"] = run
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")


def annotate(args):
    """Sets one field of a figure (a result its command's output does not hold)."""
    out_dir, name, key, value = args
    path = os.path.join(out_dir, name + ".json")
    with open(path) as f:
        doc = json.load(f)
    doc[key] = json.loads(value)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")


def skip(args):
    out_dir, name, reason = args
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump({"skipped": reason, "run": {"date": utc_now()}}, f, indent=1)
        f.write("\n")
    print(f"results: {name} not measured: {reason}")


def test_times(args):
    """scripts/test.sh's record: `key value` lines, `stage NAME SECONDS` for each stage."""
    out_dir, source = args
    doc = {"stages": []}
    with open(source) as f:
        for line in f:
            key, _, value = line.strip().partition(" ")
            if key == "stage":
                stage, _, seconds = value.rpartition(" ")
                doc["stages"].append({"stage": stage, "seconds": int(seconds)})
            elif key:
                doc[key] = value
    doc["run"] = {"command": doc.get("command", "./scripts/test.sh"), "date": doc.get("date", ""),
                  "machine": {"threads": int(doc.get("threads", 0)), "cpu": doc.get("cpu", "")},
                  "load_before": float(doc.get("load_start", "nan")), "load_after": float(doc.get("load_end", "nan"))}
    with open(os.path.join(out_dir, "test_command.json"), "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")


# ---------------------------------------------------------------------------------------------
# render


def fmt(value, digits=2):
    if isinstance(value, str):
        return value
    if value is None:
        return "n/a"
    if isinstance(value, int):
        return f"{value:,}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.1f}"
    return f"{value:.{digits}f}"


def size(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


class Figures:
    def __init__(self, directory):
        self.directory = directory

    def get(self, name):
        path = os.path.join(self.directory, name + ".json")
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return json.load(f)

    def image(self, name):
        return os.path.exists(os.path.join(self.directory, name))


def provenance(doc):
    """The line before a table: command, date, machine, load."""
    run = doc["run"]
    m = run["machine"]
    load = f"load average {fmt(run['load_before'])} before, {fmt(run['load_after'])} after"
    date = run["date"].replace("T", " ").replace("Z", " UTC")
    return (f"Command: `{run['command']}`  \n"
            f"Measured {date} on {m['cpu']}, {m['threads']} hardware threads; {load}; {fmt(run['wall_s'], 1)} s.")


def missing(name, doc):
    if doc is None:
        return f"Not measured: no figure `{name}` in this run."
    return f"Not measured in this run: {doc['skipped']}."


def render_collective(doc, baseline):
    rows = []
    for r in doc["rows"]:
        rows.append([size(r["size(B)"]), fmt(r["oop_time(us)"]), fmt(r["p50(us)"]), fmt(r["p99(us)"]),
                     fmt(r["oop_busbw"]), fmt(r["base_time(us)"]), fmt(r["base_bw"]), fmt(r["busbw/base"]),
                     fmt(r["async_time(us)"]), fmt(r["async/base"]), f"{r['oop_#wrong']}"])
    header = ["size", "time (µs)", "p50 (µs)", "p99 (µs)", "busbw (GB/s)", f"{baseline} (µs)",
              f"{baseline} (GB/s)", "busbw/base", "async (µs)", "async/base", "#wrong"]
    notes = [n for n in doc["notes"] if n.startswith(("ceiling", "FAILED", "TIMEOUT"))]
    text = [provenance(doc), "", table(header, rows)]
    if notes:
        text += [""] + [f"- {n}" for n in notes]
    return "\n".join(text)


def render_step(doc):
    # The GPT's rows (ddp-bench step --model gpt) carry its tokens/s and the ratio to the defaults.
    tokens = any("tokens/s" in r for r in doc["rows"])
    rows = []
    for r in doc["rows"]:
        overlap = r["overlap"]
        row = [r["ranks"], r["slot"], r["policy"], fmt(r["step(ms)"]), fmt(r["compute(ms)"]),
               fmt(r["reduce(ms)"]), "—" if r["slot"] == "no sync" else f"{100 * overlap:.0f}%",
               fmt(r["wait(ms)"]), fmt(r["update(ms)"]), fmt(r["bytes/step"]),
               fmt(r.get("memory(MiB)", "-"), 2), fmt(r.get("peak(MiB)", "-"), 2), fmt(r["vs_no_sync"], 3)]
        if tokens:
            row += [fmt(r.get("tokens/s", "-"), 0), fmt(r.get("vs_defaults", "-"), 3)]
        rows.append(row)
    header = ["ranks", "slot", "policy", "step (ms)", "compute", "reduce", "overlap", "wait", "update",
              "bytes/step", "memory (MiB)", "in a step", "vs no sync"]
    if tokens:
        header += ["tokens/s", "vs defaults"]
    notes = [n for n in doc["notes"] if n.startswith("world")]
    return "\n".join([provenance(doc), "", f"Model: {doc['title']}.", "", table(header, rows), ""] +
                     [f"- {n}" for n in notes])


def render_scaling(doc):
    unit = "tokens/s" if doc["rows"] and "tokens/s" in doc["rows"][0] else "samples/s"
    rows = [[r["setup"], fmt(r[unit]), f"{fmt(r['min'])}–{fmt(r['max'])}", f"{r['vs_1_rank']:.2f}×",
             f"{100 * r['vs_ceiling']:.0f}%"] for r in doc["rows"]]
    header = ["set-up", f"{unit} (median)", "range over rounds", "vs 1 rank", "of the ceiling"]
    return "\n".join([provenance(doc), "", f"Model: {doc['title']}.", "", table(header, rows), ""] +
                     [f"- {n}" for n in doc["notes"]])


def short_hash(h):
    return f"`{h}`"


def render_invariance(figs, name, mpi_names):
    doc = figs.get(name)
    if doc is None or "skipped" in doc:
        return missing(name, doc)
    setups = []
    by_setup = {}
    for r in doc["rows"]:
        key = (r["update"], r["optimizer"])
        if key not in by_setup:
            setups.append(key)
            by_setup[key] = []
        by_setup[key].append(r)
    worlds = sorted({r["ranks"] for r in doc["rows"]})
    mpi_docs = [(n, figs.get(n)) for n in mpi_names]
    mpi_docs = [(n, d) for n, d in mpi_docs if d is not None and "skipped" not in d]
    mpi_rows = {}
    for _, d in mpi_docs:
        for r in d["rows"]:
            mpi_rows.setdefault((r["update"], r["optimizer"]), []).append(r)
    rows = []
    for key in setups:
        these = by_setup[key]
        first = these[0]["hash"]
        cells = [f"{key[0]}, {key[1]}", short_hash(first)]
        cells += ["same" if r["hash"] == first and r["same"] == "yes" else f"**{r['hash']}**" for r in these]
        if mpi_docs:
            ms = sorted(mpi_rows.get(key, []), key=lambda r: r["ranks"])
            cells.append(", ".join(f"np {r['ranks']}: " + ("same" if r["hash"] == first else f"**{r['hash']}**")
                                   for r in ms) or "—")
        rows.append(cells)
    header = ["set-up", "hash"] + [f"{w} rank{'s' if w > 1 else ''}" for w in worlds]
    if mpi_docs:
        header.append("`mpirun -np N`")
    text = [provenance(doc)]
    for n, d in mpi_docs:
        text.append(f"and `{d['run']['command']}` ({fmt(d['run']['wall_s'], 1)} s, load average "
                    f"{fmt(d['run']['load_before'])} → {fmt(d['run']['load_after'])})")
    text[-1] += "."
    return "\n".join(["  \n".join(text), "", f"Model: {doc['title']}.", "", table(header, rows), ""] +
                     [f"- {n}" for n in doc["notes"]])


def render_plain(doc):
    rows = [[r["ranks"], f"{r['update']}, {r['optimizer']}", short_hash(r["hash"]), r["same"]] for r in doc["rows"]]
    return "\n".join([provenance(doc), "", table(["ranks", "set-up", "hash", "same as 1 rank"], rows), ""] +
                     [f"- {n}" for n in doc["notes"]])


def render_lose(doc):
    rejoin = bool(doc["rows"]) and "rejoin_ms" in doc["rows"][0]  # figures measured before --rejoin have none
    rows = []
    for r in doc["rows"]:
        rows.append([r["ranks"], r["then"], f"{r['update']}, {r['optimizer']}", r["lost"], r["handover_ms"],
                     r["recovery_ms"]] + ([r["back"], r["rejoin_ms"]] if rejoin else []) +
                    [short_hash(r["hash"]), r["same"]])
    header = (["ranks", "then", "set-up", "lost", "handover (ms)", "recovery (ms)"] +
              (["back", "rejoin (ms)"] if rejoin else []) + ["hash", "same"])
    return "\n".join([provenance(doc), "", table(header, rows), ""] + [f"- {n}" for n in doc["notes"]])


def render_ddp_run(figs):
    """The example and a fault-injection loop under ddp-run, each beside its run without faults."""
    names = ["ddp_run_example", "ddp_run_example_kill", "ddp_run_loop_ref", "ddp_run_loop"]
    docs = {n: figs.get(n) for n in names}
    for n, d in docs.items():
        if d is None or "skipped" in d:
            return missing(n, d)

    def last_epoch(d):
        e = d["epochs"][-1]
        return (e["train_loss"], e["train_accuracy"], e["test_accuracy"])

    rows, lines = [], []
    for n, what, same in (
            ("ddp_run_example", "the example, no fault", "-"),
            ("ddp_run_example_kill", "the example, a rank killed in epoch 2",
             "yes" if last_epoch(docs["ddp_run_example_kill"]) == last_epoch(docs["ddp_run_example"]) else "no"),
            ("ddp_run_loop_ref", "fault loop's program, no fault", "-"),
            ("ddp_run_loop", "fault loop", "yes" if docs["ddp_run_loop"].get("same_params") else "no")):
        d = docs[n]
        rep = d["report"]
        rec = sorted(r["recovery_s"] for r in rep["restarts"] if r["recovery_s"] is not None)
        recovery = "-" if not rec else (fmt(rec[0]) if len(rec) == 1 else
                                        f"{fmt(rec[0])} / {fmt(rec[len(rec) // 2])} / {fmt(rec[-1])}")
        accuracy = f"{d['epochs'][-1]['test_accuracy']:.2f}%" if "epochs" in d else "-"
        rows.append([what, rep["world"], rep["faults_injected"], len(rep["restarts"]), recovery, accuracy, same])
        lines += [f"{what[0].upper()}{what[1:]}:  ", provenance(d), ""]
    header = ["run", "ranks at the end", "faults injected", "restarts", "recovery (s; min / median / max)",
              "final test accuracy", "same bits as without faults"]
    return "\n".join(lines + [table(header, rows)])


def render_example(figs, names, reference_name):
    """One row per run; `same` compares its epoch lines (loss, train and test accuracy) with those
    of the reference run (the defaults at 2 ranks)."""
    reference = figs.get(reference_name)
    reference_lines = None
    if reference is not None and "skipped" not in reference:
        reference_lines = [(x["train_loss"], x["train_accuracy"], x["test_accuracy"]) for x in reference["epochs"]]
    rows, notes, runs = [], [], []
    base_rate = None
    for n in names:
        d = figs.get(n)
        if d is None or "skipped" in d:
            notes.append(f"- `{n}`: " + missing(n, d))
            continue
        s, e = d["summary"], d["epochs"]
        words = d["run"]["command"].split()
        if words[0] == "mpirun":
            program = next(w for w in words if "fashion_mnist" in w)
            flags = "mpirun -np " + words[words.index("-np") + 1] + " " + os.path.basename(program) + " " + \
                " ".join(w for w in words[words.index(program) + 1:] if w != "--no-progress")
            flags = flags.strip()
        else:
            flags = " ".join(w for w in words[1:] if w != "--no-progress")
        if base_rate is None:
            base_rate = s["samples/s"]
        lines = [(x["train_loss"], x["train_accuracy"], x["test_accuracy"]) for x in e]
        same = "—" if n == reference_name or reference_lines is None or n.endswith("1rank") else \
            ("yes" if lines == reference_lines else "no")
        memory = f"{s['memory_mib']:.2f}, {s.get('memory_peak_mib', s['memory_mib']):.2f}" if "memory_mib" in s else "—"
        rows.append([f"`{flags}`", f"{s['test_accuracy']:.2f}%", f"{e[0]['test_accuracy']:.2f}%", len(e),
                     fmt(s["training_s"], 1), fmt(int(s["samples/s"])), f"{s['samples/s'] / base_rate:.2f}×",
                     memory, f"{d['run']['peak_rss_mb']:.0f}", same])
        runs.append(d["run"])
    if not runs:
        return "\n".join(n.removeprefix("- ") for n in notes)
    first, last = runs[0], runs[-1]
    program = first["command"].split()[0]
    m = first["machine"]
    loads = ", ".join(fmt(r["load_before"]) for r in runs)
    text = (f"Commands: `{program} FLAGS --no-progress`, one run per row with its flags, one after another  \n"
            f"Measured {first['date'].replace('T', ' ').replace('Z', ' UTC')} to "
            f"{last['date'].replace('T', ' ').replace('Z', ' UTC')} on {m['cpu']}, {m['threads']} hardware threads; "
            f"load average before each: {loads}.")
    header = ["flags", "test accuracy", "after epoch 1", "epochs", "training (s)", "samples/s", "vs first row",
              "memory: between steps, in a step (MiB)", "peak RSS (MiB)", "same epoch lines as the defaults at 2 ranks"]
    return "\n".join([text, "", table(header, rows)] + ([""] + notes if notes else []))


def render_kernels(doc):
    rows = []
    for b in doc["benchmarks"]:
        if b.get("run_type") == "aggregate":
            continue
        bps = b.get("bytes_per_second")
        rows.append([f"`{b['name']}`", fmt(b["real_time"] / 1000 if b["time_unit"] == "ns" else b["real_time"]),
                     fmt(bps / 1e9) if bps else "n/a"])
    header = ["kernel / elements", "time (µs)" if doc["benchmarks"][0]["time_unit"] == "ns" else "time",
              "GB/s (bytes each kernel must read and write)"]
    return "\n".join([provenance(doc), "", table(header, rows)])


def render_torch(doc):
    rows = [[r["setup"], fmt(r["samples/s"]), r["test_accuracy"]] for r in doc["rows"]]
    return "\n".join([provenance(doc), "", table(["set-up", "samples/s", "test accuracy"], rows), ""] +
                     [f"- {n}" for n in doc["notes"]])


def render_gpt(doc):
    rows = [[r["setup"], fmt(r["rank1"]), fmt(r["rank2"]), f"{r['scaling']:.2f}×"] for r in doc["rows"]]
    text = [provenance(doc), "", table(["implementation", "tokens/s, 1 rank", "tokens/s, 2 ranks", "2 / 1"], rows)]
    if doc.get("losses"):
        seeds = len(doc["losses"][0]["seeds"])
        text += ["", f"Command: `{doc['run']['command']}` (its second part: the same steps at 2 ranks per seed)", "",
                 table(["validation loss"] + [f"seed {i + 1}" for i in range(seeds)] + ["mean"],
                           [[l["setup"]] + [f"{v:.4f}" for v in l["seeds"]] + [f"{l['mean']:.4f}"]
                            for l in doc["losses"]])]
    return "\n".join(text + [""] + [f"- {n.lstrip('# ')}" for n in doc["notes"]])


def render_sync(doc):
    every = doc["rows"][0]["bytes_per_step"]
    rows = [[r["schedule"], f"{r['validation_loss']:.4f}", fmt(round(r["bytes_per_step"])),
             f"{r['bytes_per_step'] / every:.4f}", fmt(r["tokens_per_s"])] for r in doc["rows"]]
    return "\n".join([provenance(doc), "", table(["schedule", f"validation loss after {doc['steps']} steps",
                                                  "bytes sent per step, per rank", "of every_step's", "tokens/s"],
                                                 rows)])


def render_sync_link(doc):
    rows = []
    for r in doc["rows"]:
        got = r["reached"]
        rows.append([r["schedule"], f"{got['seconds']:.1f} s (step {got['step']})" if got else
                     f"not in {doc['steps']} steps", fmt(r["tokens_per_s"])])
    text = [provenance(doc), "", f"Link: `{doc['link']}` each way; target validation loss {doc['target']}, "
            f"evaluated every {doc['eval_every']} steps.", "",
            table(["schedule", "time to the target", "tokens/s"], rows)]
    a, b = doc["rows"][0]["reached"], doc["rows"][1]["reached"]
    if a and b:
        text += ["", f"diloco reaches the target {a['seconds'] / b['seconds']:.2f}× sooner than every_step."]
    return "\n".join(text)


def render_build(doc):
    return "\n".join([provenance(doc), "", table(["what", "seconds"], [["the example's build after configure "
                                                                         "(its two translation units and the link)",
                                                                         fmt(doc["run"]["wall_s"], 1)]])])


def render_test_command(doc):
    rows = [[s["stage"], s["seconds"]] for s in doc["stages"]]
    total = sum(s["seconds"] for s in doc["stages"])
    rows.append(["**all stages**", f"**{total}** ({total // 60} min {total % 60} s)"])
    extra = []
    if "ctest_entries" in doc:
        extra.append(f"ctest entries: {doc['ctest_entries']}.")
    if "commit" in doc:
        extra.append(f"Commit: `{doc['commit']}`.")
    return "\n".join([provenance_test(doc), "", table(["stage", "seconds"], rows), ""] + extra)


def provenance_test(doc):
    run = doc["run"]
    m = run["machine"]
    date = run["date"].replace("T", " ").replace("Z", " UTC")
    return (f"Command: `{run['command']}`  \n"
            f"Measured {date} on {m['cpu']}, {m['threads']} hardware threads; load average "
            f"{fmt(run['load_before'])} at the start, {fmt(run['load_after'])} at the end.")


def render_machine(figs):
    dates, loads, cpus = [], [], set()
    for f in sorted(os.listdir(figs.directory)):
        if not f.endswith(".json") or f == "test_command.json":
            continue
        d = figs.get(f[:-5])
        run = d.get("run", {})
        if "machine" not in run:
            continue
        dates.append(run["date"])
        loads += [x for x in (run["load_before"], run["load_after"]) if x is not None]
        cpus.add(f"{run['machine']['cpu']}, {run['machine']['threads']} hardware threads")
    if not dates:
        return "No measurement in this run."
    return (f"The figures below were measured from {min(dates).replace('T', ' ').replace('Z', ' UTC')} to "
            f"{max(dates).replace('T', ' ').replace('Z', ' UTC')}, on {'; '.join(sorted(cpus))}; load average "
            f"between {min(loads):.2f} and {max(loads):.2f} (its 1-minute figure, read before and after each command).")


def render_plot(figs, file, alt):
    if figs.image(file):
        return f"![{alt}](figures/{file})"
    return f"(No plot in this run: `{file}` was not drawn; scripts/results.sh draws it where matplotlib is installed.)"


def renderers(figs):
    def one(name, fn):
        def go():
            doc = figs.get(name)
            return missing(name, doc) if doc is None or "skipped" in doc else fn(doc)
        return go

    return {
        "machine": lambda: render_machine(figs),
        "all_reduce_inproc": one("all_reduce_inproc", lambda d: render_collective(d, "memcpy")),
        "all_reduce_inproc_bound": one("all_reduce_inproc_bound", lambda d: render_collective(d, "memcpy")),
        "all_reduce_mpi": one("all_reduce_mpi", lambda d: render_collective(d, "raw MPI")),
        "plot all_reduce": lambda: render_plot(figs, "all_reduce.png", "busbw against size"),
        "step": one("step", render_step),
        "plot step": lambda: render_plot(figs, "step.png", "step breakdown"),
        "plot trace": lambda: render_plot(figs, "trace_overlap.png", "overlap per step"),
        "scaling": one("scaling", render_scaling),
        "scaling_adamw": one("scaling_adamw", render_scaling),
        "step_gpt": one("step_gpt", render_step),
        "scaling_gpt": one("scaling_gpt", render_scaling),
        "scaling_gpt10m": one("scaling_gpt10m", render_scaling),
        "step_gpt10m": one("step_gpt10m", render_step),
        "invariance": lambda: render_invariance(figs, "invariance",
                                                [f"invariance_mpi_np{n}" for n in range(1, 9)]),
        "invariance_plain": one("invariance_plain", render_plain),
        "lose": one("lose", render_lose),
        "ddp_run": lambda: render_ddp_run(figs),
        "example": lambda: render_example(figs, ["example_1rank", "example_2ranks", "example_2ranks_sharded",
                                                 "example_2ranks_sharded_gradients", "example_2ranks_fully_sharded",
                                                 "example_2ranks_invariant",
                                                 "example_mpi_2ranks"],
                                          "example_2ranks"),
        "example_loader": lambda: render_example(figs, ["example_epoch1", "example_epoch1_prefetch",
                                                        "example_epoch1_mapped"], "example_epoch1"),
        "kernels": one("host_kernels", render_kernels),
        "torch": one("torch_vs_pytorch", render_torch),
        "gpt_vs_pytorch": one("gpt_vs_pytorch", render_gpt),
        "sync_schedules": one("sync_schedules", render_sync),
        "sync_schedules_link": one("sync_schedules_link", render_sync_link),
        "build": one("build_example", render_build),
        "test_command": one("test_command", render_test_command),
    }


def render(args):
    template, directory, page = args
    figs = Figures(directory)
    fill = renderers(figs)
    with open(template) as f:
        text = f.read()

    def replace(m):
        key = m[1].strip()
        if key not in fill:
            sys.exit(f"results: the template names {{{{{key}}}}}, which no renderer fills")
        return fill[key]()

    # Template comments (<!-- ... -->) are for whoever edits the template.
    text = re.sub(r"<!--.*?-->\n?", "", text, flags=re.S)
    text = re.sub(r"\{\{([^}]*)\}\}", replace, text)
    with open(page, "w") as f:
        f.write(text)


# ---------------------------------------------------------------------------------------------
# check


def slug(heading):
    """GitHub's anchor of a heading."""
    s = heading.strip().lower().replace("`", "")
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def check(args):
    page = args[0]
    root = args[1] if len(args) > 1 else None
    with open(page) as f:
        lines = f.read().splitlines()
    problems = []
    text = "\n".join(lines)
    if "{{" in text or "}}" in text:
        problems.append("an unresolved {{placeholder}}")
    if re.search(r"\|\s*(nan|None|inf)\s*\|", text):
        problems.append("a table cell reads nan, None or inf")
    sections, current = [], None
    for i, line in enumerate(lines):
        if line.startswith("## "):
            current = {"title": line[3:], "tables": 0, "missing": 0, "line": i + 1}
            sections.append(current)
        is_header = line.startswith("|") and i + 1 < len(lines) and re.match(r"^\|(-+\|)+$", lines[i + 1])
        if is_header:
            if current is None:
                problems.append(f"line {i + 1}: a table before the first section")
                continue
            current["tables"] += 1
            # Its command line: between the previous table (or the section's heading) and it.
            j, named = i - 1, False
            while j >= 0 and not lines[j].startswith("## ") and not lines[j].startswith("|"):
                named = named or lines[j].startswith(("Command: `", "Commands: `"))
                j -= 1
            if not named:
                problems.append(f"line {i + 1}: a table without its command line before it")
        if current is not None and line.startswith(("Not measured", "- `")) and "Not measured" in line:
            current["missing"] += 1
    if not sections:
        problems.append("no section")
    for s in sections:
        if s["tables"] == 0 and s["missing"] == 0:
            problems.append(f"line {s['line']}: section \"{s['title']}\" has no table and does not say why")
    for m in re.finditer(r"!\[[^]]*\]\(([^)]+)\)", text):
        if not os.path.exists(os.path.join(os.path.dirname(page), m[1])):
            problems.append(f"the image {m[1]} does not exist beside the page")
    if root:
        anchors = {slug(line.lstrip("#")) for line in lines if line.startswith("#")}
        sources = [os.path.join(root, "README.md")]
        for d, _, files in os.walk(os.path.join(root, "docs")):
            sources += [os.path.join(d, f) for f in files if f.endswith(".md") and f != "results.md"]
        for src in sources:
            with open(src) as f:
                for n, line in enumerate(f, 1):
                    for m in re.finditer(r"results\.md#([\w\-]+)", line):
                        if m[1] not in anchors:
                            problems.append(f"{os.path.relpath(src, root)}:{n} links to results.md#{m[1]}, "
                                            "which is no heading of the page")
    for p in problems:
        print(f"results: {page}: {p}", file=sys.stderr)
    if problems:
        sys.exit(1)
    print(f"results: {page}: {len(sections)} sections, "
          f"{sum(s['tables'] for s in sections)} tables, each with its command; no placeholder left")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    command, args = sys.argv[1], sys.argv[2:]
    {"measure": measure, "skip": skip, "annotate": annotate, "test-times": test_times, "render": render,
     "check": check}.get(
        command, lambda _: sys.exit(__doc__))(args)


if __name__ == "__main__":
    main()
