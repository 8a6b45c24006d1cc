"""Shared foundations: paths, process groups and their guard, the hardware probe, error root and
neutral types.
"""
