"""gpufeed: is each GPU working, or waiting -- and if waiting, on what."""

__version__ = "0.1.0"
