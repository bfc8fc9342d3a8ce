"""Registers the derived layer (``exporter.analysis.Analyzer``) as collector ``derived``.

It reads no files: it classifies the other samplers' buffers. Registering it gives its options the usual
``--collector.derived.<option>`` flags and config keys, and ``--no-collector.derived`` turns it off.
"""

from __future__ import annotations

from exporter.analysis import Analyzer
from exporter.collectors import register

register(Analyzer)

__all__ = ["Analyzer"]
