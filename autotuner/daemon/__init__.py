"""The autotuner daemon: a queue of studies, nightly re-checks, engine-upgrade regression checks.

Jobs run as child processes (``autotuner tune``, ``autotuner bench``,
``autotuner compare-engines``), so a crash in one never takes the service down, and their
engines are reaped the same way as on the command line.
"""
