"""scripts/kernel_timeline.py (gpu_check.sh's NCU_TIMELINE summary) on synthetic ncu CSV output."""

import pytest

from helpers import load_script

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
          '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def _row(i, kernel, unit, value):
    return (f'"{i}","1","python3","host","{kernel}","1","14","(256, 1, 1)","(8, 1, 1)","0","9.0",'
            f'"Command line profiler metrics","gpu__time_duration.sum","{unit}","{value}"')


def _module():
    return load_script("kernel_timeline")


def test_durations_in_launch_order_with_units_and_totals_per_name():
    m = _module()
    lines = [
        "==PROF== Connected to process 1 (python3)",
        '==PROF== Profiling "DeltaAndClearKernel": 0%....50%....100% - 1 pass',
        HEADER,
        _row(0, "void DeltaAndClearKernel<bf16, 128>(AttentionParams, bool)", "usecond", "70.50"),
        _row(1, "void DkvKernel<bf16, 128, 1, 0>(AttentionParams, bool)", "msecond", "4.59"),
        _row(2, "void DqConvertKernel<bf16>(AttentionParams)", "nsecond", "51,200"),
        _row(3, "void DeltaAndClearKernel<bf16, 128>(AttentionParams, bool)", "usecond", "29.50"),
    ]
    launches = m.launches(lines)
    assert [name.split("<")[0] for name, _ in launches] == [
        "void DeltaAndClearKernel", "void DkvKernel", "void DqConvertKernel", "void DeltaAndClearKernel"]
    assert [us for _, us in launches] == pytest.approx([70.5, 4590.0, 51.2, 29.5])
    text = m.summary(launches)
    assert "4741.2 100.0%  total of 4 launches" in text
    # Both delta launches add up under one name (the argument list is dropped).
    assert "   100.0   2.1%  void DeltaAndClearKernel<bf16, 128>" in text


def test_short_unit_names_of_newer_ncu():
    # ncu 2025 (the H200's) writes "ns", "us", "ms" where older ones wrote "nsecond"...
    m = _module()
    lines = [HEADER, _row(0, "a()", "ns", "2,400"), _row(1, "b()", "us", "65.4"), _row(2, "c()", "ms", "1.25"),
             _row(3, "d()", "s", "0.5")]
    assert [us for _, us in m.launches(lines)] == pytest.approx([2.4, 65.4, 1250.0, 5e5])


def test_output_without_a_table_reads_as_no_launches():
    m = _module()
    assert m.launches(["==PROF== Connected to process 1", "==ERROR== no kernels were profiled"]) == []
    with pytest.raises(ValueError, match="unit"):
        m.launches([HEADER, _row(0, "k()", "cycle", "5")])
