"""What ``status`` and ``events`` do once parsed: a request, its rendering, and a loop for
``--watch`` or ``-f``. Imported when such a command runs, never to parse one."""
