"""scripts/backward_timing.py (the harness's sampling against the backward timed alone), on the CPU."""

import numpy as np

from helpers import load_script


def test_every_timing_is_positive_and_the_backward_is_the_difference():
    m = load_script("backward_timing")
    floors = (0.0, 0.002)  # one blocked call per sample, then >= 2 ms samples
    ms = m.time_point("jax_flash", 1, 64, 2, 32, True, iters=2, rng=np.random.default_rng(0), floors=floors)
    for kind in ("fwd", "tot"):
        assert all(ms[kind, f] > 0 for f in floors)
    for f in floors:
        assert ms["bwd", f] == ms["tot", f] - ms["fwd", f]
    assert ms["alone"] > 0


def test_row_reads_the_times_and_counts_backward_flops():
    m = load_script("backward_timing")
    floors = (0.005, 0.1)
    ms = {("fwd", 0.005): 1.5, ("fwd", 0.1): 1.4, ("tot", 0.005): 6.5, ("tot", 0.1): 6.2,
          ("bwd", 0.005): 5.0, ("bwd", 0.1): 4.8, "alone": 4.75}
    row = m.table_row("jax_flash", "4,4096,16,128", 1, ms, floors)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:10] == ["jax_flash", "4,4096,16,128", "1", "1.500", "1.400", "6.500", "6.200", "5.000",
                          "4.800", "4.750"]
    # 2.5 x the causal forward's 4*B*N*T*T*H / 2 FLOPs = 687.2 GFLOP, per ms = TFLOP/s.
    gflop = 2.5 * 4 * 4 * 16 * 4096 * 4096 * 128 / 2 / 1e9
    assert cells[10] == f"{gflop / 5.0:.0f} / {gflop / 4.8:.0f} / {gflop / 4.75:.0f}" == "137 / 143 / 145"


def test_command_line_prints_the_header_and_one_row_per_point(capsys):
    m = load_script("backward_timing")
    m.FLOORS_S = (0.0, 0.001)
    m.main(["--shape", "1,64,2,32", "--causal", "0", "1", "--impl", "jax_flash", "--iters", "1"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| jax_flash")]
    assert [line.split("|")[3].strip() for line in lines] == ["0", "1"]
    assert "| fwd 0 ms | fwd 1 ms |" in m.header()
