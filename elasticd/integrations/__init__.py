"""The frameworks' own save and resume routed through memory snapshots: a PyTorch Lightning
``CheckpointIO`` (``lightning``) and a Hugging Face ``Trainer`` (``huggingface``).

Each module imports its framework at its top: import the one you use. Nothing else in elasticd
imports them, so elasticd works without either framework, and the daemon never loads them.
"""
