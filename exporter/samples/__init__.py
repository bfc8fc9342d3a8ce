"""Typed, immutable samples: the contract between collectors (producers) and the derived layer (consumer).

One module per domain. Producers may add fields; nobody renames or removes one without updating every
consumer in the same change.
"""
