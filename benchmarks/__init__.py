"""IdeGym benchmarks: each measures a figure next to its baseline in the same run.

Run all with ``make bench`` or ``python -m benchmarks``; one with ``python -m benchmarks <name>``.
"""
