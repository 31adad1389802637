"""scripts/train_compare.py (the Flax example on several meshes: tokens/s and
loss curves against the first run) drives a stand-in training script here
(the example itself on a mesh is tests/test_examples.py's): it passes the
arguments after `--`, --out and --mesh, reads metrics.json, and fails a run
whose losses drift past the tolerance, whose first losses differ past a tenth
of it, or that does not finish in its time."""

import json
import textwrap

import pytest

from helpers import load_script

STAND_IN = textwrap.dedent("""
    import json, os, sys, time
    argv = sys.argv[1:]
    out = argv[argv.index("--out") + 1]
    mesh = argv[argv.index("--mesh") + 1] if "--mesh" in argv else "one"
    if "--attention" in argv:
        mesh = "attention=" + argv[argv.index("--attention") + 1]
    assert argv[:2] == ["--seq-len", "64"], argv  # the arguments after --, first
    if mesh == "hang":
        time.sleep(30)
    drift = {"drift=1": 0.05, "first=1": 0.01}.get(mesh, 0.0)
    rate = {"attention=cudnn": 800.0}.get(mesh, 2000.0 if mesh.startswith("data") else 1000.0)
    history = [{"step": s, "loss": 4.0 - s * 0.1 + (drift if mesh != "drift=1" or s > 1 else 0),
                "val_loss": 4.1 - s * 0.1, "tokens_per_s": rate} for s in (1, 10, 20)]
    os.makedirs(out, exist_ok=True)
    json.dump({"args": argv, "history": history}, open(os.path.join(out, "metrics.json"), "w"))
    open(os.path.join(out, "checkpoint.msgpack"), "wb").write(b"x" * 100)
""")


@pytest.fixture
def run(tmp_path):
    example = tmp_path / "stand_in.py"
    example.write_text(STAND_IN)

    def run(*runs, timeout=20):
        script = load_script("train_compare")
        return script.main(["--runs", *runs, "--out", str(tmp_path / "out"), "--example", str(example),
                            "--timeout", str(timeout), "--json", str(tmp_path / "train.json"),
                            "--", "--seq-len", "64"])
    return run


def test_same_curves_pass_with_the_rate_ratio(run, tmp_path, capsys):
    rows = run("one", "data=2")
    assert [r["run"] for r in rows] == ["one", "data=2"] and all(r["ok"] for r in rows)
    assert rows[1]["ratio"] == 2.0 and rows[1]["max_rel_diff"] == 0.0
    out = capsys.readouterr().out
    assert "data=2: 2,000 tokens/s (2.00x one)" in out and "  20 " in out, out
    assert not (tmp_path / "out" / "data_2" / "checkpoint.msgpack").exists()
    assert "--mesh data=2" in (tmp_path / "out" / "data_2.log").read_text()
    saved = json.loads((tmp_path / "train.json").read_text())
    assert saved["example_args"] == ["--seq-len", "64"] and len(saved["histories"]["one"]) == 3


@pytest.mark.parametrize("bad, why", [("drift=1", "loss 2.50% off"), ("first=1", "first logged loss")])
def test_drifting_curves_fail(run, capsys, bad, why):
    with pytest.raises(SystemExit) as exit_:
        run("one", bad)
    assert exit_.value.code == 1
    assert f"{bad}: " in (out := capsys.readouterr().out) and "FAIL" in out and why in out, out


def test_a_run_out_of_time_fails(run, capsys):
    with pytest.raises(SystemExit):
        run("one", "hang", timeout=2)
    out = capsys.readouterr().out
    assert "run hang: rc=timeout" in out and "hang: FAIL, did not finish" in out, out


def test_compare_tolerances():
    script = load_script("train_compare")
    base = [{"step": 1, "loss": 4.0, "val_loss": 4.0, "tokens_per_s": 10.0},
            {"step": 2, "loss": 3.0, "val_loss": 3.0, "tokens_per_s": 10.0}]
    near = [dict(h, loss=h["loss"] * (1 + (0.001 if h["step"] == 1 else 0.019))) for h in base]
    rows = script.compare({"one": base, "near": near, "gone": None}, 0.02)
    assert rows[1]["ok"] and abs(rows[1]["max_rel_diff"] - 0.019) < 1e-9, rows
    assert rows[2] == {"run": "gone", "ok": False, "why": "did not finish"}


def test_an_attention_run_passes_the_examples_flag(run, tmp_path, capsys):
    # issue 21's end to end: jax_flash ("one", the example's default) against cuDNN.
    rows = run("one", "attention=cudnn")
    assert rows[1]["run"] == "attention=cudnn" and rows[1]["ok"] and rows[1]["ratio"] == 0.8
    log = (tmp_path / "out" / "attention_cudnn.log").read_text()
    assert "--attention cudnn" in log and "--mesh" not in log
    assert "attention=cudnn: 800 tokens/s (0.80x one)" in capsys.readouterr().out
