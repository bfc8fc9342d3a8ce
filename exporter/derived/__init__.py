"""The derived layer: pure functions over sample windows (no I/O, no clock reads, no globals).

``series`` (activity, burstiness, idle gaps) -> ``gpuview`` (one GPU over the window) and ``hostshape``
(CPU shape, storage and network-FS stalls) -> ``verdict`` (the bottleneck per GPU, hysteresis) and
``findings`` (platform checks). ``exporter.analysis`` is the stateful glue that feeds them.
"""
