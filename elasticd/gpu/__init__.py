"""A host's GPUs: the NVML seam (``nvml.py``, ``fake.py``), what is read through it (``read.py``),
and the pure deciders over those readings (health, placement)."""
