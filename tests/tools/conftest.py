"""Tests of the development scripts in scripts/ (profilers' summaries, SASS loop
counters, kernel timelines, timing probes, the A/B table): not the product's
contract, which is the tests one folder up, but run with them (`pytest tests`
collects this folder). tests/conftest.py applies here as well; this puts tests/
on sys.path so that `helpers` imports however the files are collected."""

import os
import sys

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
