"""scripts/compare_bench.py (the A/B table of scripts/gpu_ab.sh) on runs of the benchmark at tiny sizes
on the CPU and on hand-written results.json files."""

import json

import jax_flash.benchmark as benchmark
from helpers import load_script


def _compare_bench():
    return load_script("compare_bench")


def test_compare_bench_script(tmp_path, capsys):
    """scripts/compare_bench.py (the A/B table of scripts/gpu_ab.sh) reads two runs' JSON."""
    for name in ("a", "b"):
        benchmark.main(["--impl", "jax_flash", "--head-dim", "32", "--seqlen", "64", "--tokens", "64",
                        "--width", "64", "--causal", "0", "--iters", "1", "--dtype", "float32",
                        "--out", str(tmp_path / name)])
    compare = _compare_bench()
    capsys.readouterr()
    compare.main([f"a={tmp_path / 'a' / 'results.json'}", f"b={tmp_path / 'b' / 'results.json'}"])
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| impl | variant | H | T | causal | a fwd | a bwd | b fwd | b bwd |")
    row = table[2].split("|")
    assert row[1].strip() == "jax_flash" and "x)" in row[8] and "x)" in row[9], table


def test_compare_bench_merges_files_of_one_run(tmp_path, capsys):
    """A run given as comma-separated files (gpu_ab.sh's ';'-separated BENCH_ARGS sets) is their union."""
    common = ["--impl", "jax_flash", "--head-dim", "32", "--seqlen", "64", "--tokens", "64",
              "--width", "64", "--causal", "0", "--iters", "1", "--dtype", "float32"]
    benchmark.main(common + ["--out", str(tmp_path / "plain")])
    benchmark.main(common + ["--variant", "key_padding_mask", "--out", str(tmp_path / "mask")])
    compare = _compare_bench()
    capsys.readouterr()
    both = f"{tmp_path / 'plain' / 'results.json'},{tmp_path / 'mask' / 'results.json'}"
    compare.main([f"two={both}", f"one={tmp_path / 'plain' / 'results.json'}"])
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [r.split("|")[2].strip() for r in rows] == ["mask", "plain"], rows
    mask_row = rows[0].split("|")
    assert mask_row[8].strip() == "-", rows  # the one-file run has no mask point


def test_compare_bench_averages_repeated_rounds(tmp_path, capsys):
    """A point in several files of one run (repeated rounds) is their mean, with the spread after it."""
    def write(path, fwd, bwd):
        path.write_text(json.dumps({"rows": [dict(impl="jax_flash", variant="plain", head_dim=64, seqlen=128,
                                                  causal=False, fwd_tflops=fwd, bwd_tflops=bwd)]}))

    write(tmp_path / "r1.json", 100.0, 50.0)
    write(tmp_path / "r2.json", 110.0, 50.0)
    write(tmp_path / "base.json", 105.0, 25.0)
    compare = _compare_bench()
    capsys.readouterr()
    compare.main([f"base={tmp_path / 'base.json'}", f"two={tmp_path / 'r1.json'},{tmp_path / 'r2.json'}"])
    row = capsys.readouterr().out.splitlines()[2].split("|")
    assert row[6].strip() == "105.0" and row[7].strip() == "25.0", row
    assert row[8].strip() == "105.0 ±5% (1.00x)" and row[9].strip() == "50.0 ±0% (2.00x)", row


def test_compare_bench_reads_key_padding_mask_rows_as_mask(tmp_path, capsys):
    """Earlier runs named the mask variant key_padding_mask: their rows line up with today's mask rows."""
    for name, variant in (("old", "key_padding_mask"), ("new", "mask")):
        (tmp_path / f"{name}.json").write_text(json.dumps({"rows": [dict(
            impl="jax_flash", variant=variant, head_dim=128, seqlen=4096, causal=False, fwd_tflops=200.0,
            bwd_tflops=100.0)]}))
    compare = _compare_bench()
    capsys.readouterr()
    compare.main([f"old={tmp_path / 'old.json'}", f"new={tmp_path / 'new.json'}"])
    rows = capsys.readouterr().out.splitlines()[2:]
    assert len(rows) == 1 and rows[0].split("|")[2].strip() == "mask", rows
    assert rows[0].split("|")[8].strip() == "200.0 (1.00x)", rows
