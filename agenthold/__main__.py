"""The ``agenthold`` command (``python -m agenthold`` and the console script): a stdio call
goes through a warm server if one takes it (front.py, standard library only), else the command
line serves it (cli.py) and the process ends without the interpreter's teardown
(``cli.exit_now``).

A command line whose first word is a subcommand (the inspector, ``token``, ``backup``,
``retention``, ``compact``) or ``-h``, ``--help`` or ``--version`` never serves stdio, so it
goes straight to the command line: the front would only add its imports and find nothing to
do. Every other command line, which may serve stdio, tries the front first. ``agenthold hook
...`` (a coding host's edit hook, a new process on every edit) goes to agenthold.hooks alone,
past both."""

import sys

_NOT_SERVING = ("-h", "--help", "--version")


def _may_serve(args: list[str]) -> bool:
    return not args or (args[0].startswith("-") and args[0] not in _NOT_SERVING)


def main() -> int:
    args = sys.argv[1:]
    try:
        if args and args[0] == "hook":  # a coding host's edit hook: a fresh process per edit,
            from agenthold.hooks import end as hook_end  # so it imports the hooks' rooms alone
            from agenthold.hooks import main as hook_main

            hook_end(hook_main(args[1:]))
        if _may_serve(args):
            from agenthold.serve.front import try_warm

            status = try_warm(args)
            if status is not None:
                return status
        from agenthold.cli.main import exit_now
        from agenthold.cli.main import main as cli_main

        status = cli_main(args)
    except KeyboardInterrupt:  # Ctrl-C before the server's own handlers are in place (while
        return 130  # it imports, say): the shell's usual status for it, and no traceback
    exit_now(status)


if __name__ == "__main__":
    sys.exit(main())
