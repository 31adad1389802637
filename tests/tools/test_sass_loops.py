"""scripts/sass_loops.py (kernel_report.sh's loop statistics) on a synthetic SASS listing."""

from helpers import load_script


def _module():
    return load_script("sass_loops")


def test_loops_are_backward_branches_with_their_bodies():
    m = _module()
    instrs = [
        (0x00, "MOV R1, c[0x0][0x28]"),
        (0x10, "LDSM.16.M88.4 R4, [R2]"),            # loop start
        (0x20, "HMMA.16816.F32.BF16 R8, R4, R6, R8"),
        (0x30, "@P0 BRA 0x60"),                       # forward branch: not a loop
        (0x40, "BAR.SYNC.DEFER_BLOCKING 0x0"),
        (0x50, "@P1 BRA 0x10"),                       # backward branch: loop 0x10-0x50
        (0x60, "EXIT"),
    ]
    (start, end, body), = list(m.loops(instrs))
    assert (start, end, len(body)) == (0x10, 0x50, 5)
    ops = [m.opcode(text) for _, text in body]
    assert ops == ["LDSM", "HMMA", "BRA", "BAR", "BRA"]


def test_short_name_of_the_mangled_kernels():
    m = _module()
    assert m.short_name("_ZN9jax_flash4cuda4sm8013ForwardKernelI13__nv_bfloat16Li128ELb0EEEvNS_15AttentionParamsE") \
        == "ForwardKernel<128, 0>"
    assert m.short_name("_ZN9jax_flash4cuda4sm809DkvKernelI13__nv_bfloat16Li256ELb1ELb0EEEvNS_15AttentionParamsE") \
        == "DkvKernel<256, 1, 0>"
    assert m.short_name("not_a_kernel") == "not_a_kernel"


def test_cheapest_path_takes_the_shorter_side_of_each_branch():
    m = _module()
    body = [
        (0x10, "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR16], R24"),
        (0x20, "@P0 BRA 0x60"),              # skips three: the shorter side
        (0x30, "R2UR UR4, R2"),
        (0x40, "R2UR UR5, R3"),
        (0x50, "IMAD R4, R5, R6, R7"),
        (0x60, "@!P1 BRA 0x200"),            # out of the body (a wait's retry): falls through
        (0x70, "@P2 BRA 0x90"),              # taken: 0x90, 0xa0, 0xb0; not: 0x80, 0xb0 (shorter)
        (0x80, "BRA 0xb0"),                  # unconditional: jumps
        (0x88, "BRA.DIV UR11, 0x300"),       # divergence check (unreached: 0x80 jumps past it)
        (0x90, "IMAD R4, R5, R6, R7"),
        (0xa0, "IMAD R4, R5, R6, R7"),
        (0xb0, "@P3 BRA 0x10"),              # the back edge
    ]
    # 0x10, 0x20, 0x60, 0x70, 0x80, 0xb0
    assert m.cheapest_path(body) == 6
    assert m.opcode("@!P0 HGMMA.64x64x16.F32.BF16 R24, gdesc[UR16], R24") == "HGMMA"


def test_cheapest_path_falls_through_divergence_checks():
    m = _module()
    body = [
        (0x10, "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR16], R24"),
        (0x20, "UMOV UR11, 0xffffffff"),
        (0x30, "BRA.DIV UR11, 0x400"),      # taken only by a diverged warp: falls through
        (0x40, "NOP"),
        (0x50, "@P3 BRA 0x10"),             # the back edge
    ]
    assert m.cheapest_path(body) == 5
