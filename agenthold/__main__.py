"""The ``agenthold`` command (``python -m agenthold`` and the console script): a stdio call
goes through a warm server if one takes it (front.py, standard library only), else the command
line serves it (cli.py) and the process ends without the interpreter's teardown
(``cli.exit_now``)."""

import sys


def main() -> int:
    from agenthold.front import try_warm

    args = sys.argv[1:]
    try:
        status = try_warm(args)
        if status is not None:
            return status
        from agenthold.cli import exit_now
        from agenthold.cli import main as cli_main

        status = cli_main(args)
    except KeyboardInterrupt:  # Ctrl-C before the server's own handlers are in place (while
        return 130  # it imports, say): the shell's usual status for it, and no traceback
    exit_now(status)


if __name__ == "__main__":
    sys.exit(main())
