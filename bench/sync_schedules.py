#!/usr/bin/python3
"""Sync schedules on the character-level GPT (examples/char_gpt), side by side.

  bench/sync_schedules.py compare BUILD [--steps N] [--out FILE]
      every_step, local_sgd (H = 8, 32), diloco (H = 32, 100), streaming_diloco (H = 32, 4 fragments,
      each reduction overlapping one inner step) and diloco with comm_hook::int8_rows, at 2 in-process ranks, the same
      steps and data: the validation loss after them, the bytes each rank sends per step, tokens/s.
  bench/sync_schedules.py link BUILD --target LOSS [--steps N] [--link TC] [--out FILE]
      every_step against diloco (H = 32) on two hosts (network namespaces, tests/mpi/two_hosts.sh)
      joined by a link that tc shapes: the wall time until the validation loss first reaches
      LOSS, evaluated every --eval-every steps.

Bytes per step are the ring's bus bytes of the all_reduce each rank issues (2 (N - 1) / N of
its buffer): every_step reduces every gradient each step, a sync every parameter once per
period (tests/trainer/sync_schedule_test.cpp checks these counts against a counting
communicator). Standard library only.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

SCHEDULES = [
    ("every_step", []),
    ("local_sgd H=8", ["--sync", "local_sgd", "--sync-period", "8"]),
    ("local_sgd H=32", ["--sync", "local_sgd", "--sync-period", "32"]),
    ("diloco H=32", ["--sync", "diloco", "--sync-period", "32"]),
    ("diloco H=100", ["--sync", "diloco", "--sync-period", "100"]),
    ("streaming_diloco H=32 F=4", ["--sync", "streaming_diloco", "--sync-period", "32", "--sync-fragments", "4"]),
    ("diloco H=32 int8_rows", ["--sync", "diloco", "--sync-period", "32", "--hook", "int8_rows"]),
]


def period(flags):
    return int(flags[flags.index("--sync-period") + 1]) if "--sync-period" in flags else 1


def bytes_per_step(parameters, flags, ranks=2):
    if "int8_rows" in flags:  # all-gathered: a byte per element and a 4-byte scale per row (width 128)
        return parameters * (1 + 4.0 / 128) * (ranks - 1) / period(flags)
    return 4.0 * parameters * 2.0 * (ranks - 1) / ranks / period(flags)


def run_timed(command, env=None):
    """Runs `command`, returning its output lines each with the seconds since the start."""
    start = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    for line in proc.stdout:
        lines.append((time.monotonic() - start, line.rstrip("\n")))
        sys.stdout.write(line)
    if proc.wait() != 0:
        sys.exit(f"sync_schedules: `{' '.join(command)}` exited {proc.returncode}")
    return lines


def summary(lines):
    text = "\n".join(line for _, line in lines)
    out = {}
    for key, pattern in (("validation_loss", r"validation loss ([\d.]+) nats per byte"),
                         ("tokens_per_s", r"throughput\s+(\d+) tokens/s"),
                         ("parameters", r"model\s+(\d+) parameters"),
                         ("train_s", r"training time\s+([\d.]+) s")):
        m = re.search(pattern, text)
        if m:
            out[key] = float(m[1])
    return out


def compare(args):
    example = os.path.join(args.build, "examples", "char_gpt", "char_gpt")
    rows = []
    for name, flags in SCHEDULES:
        command = [example, "--ranks", "2", "--steps", str(args.steps), "--eval-every", "0",
                   "--final-eval-sequences", str(args.eval_sequences), "--sample-chars", "0", "--no-progress"] + flags
        s = summary(run_timed(command))
        rows.append({"schedule": name, "flags": " ".join(flags), "validation_loss": s["validation_loss"],
                     "bytes_per_step": bytes_per_step(s["parameters"], flags), "tokens_per_s": s["tokens_per_s"]})
    every = rows[0]["bytes_per_step"]
    print(f"\n{'schedule':<16} {'val loss':>9} {'bytes/step':>12} {'of every_step':>14} {'tokens/s':>9}")
    for r in rows:
        print(f"{r['schedule']:<16} {r['validation_loss']:>9.4f} {r['bytes_per_step']:>12.0f} "
              f"{r['bytes_per_step'] / every:>14.4f} {r['tokens_per_s']:>9.0f}")
    return {"steps": args.steps, "ranks": 2, "eval_sequences": args.eval_sequences, "rows": rows}


def link(args):
    example = os.path.join(args.build, "examples", "char_gpt", "char_gpt_mpi")
    two_hosts = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "mpi", "two_hosts.sh")
    env = dict(os.environ, DDP_TWO_HOSTS_LINK=args.link)
    rows = []
    for name, flags in [SCHEDULES[0], ("diloco H=32", ["--sync", "diloco", "--sync-period", "32"])]:
        command = [two_hosts, "mpirun", "1", "1", example, "--steps", str(args.steps), "--eval-every",
                   str(args.eval_every), "--eval-sequences", str(args.eval_sequences), "--final-eval-sequences",
                   str(args.eval_sequences), "--sample-chars", "0", "--log-every", str(args.eval_every)] + flags
        lines = run_timed(command, env)
        reached = None
        for t, line in lines:
            m = re.match(r"step (\d+)/\d+\s+validation loss ([\d.]+)", line)
            if m and float(m[2]) <= args.target:
                reached = {"seconds": round(t, 1), "step": int(m[1]), "loss": float(m[2])}
                break
        s = summary(lines)
        rows.append({"schedule": name, "reached": reached, "tokens_per_s": s.get("tokens_per_s"),
                     "validation_loss": s.get("validation_loss")})
    print(f"\nlink: {args.link}; target validation loss {args.target}")
    for r in rows:
        got = r["reached"]
        print(f"{r['schedule']:<14} " + (f"{got['seconds']:>7.1f} s (step {got['step']}, loss {got['loss']:.4f})"
                                         if got else f"not reached in {args.steps} steps") +
              f", {r['tokens_per_s']:.0f} tokens/s")
    if rows[0]["reached"] and rows[1]["reached"]:
        print(f"diloco reaches it {rows[0]['reached']['seconds'] / rows[1]['reached']['seconds']:.2f}x sooner")
    return {"link": args.link, "target": args.target, "steps": args.steps, "eval_every": args.eval_every, "rows": rows}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["compare", "link"])
    p.add_argument("build")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--eval-sequences", type=int, default=1024)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--target", type=float, default=2.5)
    p.add_argument("--link", default="tbf rate 100mbit burst 64kb latency 50ms")
    p.add_argument("--out")
    args = p.parse_args()
    doc = compare(args) if args.mode == "compare" else link(args)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")


if __name__ == "__main__":
    main()
