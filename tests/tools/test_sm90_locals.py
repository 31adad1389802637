"""scripts/sm90_locals.py (the sm90 kernels' local accesses by role) on a synthetic SASS listing."""

from helpers import load_script

# Prologue, then the consumer branch (setmaxnreg.inc, a key-block loop with
# HGMMA holding one spill, a spill after it) and the producer branch
# (setmaxnreg.dec, a copy loop without HGMMA holding one spill).
LISTING = """
        Function : _ZN9jax_flash4cuda4sm9013ForwardKernelI13__nv_bfloat16Li128ELi128ELNS1_8ScheduleE2ELNS1_8FeaturesE1EEEv
        /*0000*/                   STL [R1], R2 ;
        /*0010*/               @P0 BRA 0x100 ;
        /*0020*/                   USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xf0 ;
        /*0030*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR16], RZ, !UPT ;
        /*0040*/                   LDL R200, [R1+0x4] ;
        /*0050*/               @P1 BRA 0x30 ;
        /*0060*/                   STL [R1+0x8], R3 ;
        /*0070*/                   EXIT ;
        /*0100*/                   USETMAXREG.DEALLOC.CTAPOOL 0x18 ;
        /*0110*/                   LDL R7, [R1+0xc] ;
        /*0120*/               @P2 BRA 0x110 ;
        /*0130*/                   EXIT ;
"""


def test_local_accesses_by_role_and_loop():
    m = load_script("sm90_locals")
    (name, ins), = m.functions(LISTING).items()
    assert m.short(name) == "bf16 H128 N128 pingpong masks"
    r = m.analyze(ins)
    assert r["locals"] == {"prologue": 1, "consumer loop": 1, "consumer": 1, "producer": 1}
    assert r["highest"] == {"producer": 7, "consumer": 200}
    assert r["loops"] == [3]  # 0x30-0x50: the HGMMA loop; the producer's loop holds none
