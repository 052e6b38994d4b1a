"""``elasticctl``'s exit codes, in one place."""

EXIT_UNREACHABLE = 1  # the daemon cannot be reached
EXIT_USAGE = 2
EXIT_DAEMON_ERROR = 3  # the daemon reported an error (its stable code is printed)
EXIT_JOB_FAILED = 4  # a followed job ended FAILED or KILLED
EXIT_CHECK_FAILED = 5  # ``check``: a node failed its check, or is far below the others
EXIT_INTERRUPTED = 130  # Ctrl-C while following (the job keeps running)
