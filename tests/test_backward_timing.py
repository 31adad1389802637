"""scripts/backward_timing.py (the harness's sampling against the backward timed alone), on the CPU."""

import numpy as np

from helpers import load_script


def test_every_timing_is_positive_and_the_row_reads_them(capsys):
    m = load_script("backward_timing")
    floors = (0.0, 0.002)  # one blocked call per sample, then >= 2 ms samples
    ms = m.time_point("jax_flash", 1, 64, 2, 32, True, iters=2, rng=np.random.default_rng(0), floors=floors)
    for kind in ("fwd", "tot"):
        assert all(ms[kind, f] > 0 for f in floors)
    for f in floors:  # the backward is what the subtraction says it is
        assert ms["bwd", f] == ms["tot", f] - ms["fwd", f]
    assert ms["alone"] > 0
    row = m.table_row("jax_flash", "1,64,2,32", 1, ms, floors)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:3] == ["jax_flash", "1,64,2,32", "1"]
    assert float(cells[8]) == round(ms["bwd", floors[1]], 3)
    assert float(cells[9]) == round(ms["alone"], 3)
    # TFLOP/s from the same backward times: 2.5 x forward FLOPs (causal: half of 4*B*N*T*T*H).
    flop = 2.5 * 4 * 64 * 64 * 2 * 32 / 2
    assert cells[10].split(" / ")[2] == f"{flop / 1e9 / ms['alone']:.0f}"


def test_command_line_prints_the_header_and_one_row_per_point(capsys):
    m = load_script("backward_timing")
    m.FLOORS_S = (0.0, 0.001)
    m.main(["--shape", "1,64,2,32", "--causal", "0", "1", "--impl", "jax_flash", "--iters", "1"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| jax_flash")]
    assert [line.split("|")[3].strip() for line in lines] == ["0", "1"]
    assert "| fwd 0 ms | fwd 1 ms |" in m.header()
