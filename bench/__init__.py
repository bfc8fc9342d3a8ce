"""gpufeed benchmarks: the budgets of DESIGN.md measured against the real daemon and its peers.

Entry point: ``python bench/run.py`` (``make bench``). Every load is on 127.0.0.1, bounded in count
and time, and every process a benchmark starts is stopped before it returns.
"""
