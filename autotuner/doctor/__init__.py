"""`autotuner doctor`: checks before a single launch, each saying what it found, whether it
is a problem (ok / warning / fatal) and what to do.

gpu (NVML or nvidia-smi) and gpu_findings: the GPUs; torchprobe and engine_findings: torch in
the engine's interpreter against the driver and the GPUs; features: the SLA's options against
the engine version and the hardware; host: disk, shared memory, cores, RAM; run: one report.
"""
