"""GPU access over NVML. ``backend`` is the only module that calls NVML, and imports ``pynvml`` lazily so the
package installs and runs on hosts with no NVIDIA driver."""
