"""The local control plane: the ZeroMQ socket, its envelope, and one module per command."""
