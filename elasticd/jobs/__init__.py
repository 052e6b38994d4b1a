"""Jobs: the spec, its states, the pure deciders, and the agent that takes part in a job on this node."""
