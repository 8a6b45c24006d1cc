"""Measuring one config: workload, load generator, monitor, evaluation, bench, engine-version
comparison.
"""
