"""Scenario simulator: a live host (procfs, sysfs, fake NVML) rendered from a scenario file (SPEC.md)."""
