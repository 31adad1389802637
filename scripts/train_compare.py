"""The Flax GPT example on several meshes: tokens/s against one device, and the same loss curve.

    python scripts/train_compare.py --runs one data=2 seq=2 --out /tmp/train --json train.json -- \\
        --seq-len 8192 --batch-size 4 --depth 8 --width 512 --heads 8 --steps 100 --log-every 10 \\
        --dtype bfloat16 --no-progress --sample-chars 0          # issue 24's run 3

    python scripts/train_compare.py --runs one attention=cudnn --out /tmp/e2e -- \\
        --seq-len 2048 --batch-size 8 --depth 8 --width 512 --heads 8 --steps 100 --log-every 10 \\
        --dtype bfloat16 --no-progress --sample-chars 0          # issue 21's end to end

Runs examples/train_gpt_flax.py once per --runs entry ("one": the arguments
after `--` alone; "attention=X": with --attention X, e.g. jax_flash against
cuDNN on one device; anything else is its --mesh), one process each, one
after the other, with --out OUT/<run> (the example's metrics.json: every logged step's loss,
val_loss and tokens/s) and --timeout seconds; the arguments after `--` go to
every run, and each run's output to OUT/<run>.log. Then one row per run:
tokens/s at its last logged step (the example's rate since step 1, so
compilation does not count; its evaluations do, the same in every run), the
ratio to the first run's, and the largest relative difference of its train
and valid losses from the first run's at the same steps, then the curves side
by side.

The runs draw the same batches (one seeded generator; a mesh only shards
them) from the same initial parameters, so their curves differ only by
floating-point order (the gradients' all-reduce over data, the ring's merges
over seq). A run fails (exit status 1 after all ran) when it does not finish,
when its first logged losses differ from the first run's by more than
--tolerance / 10 (same parameters: only the forward's rounding differs), or
any later one by more than --tolerance, relative. Default 0.02: in bf16 the
flash / cuDNN / XLA attention runs of docs/perf_history.md ("End to end", 100
steps) differ by up to 1.1% at step 100, different kernels where these runs
share theirs, so 2% is that spread with a margin and far below a broken run's
(a missing all-reduce or a wrong ring step leaves the loss off by tenths).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import sys
import time

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "train_gpt_flax.py"


def run_dir_name(run: str) -> str:
    return re.sub(r"\W+", "_", run)


def run_flags(run: str) -> list[str]:
    """The example's flags that make run `run` differ from the first."""
    if run == "one":
        return []
    if run.startswith("attention="):
        return ["--attention", run.removeprefix("attention=")]
    return ["--mesh", run]


def compare(histories: dict, tolerance: float) -> list[dict]:
    """Rows of the table, the first run the reference; a history is None
    (or empty) for a run that did not finish."""
    names = list(histories)
    base = histories[names[0]] or []
    base_rate = base[-1]["tokens_per_s"] if base else float("nan")
    base_at = {h["step"]: h for h in base}
    rows = []
    for name in names:
        history = histories[name]
        if not history:
            rows.append({"run": name, "ok": False, "why": "did not finish"})
            continue
        common = [h for h in history if h["step"] in base_at]
        rel = [max(abs(h[key] - base_at[h["step"]][key]) / abs(base_at[h["step"]][key])
                   for key in ("loss", "val_loss")) for h in common]
        first_rel, worst = (rel[0], max(rel)) if rel else (float("nan"), float("nan"))
        why = []
        if not rel:
            why.append("no step in common with the first run")
        elif first_rel > tolerance / 10:
            why.append(f"first logged loss {first_rel:.2%} off (> {tolerance / 10:.2%})")
        if rel and worst > tolerance:
            why.append(f"loss {worst:.2%} off (> {tolerance:.0%})")
        rate = history[-1]["tokens_per_s"]
        rows.append({"run": name, "ok": not why, "why": "; ".join(why), "steps": history[-1]["step"],
                     "tokens_per_s": rate, "ratio": rate / base_rate, "first_rel_diff": first_rel,
                     "max_rel_diff": worst, "final_loss": history[-1]["loss"],
                     "final_val_loss": history[-1]["val_loss"]})
    return rows


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    example_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="+", default=["one", "data=2", "seq=2"],
                   help="'one' (no flag), 'attention=X' (--attention X) or a --mesh value; the first is "
                        "the reference")
    p.add_argument("--out", default="/tmp/train_compare", help="the runs' --out directories and logs")
    p.add_argument("--timeout", type=float, default=150.0, help="seconds per run")
    p.add_argument("--tolerance", type=float, default=0.02, help="relative loss difference allowed")
    p.add_argument("--json", default=None, help="write the rows and every curve to this file")
    p.add_argument("--example", default=str(EXAMPLE), help="the training script (default: the Flax example)")
    args = p.parse_args(own)

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    histories = {}
    for run in args.runs:
        run_out = out / run_dir_name(run)
        cmd = [sys.executable, args.example, *example_args, "--out", str(run_out), *run_flags(run)]
        start = time.perf_counter()
        with open(out / f"{run_dir_name(run)}.log", "w") as log:
            log.write(" ".join(cmd) + "\n")
            log.flush()
            try:
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        metrics = run_out / "metrics.json"
        histories[run] = json.loads(metrics.read_text())["history"] if rc == 0 and metrics.exists() else None
        checkpoint = run_out / "checkpoint.msgpack"  # not needed here, and large
        if checkpoint.exists():
            checkpoint.unlink()
        print(f"run {run}: rc={rc} in {time.perf_counter() - start:.0f} s", flush=True)

    rows = compare(histories, args.tolerance)
    for r in rows:
        if "tokens_per_s" not in r:
            print(f"{r['run']}: FAIL, {r['why']}")
            continue
        print(f"{r['run']}: {r['tokens_per_s']:,.0f} tokens/s ({r['ratio']:.2f}x {args.runs[0]}), "
              f"loss {r['final_loss']:.4f}, val {r['final_val_loss']:.4f} at step {r['steps']}; losses "
              f"within {r['max_rel_diff']:.2%} of {args.runs[0]}'s (first {r['first_rel_diff']:.3%})"
              + ("" if r["ok"] else f": FAIL, {r['why']}"))
    done = [run for run in args.runs if histories[run]]
    if done:
        print("step " + " ".join(f"{run:>17}" for run in done) + "   (loss / val_loss)")
        for point in histories[done[0]]:
            cells = []
            for run in done:
                h = next((h for h in histories[run] if h["step"] == point["step"]), None)
                cells.append(f"{h['loss']:8.4f}/{h['val_loss']:.4f}" if h else f"{'-':>17}")
            print(f"{point['step']:4d} " + " ".join(cells))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"example_args": example_args, "tolerance": args.tolerance, "rows": rows,
                       "histories": histories}, f, indent=1)
    if not all(r["ok"] for r in rows):
        raise SystemExit(1)
    return rows


if __name__ == "__main__":
    main()
