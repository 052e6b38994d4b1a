"""The daemon process: entry point, wiring and lifecycle."""
