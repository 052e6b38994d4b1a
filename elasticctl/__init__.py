"""elasticctl: the command-line client of the local elasticd."""
