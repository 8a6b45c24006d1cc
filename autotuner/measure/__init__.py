"""Measuring one config: load generator, monitor, evaluation against the SLA, capacity search
over load levels, bench, kernel profiles, the quality gate.
"""
