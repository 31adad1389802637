"""scripts/ncu_stalls.py (gpu_check.sh's NCU_SOURCE summary) on a synthetic per-instruction ncu CSV."""

from helpers import load_script

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
          '"Instructions Executed","stall_wait","stall_long_sb","stall_lg","stall_wait (Not Issued)"')


def _row(address, source, samples, executed, wait, long_sb, lg):
    return f'"{address}","{source}","{samples}","0","{executed}","{wait}","{long_sb}","{lg}","999"'


def _lines():
    return [
        '"Kernel Name","void DkvKernel<bf16, 256, 1, 0>(AttentionParams, bool)",',
        HEADER,
        _row("0x7f00", "      HMMA.16816.F32.BF16 R4, R8, R12, R4", "1,000", "4096", 600, 0, 0),
        _row("0x7f10", "@P0   REDG.E.ADD.F32x2.FTZ.RN.STRONG.GPU desc[UR4][R2.64], R4", "300", "1024", 0, 0, 300),
        _row("0x7f20", "      LDC.64 R6, c[0x0][0x228]", "700", "1024", 0, 700, 0),
        _row("0x7f30", "      HMMA.16816.F32.BF16 R16, R8, R14, R16", "0", "4096", 0, 0, 0),
    ]


def test_opcode_drops_predicate_and_modifiers():
    m = load_script("ncu_stalls")
    assert m.opcode("@!P1 REDG.E.ADD.F32x2 [R2], R4") == "REDG"
    assert m.opcode("HMMA.16816.F32.BF16 R4, R8, R12, R4") == "HMMA"
    assert m.opcode("") == "?"


def test_summary_shares_by_reason_opcode_and_instruction():
    m = load_script("ncu_stalls")
    rows = m.read(_lines())
    assert len(rows) == 4
    # "(Not Issued)" columns are a subset of the samples and not counted again.
    assert rows[0]["stalls"] == {"wait": 600.0, "long_sb": 0.0, "lg": 0.0}
    text = m.summary(rows, top=2)
    assert text.startswith("2000 stall samples")
    assert "   35.0% long_sb" in text and "   30.0% wait" in text and "   15.0% lg" in text
    # Both HMMAs sum under one opcode, first by samples.
    ops = text.split("by opcode")[1].splitlines()[1:4]
    assert ops[0].split()[:3] == ["50.0%", "HMMA", "x2"]
    assert ops[1].split()[:2] == ["35.0%", "LDC"]
    top = text.split("top 2 instructions:")[1].splitlines()[1:]
    assert len(top) == 2 and "HMMA" in top[0] and "LDC.64" in top[1]


def test_output_without_the_source_page_reads_as_no_rows():
    m = load_script("ncu_stalls")
    assert m.read(["==ERROR== the report has no source page"]) == []


def test_levels_group_instructions_by_how_often_they_ran():
    m = load_script("ncu_stalls")
    rows = m.read(_lines())
    text = m.levels(rows)
    lines = text.splitlines()
    # 4096 runs (shown to two digits): the two HMMAs, 8192 of the 10240
    # executed; 1024: the other two.
    assert lines[1].split() == ["4100", "2", "80.0%", "50.0%"]
    assert lines[2].split() == ["1000", "2", "20.0%", "50.0%"]
