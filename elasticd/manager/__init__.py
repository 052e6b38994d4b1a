"""Every job this node knows of: taking part (``jobs``), admission (``admitter``), cluster-wide
clean-up by one elected node (``janitor``), crash recovery (``recovery``), and the commands of
the control socket with their permission checks (``service``, ``access``)."""
