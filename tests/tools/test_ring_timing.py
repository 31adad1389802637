"""scripts/ring_timing.py (ring attention beside plain attention: time,
scaling, overlap and schedule) runs at a tiny size on the host devices, its
rings agree with the one-device call, its timed variants compile to what they
claim (and the check says so when they do not), and its schedule readers find
the events and transfers they look for."""

import json
import re

import jax
import pytest

from helpers import load_script

# The timed runs need two devices of the default backend: the CPU suite has four host devices
# (tests/conftest.py); a one-GPU machine has one, and the scripts refuse a smaller mesh.
two_devices = pytest.mark.skipif(len(jax.devices()) < 2, reason="needs 2 devices of the default backend")

TINY = ["--devices", "2", "--seqlen", "128", "--heads", "2", "--head-dim", "16", "--dtype", "float32",
        "--iters", "1"]


@two_devices
def test_ring_timing_runs_and_agrees(capsys):
    script = load_script("ring_timing")
    script.main(TINY)
    out = capsys.readouterr().out
    errors = [float(x) for x in re.findall(r"max \|ring - one\| (\S+)", out)]
    assert len(errors) == 2 and max(errors) < 1e-5, out  # zigzag and contiguous
    assert len(re.findall(r"scaling \w+ T=128: fwd \S+x = \d+% of linear", out)) == 2, out
    assert "entry schedule" in out


@two_devices
def test_overlap_variants_and_json(tmp_path, capsys):
    script = load_script("ring_timing")
    path = tmp_path / "ring.json"
    rows = script.main(TINY + ["--layouts", "zigzag", "--overlap", "--json", str(path)])
    out = capsys.readouterr().out
    assert len(re.findall(r"overlap zigzag fwd(\+bwd)?: full", out)) == 2, out
    saved = json.loads(path.read_text())
    assert saved["rows"] == json.loads(json.dumps(rows))
    (row,) = saved["rows"]
    assert row["devices"] == 2 and row["max_error"] < 1e-5
    for part in ("overlap_fwd", "overlap_fwd_bwd"):
        assert set(row[part]) == {"full", "compute", "transfer", "base", "transfer_ms", "exposed_ms", "hidden"}
    # The fwd+bwd of a ring of two: one K/V hop (the backward's is the forward's,
    # merged by XLA; jax 0.5's XLA keeps the backward's own hop, 2 more) and dK,
    # dV after each of the two steps; 128 / 2 positions x 2 heads x 16 float32
    # per array.
    sizes = sorted(x["bytes"] for x in saved["transfers"])
    assert sizes in ([64 * 2 * 16 * 4] * 6, [64 * 2 * 16 * 4] * 8), saved["transfers"]


def test_variant_check_fails_on_the_wrong_program():
    script = load_script("ring_timing")
    full = """HloModule m
ENTRY main {
  a = f32[2] collective-permute(x), source_target_pairs={{0,1},{1,0}}
  b = (f32[2], f32[1]) custom-call(y), custom_call_target="jax_flash_fwd_v5"
}"""
    no_kernel = full.replace("jax_flash_fwd_v5", "SomethingElse")
    script.check_variant("transfer", no_kernel, full)
    with pytest.raises(RuntimeError, match="variant 'compute' compiled to 1 kernel calls and 1 permutes"):
        script.check_variant("compute", full, full)  # the hops were not swapped out
    with pytest.raises(RuntimeError, match="variant 'transfer'"):
        script.check_variant("transfer", full, full)  # the kernels were not swapped out
    with pytest.raises(RuntimeError, match="variant 'transfer' moves 4 bytes; the full ring 8"):
        script.check_variant("transfer", no_kernel.replace("f32[2] collective", "f32[1] collective"), full)
    assert script.overlap({"full": 10.0, "compute": 9.0, "transfer": 3.0, "base": 1.0}) == {
        "transfer_ms": 2.0, "exposed_ms": 1.0, "hidden": 0.5}


def test_schedule_events_reads_permutes_and_kernel_calls():
    script = load_script("ring_timing")
    hlo = """HloModule m
ENTRY main {
  a = f32[2] collective-permute-start(x), source_target_pairs={{0,1}}
  b = (f32[2], f32[1]) custom-call(y), custom_call_target="jax_flash_fwd_v2"
  c = f32[2] collective-permute-done(a)
  d = f32[2] custom-call(z), custom_call_target="SomethingElse"
  e = bf16[4,2] collective-permute(c), source_target_pairs={{0,1}}
  f = (f32[8], bf16[8]) collective-permute-start(e), source_target_pairs={{0,1}}
  ROOT g = (f32[8], bf16[8]) collective-permute-done(f)
}"""
    assert script.schedule_events(hlo) == ["cp-start", "jax_flash_fwd_v2", "cp-done", "cp", "cp-start", "cp-done"]
    assert script.transfers(hlo) == [
        {"bytes": 8, "kernels": ["jax_flash_fwd_v2"], "sync": False},
        {"bytes": 16, "kernels": [], "sync": True},
        {"bytes": 48, "kernels": [], "sync": False},
    ]
    # A permute XLA wraps as an async computation; other async ops are not permutes.
    wrapped = """HloModule m
ENTRY main {
  %s = ((bf16[4]), bf16[4], u32[]) async-start(%x), calls=%wrapped_collective_permute.1
  %a = (f32[8], u32[]) async-start(%y), calls=%wrapped_all_reduce
  %k = f32[2] custom-call(%z), custom_call_target="jax_flash_bwd_v5"
  %b = f32[8] async-done(%a)
  %d = bf16[4] async-done(%s)
}"""
    assert script.schedule_events(wrapped) == ["cp-start", "jax_flash_bwd_v5", "cp-done"]
    assert script.transfers(wrapped) == [{"bytes": 8, "kernels": ["jax_flash_bwd_v5"], "sync": False}]


@two_devices
def test_a_variant_that_fails_its_check_leaves_the_rest(capsys, monkeypatch):
    script = load_script("ring_timing")

    def refuse(name, hlo, full_hlo):
        raise RuntimeError(f"variant {name!r} refused")

    monkeypatch.setattr(script, "check_variant", refuse)
    (row,) = script.main(TINY + ["--layouts", "zigzag", "--overlap"])
    assert row["overlap_error"] == "variant 'compute' refused" and "overlap_fwd" not in row
    assert row["max_error"] < 1e-5
    assert "overlap zigzag: not measured: variant 'compute' refused" in capsys.readouterr().out
