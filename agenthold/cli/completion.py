"""``agenthold completion bash|zsh``: a shell completion script, generated from the parser.

Decisions behind it:
- Generated from the argparse parser ``cli.build_parser`` makes, so every subcommand and flag
  the command has is completed and none that it lacks: nothing to keep in step by hand, and no
  dependency (argcomplete would be one, and would run Python on every Tab).
- The script is static: the words are written into it, so a Tab costs the shell nothing. It
  completes subcommands, the flags of the command before the cursor, the choices of a flag
  that has them, and file names after ``--db``, ``--auth-file`` and the like.
- The standard library only; nothing of the store, nothing of mcp.
"""

from __future__ import annotations

import argparse
import shlex

SHELLS = ("bash", "zsh")
_FILE_FLAGS = {"--db", "--auth-file", "--workspace"}


def add_completion_command(
    subcommands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    parser = subcommands.add_parser(
        "completion",
        help='print a shell completion script: eval "$(agenthold completion bash)"',
        description="Print a completion script for SHELL, made from this command's own "
        "options. For bash, add 'eval \"$(agenthold completion bash)\"' to ~/.bashrc; for zsh, "
        "'eval \"$(agenthold completion zsh)\"' to ~/.zshrc (after compinit).",
    )
    parser.add_argument("shell", choices=SHELLS, metavar="SHELL", help="bash or zsh")


def _flags(
    parser: argparse.ArgumentParser, valued: set[str]
) -> tuple[list[str], dict[str, list[str]]]:
    """The long and short flags of ``parser`` (hidden ones left out), and the choices of each
    flag that has them; the flags that take a value are added to ``valued``."""
    flags: list[str] = []
    choices: dict[str, list[str]] = {}
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or not action.option_strings:
            continue
        flags.extend(action.option_strings)
        if action.nargs != 0:
            valued.update(action.option_strings)
        if action.choices is not None and action.nargs != 0:
            for flag in action.option_strings:
                choices[flag] = [str(c) for c in action.choices]
        elif action.metavar in ("PATH",) or set(action.option_strings) & _FILE_FLAGS:
            for flag in action.option_strings:
                choices[flag] = ["__files__"]
    return flags, choices


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _words(values: list[str]) -> str:
    return shlex.quote(" ".join(values))


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of ``parser`` for ``shell`` (one of SHELLS)."""
    valued: set[str] = set()
    top_flags, choices = _flags(parser, valued)
    commands = _subparsers(parser)
    cases = []
    for name, sub in commands.items():
        flags, sub_choices = _flags(sub, valued)
        choices.update(sub_choices)
        nested = _subparsers(sub)
        if name == "completion":
            flags = list(SHELLS)
        elif nested:  # `token add|list|revoke`: the nested names first, then their flags
            cases.append(f"        {name}:) words={_words(list(nested))} ;;")
            for inner_name, inner in nested.items():
                inner_flags, inner_choices = _flags(inner, valued)
                choices.update(inner_choices)
                cases.append(f"        {name}:{inner_name}) words={_words(inner_flags)} ;;")
        cases.append(f"        {name}:*) words={_words(flags)} ;;")
    values = [
        f"        {flag}) "
        + ("files=1" if found == ["__files__"] else f"words={_words(found)}")
        + " ; done=1 ;;"
        for flag, found in sorted(choices.items())
    ]
    body = BODY.format(
        commands=_words(list(commands)),
        top=_words(top_flags),
        cases="\n".join(cases),
        values="\n".join(values),
        valued=_words(sorted(valued)),
    )
    return (BASH if shell == "bash" else ZSH).format(body=body)


# The shared logic, in the shell that bash and zsh (through bashcompinit) both run: the
# subcommand, and a nested one (`token add`), are the first words after `agenthold` that do not
# start with "-"; a word before the cursor that is a flag with a value gets that value completed.
BODY = """\
    local cur prev command="" nested="" words="" files=0 done=0 i valued={valued}
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in
            -*) case " $valued " in *" ${{COMP_WORDS[i]}} "*) i=$((i + 1)) ;; esac ;;
            *) if [ -z "$command" ]; then command="${{COMP_WORDS[i]}}"
               elif [ -z "$nested" ]; then nested="${{COMP_WORDS[i]}}"; fi ;;
        esac
    done
    case "$prev" in
{values}
    esac
    if [ "$done" = 0 ]; then
        if [ -z "$command" ]; then
            case "$cur" in
                -*) words={top} ;;
                *) words={commands} ;;
            esac
        else
            case "$command:$nested" in
{cases}
            esac
        fi
    fi
"""

BASH = """\
# agenthold completion for bash: eval "$(agenthold completion bash)"
_agenthold() {{
{body}    if [ "$files" = 1 ]; then
        COMPREPLY=($(compgen -f -- "$cur"))
    else
        COMPREPLY=($(compgen -W "$words" -- "$cur"))
    fi
}}
complete -o default -F _agenthold agenthold
"""

ZSH = """\
#compdef agenthold
# agenthold completion for zsh: eval "$(agenthold completion zsh)" (after compinit)
autoload -U +X bashcompinit && bashcompinit
_agenthold() {{
{body}    if [ "$files" = 1 ]; then
        COMPREPLY=($(compgen -f -- "$cur"))
    else
        COMPREPLY=($(compgen -W "$words" -- "$cur"))
    fi
}}
complete -o default -F _agenthold agenthold
"""
