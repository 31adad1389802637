"""scripts/ring_timing.py (ring attention beside plain attention: time and
schedule) runs at a tiny size on the host devices, its rings agree with the
one-device call, and its schedule reader finds the events it looks for."""

import re

from helpers import load_script


def test_ring_timing_runs_and_agrees(capsys):
    script = load_script("ring_timing")
    script.main(["--devices", "2", "--seqlen", "128", "--heads", "2", "--head-dim", "16",
                 "--dtype", "float32", "--iters", "1"])
    out = capsys.readouterr().out
    errors = [float(x) for x in re.findall(r"max \|ring - one\| (\S+)", out)]
    assert len(errors) == 2 and max(errors) < 1e-5, out  # zigzag and contiguous
    assert "entry schedule" in out


def test_schedule_events_reads_permutes_and_kernel_calls():
    script = load_script("ring_timing")
    hlo = """HloModule m
ENTRY main {
  a = f32[2] collective-permute-start(x), source_target_pairs={{0,1}}
  b = (f32[2], f32[1]) custom-call(y), custom_call_target="jax_flash_fwd_v2"
  c = f32[2] collective-permute-done(a)
  d = f32[2] custom-call(z), custom_call_target="SomethingElse"
  e = f32[2] collective-permute(c), source_target_pairs={{0,1}}
}"""
    assert script.schedule_events(hlo) == ["cp-start", "jax_flash_fwd_v2", "cp-done", "cp"]
