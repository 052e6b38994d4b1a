"""Jobs: the spec, its state machine, the pure deciders, and the supervisor that carries them out."""
