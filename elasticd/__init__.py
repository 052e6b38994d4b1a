"""elasticd: elastic, fault-tolerant distributed PyTorch training, one daemon per host.

The daemon never imports torch; only ``elasticd.worker`` (a helper for training scripts) does,
and lazily.
"""

__version__ = "0.1.0"
