"""The files a patch or a shell command writes, read from its text without running anything.

Decisions behind it:
- A patch in Codex's ``apply_patch`` format names every file it touches on its header lines
  (``*** Update File:``, ``*** Add File:``, ``*** Delete File:``, and ``*** Move to:`` for the
  new name of a moved one): those are read exactly.
- A shell command is read only where it plainly writes a file: an output redirection
  (``>``, ``>>``, ``>|``, ``&>``), ``tee``, ``sed -i``, ``mv``, ``cp``, ``rm``, ``touch``,
  ``truncate``, and ``git checkout``/``git restore`` of named files; ``bash -c`` and ``sh -c``
  scripts are read the same way. Words with a ``$``, a backquote or a process substitution
  are not guessed at, and anything else (a script, an interpreter's ``-c``, ``find -delete``,
  ``xargs``, ``dd``, ...) is allowed unread: docs/hooks.md lists it. A glob in a file word is
  expanded against the command's directory, as the shell would.
- Commands are cut at ``;``, ``&&``, ``||``, ``|``, ``&`` and new lines by ``shlex`` with
  punctuation characters, so quoting is respected; a line shlex cannot split (an unclosed
  quote) writes nothing this reader can see.
"""

from __future__ import annotations

import glob
import os
import shlex

PATCH_HEADERS = ("*** Update File:", "*** Add File:", "*** Delete File:", "*** Move to:")
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "|&", ";;", "(", ")", "\n"})
_REDIRECTS = frozenset({">", ">>", ">|", "&>", "&>>"})
_PREFIXES = frozenset({"sudo", "env", "command", "nice", "nohup", "time", "exec", "builtin"})
_NOT_FILES = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty", "-"})
MAX_DEPTH = 3  # sh -c "sh -c '...'": nested scripts read this deep


def patch_paths(text: str) -> list[str]:
    """The files a patch in apply_patch's format touches, in order, each once."""
    found: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        for header in PATCH_HEADERS:
            if stripped.startswith(header):
                path = stripped[len(header) :].strip()
                if path and path not in found:
                    found.append(path)
    return found


def shell_paths(command: str, cwd: str, depth: int = 0) -> list[str]:
    """The files ``command`` plainly writes (relative to ``cwd`` where not absolute)."""
    try:
        lexer = shlex.shlex(command.replace("\n", " ; "), posix=True, punctuation_chars=";&|()<>")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        tokens = list(lexer)
    except ValueError:  # an unclosed quote or escape: not a command this reader can follow
        return []
    found: list[str] = []
    words: list[str] = []
    i = 0
    while i <= len(tokens):
        token = tokens[i] if i < len(tokens) else ";"
        if token in _REDIRECTS and i + 1 < len(tokens):
            if words and words[-1].isdigit():  # "2>file": the fd belongs to the redirection
                words.pop()
            target = tokens[i + 1]
            if target not in _NOT_FILES and not target.startswith("&"):
                found += _expand(target, cwd)
            i += 2
            continue
        if token in (">&", "<", "<<", "<<<", "<&", "<>"):
            i += 2  # input, a duplicated descriptor, a here-document's word: nothing written
            continue
        if token in _SEPARATORS or (token and set(token) <= set(";&|()<>")):
            found += _command_writes(words, cwd, depth)
            words = []
        else:
            words.append(token)
        i += 1
    return list(dict.fromkeys(found))


def _expand(word: str, cwd: str) -> list[str]:
    if "$" in word or "`" in word or not word:
        return []
    word = os.path.expanduser(word)
    if any(c in word for c in "*?["):
        matches = glob.glob(word if os.path.isabs(word) else os.path.join(cwd, word))
        return sorted(matches)
    return [word]


def _operands(args: list[str]) -> list[str]:
    """The arguments that are not options (everything after ``--`` is one)."""
    out: list[str] = []
    rest = False
    for a in args:
        if rest:
            out.append(a)
        elif a == "--":
            rest = True
        elif not a.startswith("-") or a == "-":
            out.append(a)
    return out


def _command_writes(words: list[str], cwd: str, depth: int) -> list[str]:
    while words and ("=" in words[0] and not words[0].startswith("=")) and "/" not in words[0]:
        words = words[1:]  # VAR=value before the command
    while words and os.path.basename(words[0]) in _PREFIXES:
        words = words[1:]
        while words and words[0].startswith("-"):
            words = words[1:]
    if not words:
        return []
    name, args = os.path.basename(words[0]), words[1:]
    targets: list[str] = []
    if name in ("sh", "bash", "dash", "zsh", "ksh") and depth < MAX_DEPTH:
        for i, a in enumerate(args[:-1]):
            if a.startswith("-") and not a.startswith("--") and "c" in a:
                return shell_paths(args[i + 1], cwd, depth + 1)
        return []
    if name in ("tee", "rm", "unlink", "shred"):
        targets = _operands(args)
    elif name == "touch":  # touching a directory writes none of the files in it
        targets = [a for a in _operands(args) if not _is_directory(a, cwd)]
    elif name == "truncate":
        targets = [a for a in _operands(args) if not _is_size_of(a, args)]
    elif name == "mv":
        operands = _operands(args)
        targets = _destination(operands, cwd) + _into_directory(operands, cwd)
    elif name in ("cp", "install", "ln"):
        operands = _operands(args)
        if "-t" in args or any(a.startswith("--target-directory") for a in args):
            targets = []  # the directory is an option's value: not read
        elif len(operands) >= 2:
            kept = [] if _is_directory(operands[-1], cwd) else [operands[-1]]
            targets = kept + _into_directory(operands, cwd)
    elif name == "sed" and _in_place(args):
        operands = _sed_operands(args)
        targets = operands
    elif name == "git":
        targets = _git_writes(args)
    found: list[str] = []
    for t in targets:
        if t not in _NOT_FILES:
            found += _expand(t, cwd)
    return found


def _is_directory(word: str, cwd: str) -> bool:
    return os.path.isdir(word if os.path.isabs(word) else os.path.join(cwd, word))


def _destination(operands: list[str], cwd: str) -> list[str]:
    """The operands less a last one that is a directory the sources go into: what lands in
    it is named by _into_directory, and the directory itself is not rewritten (a source that
    is a directory is: moving it moves every file in it)."""
    if len(operands) >= 2 and _is_directory(operands[-1], cwd):
        return operands[:-1]
    return operands


def _is_size_of(word: str, args: list[str]) -> bool:
    i = args.index(word)
    return i > 0 and args[i - 1] in ("-s", "--size", "-r", "--reference")


def _into_directory(operands: list[str], cwd: str) -> list[str]:
    """The names the sources get inside a destination that is a directory."""
    if len(operands) < 2:
        return []
    dest = operands[-1]
    full = dest if os.path.isabs(dest) else os.path.join(cwd, dest)
    if not os.path.isdir(full):
        return []
    return [os.path.join(dest, os.path.basename(s.rstrip("/"))) for s in operands[:-1]]


def _in_place(args: list[str]) -> bool:
    for a in args:
        if a == "--":
            return False
        if a.startswith("--in-place"):
            return True
        if a.startswith("-") and not a.startswith("--") and "i" in a[1:].split(".")[0]:
            return True  # -i, -i.bak, -Ei
    return False


def _sed_operands(args: list[str]) -> list[str]:
    """sed's files: its operands after the script (the first operand, unless -e or -f gave
    the script)."""
    script_given = False
    operands: list[str] = []
    skip = False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a in ("-e", "-f", "--expression", "--file"):
            script_given = True
            skip = True
        elif a.startswith(("--expression=", "--file=")):
            script_given = True
        elif a.startswith("-") and a != "-" and len(a) > 1:
            if a.endswith(("e", "f")) and not a.startswith("--") and i + 1 < len(args):
                script_given = True
                skip = True
        else:
            operands.append(a)
    return operands if script_given else operands[1:]


def _git_writes(args: list[str]) -> list[str]:
    """``git checkout [<tree>] -- FILE...`` and ``git restore FILE...``: the files."""
    while args and args[0].startswith("-"):  # git -C dir ...: not followed
        if args[0] == "-C":
            return []
        args = args[2:] if args[0] == "-c" else args[1:]  # -c name=value: a setting, skipped
    if not args:
        return []
    sub, rest = args[0], args[1:]
    if sub == "checkout" and "--" in rest:
        return rest[rest.index("--") + 1 :]
    if sub == "restore":
        return _operands(rest)
    if sub == "rm":
        return _operands(rest)
    return []
