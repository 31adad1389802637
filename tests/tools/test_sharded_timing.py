"""scripts/sharded_timing.py (sharded jit over batch and heads: no collective,
speed-up over one device) at a tiny size on two host devices: the batch and
heads splits pass with the one-device results, and its HLO check fails the
sequence split, whose rules gather (the negative control), and reads every
form a collective takes in compiled HLO."""

import json
import re

import jax
import pytest

from helpers import load_script

# The timed runs need two devices of the default backend: the CPU suite has four host devices
# (tests/conftest.py); a one-GPU machine has one, and the scripts refuse a smaller mesh.
two_devices = pytest.mark.skipif(len(jax.devices()) < 2, reason="needs 2 devices of the default backend")

TINY = ["--devices", "2", "--batch", "2", "--seqlen", "64", "--heads", "2", "--head-dim", "16",
        "--dtype", "float32", "--iters", "1"]


@two_devices
def test_batch_and_heads_have_no_collective(tmp_path, capsys):
    script = load_script("sharded_timing")
    path = tmp_path / "sharded.json"
    rows = script.main(TINY + ["--json", str(path)])
    out = capsys.readouterr().out
    assert [r["split"] for r in rows] == ["batch", "heads"]
    for r in rows:
        assert r["collectives"] == {"fwd": [], "fwd_bwd": []} and r["kernels_on_shards"], r
        assert r["max_error"] < 1e-6 and r["speedup_fwd_bwd"] > 0, r
    assert "kernels on f32[1,64,2,16]" in out and "kernels on f32[2,64,1,16]" in out, out
    assert len(re.findall(r"fwd\+bwd \S+ ms \(\S+x = \d+% of linear\)", out)) == 2, out
    assert json.loads(path.read_text())[0]["split"] == "batch"


@two_devices
def test_sequence_split_fails_the_check(capsys):
    script = load_script("sharded_timing")
    with pytest.raises(SystemExit) as exit_:
        script.main(TINY + ["--splits", "sequence"])
    assert exit_.value.code == 1
    out = capsys.readouterr().out
    assert "sequence: FAIL, collectives" in out and "all-gather" in out, out
    assert "FAILED: sequence" in out


def test_collectives_reads_every_form():
    script = load_script("sharded_timing")
    hlo = """HloModule m
%wrapped_all_gather {
  ROOT %all-gather.1 = bf16[4,8]{1,0} all-gather(bf16[2,8]{1,0} %p), dimensions={0}
}
ENTRY main {
  %a = f32[2]{0} all-reduce(%x), to_apply=%add
  %b = (f32[4], f32[4]) all-reduce-start(%y), to_apply=%add
  %c = (f32[4], f32[4]) all-reduce-done(%b)
  %d = (bf16[2,8]{1,0}, bf16[2,8]{1,0}, u32[], u32[]) collective-permute-start(%z), source_target_pairs={{0,1}}
  %e = bf16[2,8]{1,0} collective-permute-done(%d)
  %f = f32[8]{0} reduce-scatter(%w), dimensions={0}, to_apply=%add
  %g = f32[8]{0} all-to-all(%w), dimensions={0}
  %h = f32[8]{0} custom-call(%w), custom_call_target="jax_flash_fwd_v5"
  %i = f32[8]{0} add(%w, %w), metadata={op_name="all-reduce"}
}"""
    assert [op for op, _ in script.collectives(hlo)] == [
        "all-gather", "all-reduce", "all-reduce", "collective-permute", "reduce-scatter", "all-to-all"]
    assert script.kernel_results(hlo) == ["f32[8]{0}"]
    assert script.collectives(hlo.split("%a =")[0].replace("all-gather(", "copy(")) == []
