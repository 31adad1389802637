"""scripts/sass_lines.py (ncu's per-instruction counts by source line) on a
synthetic nvdisasm listing and ncu CSV."""

import pytest

from helpers import load_script

LISTING = """
.text._Z6kernelv:
	//## File "/src/ffi/cuda/sm90/softmax.cuh", line 31 inlined at "/src/ffi/cuda/sm90/fwd_kernel.cuh", line 261
	//## File "/src/ffi/cuda/sm90/fwd_kernel.cuh", line 261
        /*0000*/                   FMNMX R1, R2, R3, !PT ;
        /*0010*/                   IMAD R4, R16.reuse, UR5, RZ ;
	//## File "/src/ffi/cuda/sm90/fwd_kernel.cuh", line 433
        /*0020*/              @!P0 BRA `(.L_x_3) ;
.L_x_3:
        /*0030*/                   EXIT ;
.text._Z5otherv:
        /*0000*/                   EXIT ;
"""

CSV_HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed",'
              '"stall_wait","stall_selected"')


def _csv(rows):
    lines = ['"Kernel Name","kernel()"', CSV_HEADER]
    lines += [f'"{a}","{s}","{n}","{e}","{n}","0"' for a, s, n, e in rows]
    return lines


def _module():
    return load_script("sass_lines")


def test_listing_gives_each_instruction_its_inlining_chain():
    m = _module()
    functions = m.parse(LISTING)
    assert set(functions) == {"_Z6kernelv", "_Z5otherv"}
    code = functions["_Z6kernelv"]
    assert [off for off, _, _ in code] == [0x00, 0x10, 0x20, 0x30]
    assert code[0][2] == (("/src/ffi/cuda/sm90/softmax.cuh", 31), ("/src/ffi/cuda/sm90/fwd_kernel.cuh", 261))
    assert code[1][2] == code[0][2]                     # the chain holds until the next one
    assert code[2][2] == (("/src/ffi/cuda/sm90/fwd_kernel.cuh", 433),)
    assert code[3][2] == code[2][2]                     # a label line does not end it


def test_profile_matches_by_offset_and_counts_go_to_lines():
    m = _module()
    rows = m.read(_csv([("0x7f0000", "FMNMX R1, R2, R3, !PT", 5, 100),
                        ("0x7f0010", "IMAD R4, R16, UR5, RZ", 1, 100),     # ncu prints no .reuse
                        ("0x7f0020", "@!P0 BRA 0x7f0030", 0, 40),          # absolute target
                        ("0x7f0030", "EXIT", 2, 4)]))
    name, code = m.match(rows, m.parse(LISTING))
    assert name == "_Z6kernelv"
    inner = m.by_line(rows, code, None)
    assert inner[("/src/ffi/cuda/sm90/softmax.cuh", 31)] == [2, 200, 6]
    assert inner[("/src/ffi/cuda/sm90/fwd_kernel.cuh", 433)] == [2, 44, 2]
    # --frame: the innermost frame in the named file (the kernel line that inlined the helper).
    outer = m.by_line(rows, code, "fwd_kernel.cuh")
    assert outer[("/src/ffi/cuda/sm90/fwd_kernel.cuh", 261)] == [2, 200, 6]


def test_a_profile_of_other_code_is_refused():
    m = _module()
    rows = m.read(_csv([("0x10", "FMNMX R1, R2, R3, !PT", 1, 1), ("0x20", "IADD3 R9, R9, 1, RZ", 1, 1),
                        ("0x30", "BRA 0x10", 0, 1), ("0x40", "EXIT", 0, 1)]))
    with pytest.raises(ValueError, match="no local function matches"):
        m.match(rows, m.parse(LISTING))
