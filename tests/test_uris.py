"""Tests for agenthold.claims.names: canonical resource names."""

from __future__ import annotations

import os
import re
import sys
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agenthold.claims import names as uris
from agenthold.claims.names import (
    MAX_INPUT_LENGTH,
    WORKSPACE_NAME_RE,
    Resolver,
    Resource,
    Walk,
    Workspace,
    default_workspace,
)
from agenthold.store import InvalidInputError

posix_only = pytest.mark.skipif(os.name != "posix", reason="needs POSIX paths and symlinks")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A workspace root with an upper-case letter in it, so case folding of the key shows."""
    path = tmp_path / "Proj"
    path.mkdir()
    return path


@pytest.fixture
def resolver(root: Path) -> Resolver:
    """One case-sensitive workspace named "default"."""
    return Resolver([Workspace.parse(f"default={root}")], case_insensitive=False)


def make_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


# --- Workspace.parse -------------------------------------------------------------------------


def test_parse_name_equals_absolute_path(root: Path) -> None:
    assert Workspace.parse(f"app={root}") == Workspace(name="app", root=str(root))


def test_parse_relative_path_is_made_absolute_against_the_given_cwd(tmp_path: Path) -> None:
    make_dir(tmp_path / "a" / "b")
    ws = Workspace.parse("app=a/./b/", cwd=str(tmp_path))
    assert ws == Workspace(name="app", root=str(tmp_path / "a" / "b"))


def test_parse_relative_path_defaults_to_the_process_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_dir(tmp_path / "sub")
    monkeypatch.chdir(tmp_path)
    assert Workspace.parse("app=sub").root == str(tmp_path / "sub")


def test_parse_absolute_path_is_named_after_its_directory(root: Path) -> None:
    assert Workspace.parse(str(root)) == Workspace(name="Proj", root=str(root))


def test_parse_normalises_the_root_lexically(root: Path) -> None:
    spelled = f"{root.parent}//x/..//{root.name}/"
    assert Workspace.parse(spelled) == Workspace(name="Proj", root=str(root))


@posix_only
def test_parse_keeps_a_symlinked_root_as_given(tmp_path: Path) -> None:
    real = make_dir(tmp_path / "real")
    (tmp_path / "link").symlink_to(real)
    assert Workspace.parse(f"app={tmp_path / 'link'}").root == str(tmp_path / "link")


def test_parse_absolute_path_with_equals_sign_is_a_path_not_a_name(tmp_path: Path) -> None:
    odd = make_dir(tmp_path / "a=b")
    assert Workspace.parse(f"ab={odd}").root == str(odd)
    with pytest.raises(InvalidInputError, match="name it explicitly with name=path"):
        Workspace.parse(str(odd))


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("", "workspace spec is empty"),
        ("my ws=/tmp", "workspace name 'my ws' in 'my ws=/tmp' is not valid"),
        ("=/tmp", "workspace name '' in '=/tmp' is not valid"),
        ("café=/tmp", "workspace name 'café'"),
        ("app=", "workspace spec 'app=' has no path; use name=path"),
        ("relative/dir", "'relative/dir' is neither name=path nor an absolute path"),
    ],
)
def test_parse_rejects_malformed_specs(spec: str, problem: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        Workspace.parse(spec)
    assert problem in str(caught.value)


def test_parse_rejects_a_directory_name_that_is_not_a_workspace_name(tmp_path: Path) -> None:
    spaced = make_dir(tmp_path / "my dir")
    with pytest.raises(InvalidInputError) as caught:
        Workspace.parse(str(spaced))
    message = str(caught.value)
    assert repr(str(spaced)) in message
    assert "'my dir'" in message
    assert "name=path" in message


@posix_only
def test_parse_rejects_the_filesystem_root_without_a_name() -> None:
    with pytest.raises(InvalidInputError, match="name it explicitly with name=path"):
        Workspace.parse("/")


def test_parse_rejects_a_missing_directory(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(InvalidInputError) as caught:
        Workspace.parse(f"app={missing}")
    assert repr(str(missing)) in str(caught.value)
    assert "is not an existing directory" in str(caught.value)


def test_parse_rejects_a_file_as_root(tmp_path: Path) -> None:
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(InvalidInputError, match=r"file\.txt.*is not an existing directory"):
        Workspace.parse(f"app={tmp_path / 'file.txt'}")


def test_workspace_rejects_an_invalid_name(root: Path) -> None:
    with pytest.raises(InvalidInputError, match="workspace name 'a/b' is not valid"):
        Workspace(name="a/b", root=str(root))


@pytest.mark.parametrize(("name", "root"), [(None, "/tmp"), ("app", None), ("app", b"/tmp")])
def test_workspace_rejects_a_name_or_root_that_is_not_a_string(name: Any, root: Any) -> None:
    with pytest.raises(InvalidInputError, match="must be a string"):
        Workspace(name=name, root=root)


def test_workspace_rejects_a_relative_root() -> None:
    with pytest.raises(InvalidInputError, match="workspace root 'rel' is not an absolute path"):
        Workspace(name="app", root="rel")


def test_workspace_name_pattern_is_letters_digits_underscore_and_hyphen() -> None:
    assert WORKSPACE_NAME_RE.fullmatch("My_ws-2")
    assert not WORKSPACE_NAME_RE.fullmatch("my.ws")
    assert not WORKSPACE_NAME_RE.fullmatch("")


def test_default_workspace_is_named_default_at_the_given_cwd(root: Path) -> None:
    assert default_workspace(str(root)) == Workspace(name="default", root=str(root))


def test_default_workspace_uses_the_process_cwd(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(root)
    assert default_workspace() == Workspace(name="default", root=str(root))


# --- Resolver construction -------------------------------------------------------------------


def test_resolver_without_workspaces_uses_default_at_cwd(root: Path) -> None:
    resolver = Resolver(cwd=str(root), case_insensitive=False)
    assert resolver.workspaces == (Workspace(name="default", root=str(root)),)
    assert resolver.resolve("a.py").key == f"file://{os.path.realpath(root)}/a.py"


def test_resolver_keeps_workspaces_in_configuration_order(tmp_path: Path) -> None:
    spaces = [Workspace.parse(f"{n}={make_dir(tmp_path / n)}") for n in ("b", "a", "c")]
    assert Resolver(spaces).workspaces == tuple(spaces)


def test_resolver_rejects_duplicate_workspace_names(tmp_path: Path) -> None:
    one, two = make_dir(tmp_path / "one"), make_dir(tmp_path / "two")
    with pytest.raises(InvalidInputError) as caught:
        Resolver([Workspace.parse(f"app={one}"), Workspace.parse(f"app={two}")])
    assert "workspace name 'app' is configured twice" in str(caught.value)
    assert repr(str(two)) in str(caught.value)


@pytest.mark.parametrize(
    ("platform", "expected"), [("darwin", True), ("win32", True), ("linux", False)]
)
def test_case_insensitivity_follows_the_platform_by_default(
    root: Path, monkeypatch: pytest.MonkeyPatch, platform: str, expected: bool
) -> None:
    monkeypatch.setattr(sys, "platform", platform)
    assert Resolver(cwd=str(root)).case_insensitive is expected


@pytest.mark.parametrize("flag", [True, False])
def test_case_insensitivity_can_be_set_explicitly(root: Path, flag: bool) -> None:
    assert Resolver(cwd=str(root), case_insensitive=flag).case_insensitive is flag


# --- accepted forms --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spelling",
    [
        "src/main.py",
        "./src/main.py",
        ".\\src\\main.py",
        "src\\main.py",
        "src//main.py",
        ".//src///main.py/",
        "  src/main.py\t\n",
        "file://default/src/main.py",
        "file://default//src\\main.py",
        "FILE://default/src/main.py",
    ],
)
def test_equivalent_relative_spellings_name_one_resource(
    resolver: Resolver, root: Path, spelling: str
) -> None:
    assert resolver.resolve(spelling) == Resource(
        uri="file://default/src/main.py",
        key=f"file://{os.path.realpath(root)}/src/main.py",
        kind="file",
        workspace="default",
        path="src/main.py",
    )


def test_absolute_path_inside_the_workspace_names_the_same_resource(
    resolver: Resolver, root: Path
) -> None:
    expected = resolver.resolve("src/main.py")
    assert resolver.resolve(str(root / "src" / "main.py")) == expected
    assert resolver.resolve(f"{root}//src//main.py/") == expected
    assert resolver.resolve(f"file://{root}/src/main.py") == expected


def test_absolute_path_with_backslashes_names_the_same_resource(
    resolver: Resolver, root: Path
) -> None:
    spelled = str(root / "src" / "main.py").replace("/", "\\")
    assert resolver.resolve(spelled) == resolver.resolve("src/main.py")


def test_absolute_path_may_point_at_a_file_that_does_not_exist_yet(
    resolver: Resolver, root: Path
) -> None:
    assert resolver.resolve(str(root / "new" / "file.py")).uri == "file://default/new/file.py"


def test_custom_resource_is_opaque_and_case_sensitive(resolver: Resolver) -> None:
    resource = resolver.resolve("custom://Deploy Lock/prod:eu//../x")
    assert resource == Resource(
        uri="custom://Deploy Lock/prod:eu//../x",
        key="custom://Deploy Lock/prod:eu//../x",
        kind="custom",
        workspace=None,
        path=None,
    )
    assert resolver.resolve("custom://deploy lock/prod:eu//../x") != resource


def test_custom_scheme_is_case_insensitive_but_the_name_is_not(resolver: Resolver) -> None:
    assert resolver.resolve("CUSTOM://Lock").uri == "custom://Lock"


def test_percent_escapes_are_kept_literally(resolver: Resolver, root: Path) -> None:
    resource = resolver.resolve("docs/a%20b.md")
    assert resource.uri == "file://default/docs/a%20b.md"
    assert resolver.resolve(resource.uri) == resource
    assert resolver.resolve("docs/a b.md") != resource
    assert resolver.filesystem_path(resource) == str(root / "docs" / "a%20b.md")


def test_unicode_is_normalised_to_nfc(resolver: Resolver) -> None:
    composed, decomposed = "caf\u00e9.md", "cafe\u0301.md"
    assert composed != decomposed
    assert resolver.resolve(decomposed) == resolver.resolve(composed)
    assert resolver.resolve(decomposed).path == composed
    assert resolver.resolve("custom://" + decomposed).uri == "custom://" + composed


def test_the_only_workspace_takes_bare_paths_whatever_its_name(root: Path) -> None:
    resolver = Resolver([Workspace.parse(f"app={root}")])
    assert resolver.resolve("x.py").uri == "file://app/x.py"


def test_the_default_workspace_takes_bare_paths_among_several(tmp_path: Path) -> None:
    other, default = make_dir(tmp_path / "other"), make_dir(tmp_path / "default")
    resolver = Resolver([Workspace.parse(str(other)), Workspace.parse(str(default))])
    assert resolver.resolve("x.py").uri == "file://default/x.py"
    assert resolver.resolve("file://other/x.py").uri == "file://other/x.py"


def test_bare_path_is_ambiguous_with_several_workspaces_and_no_default(tmp_path: Path) -> None:
    one, two = make_dir(tmp_path / "one"), make_dir(tmp_path / "two")
    resolver = Resolver([Workspace.parse(str(one)), Workspace.parse(str(two))])
    with pytest.raises(InvalidInputError) as caught:
        resolver.resolve("src/x.py")
    message = str(caught.value)
    assert "'src/x.py' is ambiguous" in message
    assert "'one', 'two'" in message
    assert "file://<name>/<path>" in message


@pytest.mark.parametrize("order", [1, -1])
def test_the_longest_containing_root_wins(tmp_path: Path, order: int) -> None:
    outer = make_dir(tmp_path / "outer")
    inner = make_dir(outer / "inner")
    spaces = [Workspace.parse(str(outer)), Workspace.parse(str(inner))][::order]
    resolver = Resolver(spaces, case_insensitive=False)
    assert resolver.resolve(str(inner / "a.py")).uri == "file://inner/a.py"
    assert resolver.resolve(str(outer / "a.py")).uri == "file://outer/a.py"
    # Every spelling of one file gives one URI: the one its absolute path gets.
    for spelling in ("file://outer/inner/a.py", "file://inner/a.py", str(inner / "a.py")):
        assert resolver.resolve(spelling).uri == "file://inner/a.py"
        assert resolver.resolve(spelling).key == resolver.resolve(str(inner / "a.py")).key
    with pytest.raises(InvalidInputError, match="names the root of workspace 'inner'"):
        resolver.resolve("file://outer/inner")


def test_a_bare_path_into_a_nested_workspace_is_named_in_the_nested_one(tmp_path: Path) -> None:
    outer = make_dir(tmp_path / "proj")
    make_dir(outer / "lib" / "vendor")
    resolver = Resolver(
        [
            Workspace("default", str(outer)),
            Workspace("lib", str(outer / "lib")),
            Workspace("vendor", str(outer / "lib" / "vendor")),
        ],
        case_insensitive=False,
    )
    assert resolver.resolve("lib/a.py").uri == "file://lib/a.py"
    assert resolver.resolve("./lib//vendor/x/y.c").uri == "file://vendor/x/y.c"
    assert resolver.resolve("file://lib/vendor/x/y.c").uri == "file://vendor/x/y.c"
    assert resolver.resolve("library.py").uri == "file://default/library.py"


def test_a_root_does_not_contain_its_sibling_with_a_longer_name(tmp_path: Path) -> None:
    make_dir(tmp_path / "proj")
    resolver = Resolver([Workspace.parse(str(tmp_path / "proj"))], case_insensitive=False)
    with pytest.raises(InvalidInputError, match="is outside every workspace"):
        resolver.resolve(str(tmp_path / "proj2" / "a.py"))


def test_equal_roots_resolve_absolute_paths_to_the_first_configured(root: Path) -> None:
    resolver = Resolver([Workspace.parse(f"b={root}"), Workspace.parse(f"a={root}")])
    assert resolver.resolve(str(root / "x.py")).uri == "file://b/x.py"
    assert resolver.resolve("file://a/x.py").uri == "file://b/x.py"  # one file, one URI
    assert resolver.resolve("file://b/x.py").uri == "file://b/x.py"


@posix_only
def test_a_filesystem_root_workspace_holds_any_absolute_path(root: Path) -> None:
    resolver = Resolver(
        [Workspace.parse("all=/"), Workspace.parse(f"proj={root}")], case_insensitive=False
    )
    hosts = resolver.resolve("/etc/hosts")
    assert hosts == Resource(
        uri="file://all/etc/hosts",
        key="file:///etc/hosts",
        kind="file",
        workspace="all",
        path="etc/hosts",
    )
    assert resolver.resolve("file:///etc/hosts") == hosts
    assert resolver.resolve("file://all/etc/hosts") == hosts
    assert resolver.filesystem_path(hosts) == "/etc/hosts"
    assert resolver.resolve(str(root / "x.py")).uri == "file://proj/x.py"
    with pytest.raises(InvalidInputError, match="names the root of workspace 'all'"):
        resolver.resolve("/")


@posix_only
def test_a_symlinked_root_matches_both_spellings(tmp_path: Path) -> None:
    real = make_dir(tmp_path / "real")
    link = tmp_path / "link"
    link.symlink_to(real)
    resolver = Resolver([Workspace.parse(f"app={link}")], case_insensitive=False)
    via_link = resolver.resolve(str(link / "src" / "a.py"))
    assert via_link.uri == "file://app/src/a.py"
    assert via_link.key == f"file://{os.path.realpath(real)}/src/a.py"
    assert resolver.resolve(str(real / "src" / "a.py")) == via_link
    assert resolver.filesystem_path(via_link) == str(link / "src" / "a.py")


# --- rejections ------------------------------------------------------------------------------


@pytest.mark.parametrize("blank", ["", "   ", "\t\n"])
def test_empty_input_is_rejected(resolver: Resolver, blank: str) -> None:
    with pytest.raises(InvalidInputError, match="resource is empty; pass a path"):
        resolver.resolve(blank)


def test_non_string_input_is_rejected(resolver: Resolver) -> None:
    with pytest.raises(InvalidInputError, match="must be a string, not int"):
        resolver.resolve(42)  # type: ignore[arg-type]


def test_input_at_the_length_limit_is_accepted(resolver: Resolver) -> None:
    text = "custom://" + "x" * (MAX_INPUT_LENGTH - len("custom://"))
    assert resolver.resolve(text).uri == text


def test_input_over_the_length_limit_is_rejected_and_quoted_truncated(
    resolver: Resolver,
) -> None:
    text = "a" * (MAX_INPUT_LENGTH + 1)
    with pytest.raises(InvalidInputError) as caught:
        resolver.resolve(text)
    message = str(caught.value)
    assert f"is {MAX_INPUT_LENGTH + 1} characters long" in message
    assert "'aaaa" in message and "'..." in message
    assert len(message) < 300


def test_input_whose_canonical_uri_is_over_the_limit_is_rejected(resolver: Resolver) -> None:
    text = "a" * MAX_INPUT_LENGTH
    with pytest.raises(InvalidInputError, match="would have a canonical URI of 1039 characters"):
        resolver.resolve(text)


REFUSED_CHARACTERS = (
    [("\x00", "control character '\\x00' (a null byte)")]
    + [(c, f"control character {c!r}") for c in "\x01\x1f\x7f\x80\x85\x9f"]
    + [(c, f"unpaired surrogate {c!r}") for c in "\ud800\udfff"]
    + [(c, f"invisible character U+{ord(c):04X}") for c in "\u202e\u200b\u2028\ufeff\u2066"]
)


@pytest.mark.parametrize(("refused", "named"), REFUSED_CHARACTERS)
def test_control_invisible_and_surrogate_characters_are_rejected(
    resolver: Resolver, refused: str, named: str
) -> None:
    """In paths and custom:// names alike, the message shows the name and names the character."""
    for text in (f"src/a{refused}b.py", f"custom://a{refused}b"):
        with pytest.raises(InvalidInputError) as caught:
            resolver.resolve(text)
        message = str(caught.value)
        assert repr(text) in message
        assert named in message


def test_the_joiners_that_spell_words_are_accepted_in_resource_names(resolver: Resolver) -> None:
    """ZWNJ and ZWJ are part of how Persian, Indic scripts and emoji are written."""
    assert resolver.resolve(
        "custom://\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"
    ).uri.endswith("\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645")


@pytest.mark.parametrize(
    "text",
    [
        "..",
        "../x.py",
        "src/../x.py",
        "src\\..\\x.py",
        "src/..",
        "./../x.py",
        "././x.py",
        "src/./x.py",
        "src/.",
        "file://default/../x.py",
        "file://default/./x.py",
    ],
)
def test_dot_segments_are_rejected(resolver: Resolver, text: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        resolver.resolve(text)
    message = str(caught.value)
    assert repr(text) in message
    assert "path traversal/dot segments are not allowed" in message
    assert "relative to the workspace root" in message


@pytest.mark.parametrize("tail", ["/../Proj/x.py", "/./x.py", "/x/.."])
def test_dot_segments_in_absolute_paths_are_rejected(
    resolver: Resolver, root: Path, tail: str
) -> None:
    with pytest.raises(InvalidInputError, match="path traversal/dot segments are not allowed"):
        resolver.resolve(f"{root}{tail}")


def test_names_that_merely_contain_dots_are_files(resolver: Resolver) -> None:
    for name in ("...", ".env", "a..b", "..x", "x."):
        assert resolver.resolve(f"src/{name}").path == f"src/{name}"


@pytest.mark.parametrize("text", [".", "./", ".\\", "file://default", "file://default/"])
def test_the_workspace_root_is_not_a_resource(resolver: Resolver, text: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        resolver.resolve(text)
    assert repr(text) in str(caught.value)
    assert "names the root of workspace 'default'" in str(caught.value)


@pytest.mark.parametrize("suffix", ["", "/", "//"])
def test_the_absolute_workspace_root_is_not_a_resource(
    resolver: Resolver, root: Path, suffix: str
) -> None:
    with pytest.raises(InvalidInputError, match="names the root of workspace 'default'"):
        resolver.resolve(f"{root}{suffix}")


def test_a_path_outside_every_workspace_is_rejected(resolver: Resolver, root: Path) -> None:
    outside = str(root.parent / "elsewhere" / "x.py")
    with pytest.raises(InvalidInputError) as caught:
        resolver.resolve(outside)
    message = str(caught.value)
    assert repr(outside)[:100] in message  # long inputs are cut in messages, not short ones
    assert "is outside every workspace" in message
    assert repr(str(root))[:100] in message


def test_an_unknown_workspace_is_rejected_and_the_known_ones_listed(
    resolver: Resolver,
) -> None:
    with pytest.raises(InvalidInputError) as caught:
        resolver.resolve("file://nope/x.py")
    message = str(caught.value)
    assert "unknown workspace 'nope' in 'file://nope/x.py'" in message
    assert "configured workspaces: 'default'" in message


@pytest.mark.parametrize("case_insensitive", [True, False])
def test_workspace_names_keep_their_case(root: Path, case_insensitive: bool) -> None:
    resolver = Resolver([Workspace.parse(f"App={root}")], case_insensitive=case_insensitive)
    assert resolver.resolve("x.py").uri == "file://App/x.py"
    with pytest.raises(InvalidInputError, match="unknown workspace 'app'"):
        resolver.resolve("file://app/x.py")


@pytest.mark.parametrize(
    ("text", "scheme"),
    [("http://x", "http"), ("s3://b/k", "s3"), ("git+ssh://h/r", "git+ssh"), ("C://x", "c")],
)
def test_an_unknown_scheme_is_rejected(resolver: Resolver, text: str, scheme: str) -> None:
    if os.name != "posix" and text == "C://x":
        pytest.skip("a drive letter on Windows")
    with pytest.raises(InvalidInputError) as caught:
        resolver.resolve(text)
    message = str(caught.value)
    assert f"unsupported scheme {scheme!r} in {text!r}" in message
    assert "custom://<name>" in message


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("file://", "'file://' has no workspace or path"),
        ("custom://", "'custom://' has no name; use custom://<name>"),
        ("custom://   ", "'custom://' has no name"),
    ],
)
def test_malformed_uris_are_rejected(resolver: Resolver, text: str, problem: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        resolver.resolve(text)
    assert problem in str(caught.value)


def test_a_last_segment_ending_in_whitespace_is_rejected(resolver: Resolver) -> None:
    with pytest.raises(InvalidInputError) as caught:
        resolver.resolve("src/a.py /")
    assert "'src/a.py /'" in str(caught.value)
    assert "last path segment 'a.py ' ends in whitespace" in str(caught.value)
    assert resolver.resolve("my dir /a.py").path == "my dir /a.py"
    assert resolver.resolve(" src/ a.py").path == "src/ a.py"


def test_rejections_are_value_errors(resolver: Resolver) -> None:
    with pytest.raises(ValueError):
        resolver.resolve("../x")


# --- case sensitivity ------------------------------------------------------------------------


@pytest.mark.parametrize("case_insensitive", [True, False])
def test_file_case_folding_follows_the_setting(root: Path, case_insensitive: bool) -> None:
    resolver = Resolver([Workspace.parse(f"default={root}")], case_insensitive=case_insensitive)
    upper, lower = resolver.resolve("Src/Main.PY"), resolver.resolve("src/main.py")
    real = os.path.realpath(root)
    if case_insensitive:
        assert upper == lower
        assert upper.uri == "file://default/src/main.py"
        assert upper.key == f"file://{real}/src/main.py".lower()
    else:
        assert upper != lower
        assert upper.uri == "file://default/Src/Main.PY"
        assert upper.key == f"file://{real}/Src/Main.PY"


@pytest.mark.parametrize("case_insensitive", [True, False])
def test_custom_names_are_case_sensitive_in_both_modes(root: Path, case_insensitive: bool) -> None:
    resolver = Resolver([Workspace.parse(f"default={root}")], case_insensitive=case_insensitive)
    assert resolver.resolve("custom://Lock").key == "custom://Lock"
    assert resolver.resolve("custom://Lock") != resolver.resolve("custom://lock")


@pytest.mark.parametrize("case_insensitive", [True, False])
def test_absolute_paths_match_the_root_case_insensitively_only_when_set(
    root: Path, case_insensitive: bool
) -> None:
    resolver = Resolver([Workspace.parse(f"default={root}")], case_insensitive=case_insensitive)
    shouted = str(root).upper() + "/SRC/A.PY"
    if case_insensitive:
        assert resolver.resolve(shouted).uri == "file://default/src/a.py"
    else:
        with pytest.raises(InvalidInputError, match="is outside every workspace"):
            resolver.resolve(shouted)


def test_case_folding_keeps_the_result_in_nfc(root: Path) -> None:
    resolver = Resolver([Workspace.parse(f"default={root}")], case_insensitive=True)
    path = resolver.resolve("\u0130stanbul.md").path  # "İ" lowers to "i" + combining dot
    assert path is not None
    assert path == unicodedata.normalize("NFC", path)
    assert resolver.resolve("file://default/" + path).path == path


# --- identity (Resource.key) -----------------------------------------------------------------


def test_one_root_under_two_names_is_one_key_and_one_uri(root: Path) -> None:
    resolver = Resolver([Workspace.parse(f"a={root}"), Workspace.parse(f"b={root}")])
    via_a, via_b = resolver.resolve("file://a/x.py"), resolver.resolve("file://b/x.py")
    assert via_a.uri == via_b.uri == "file://a/x.py"  # the first configured name
    assert via_a.key == via_b.key


def test_one_root_under_two_names_in_two_processes_is_one_key(root: Path) -> None:
    first = Resolver([Workspace.parse(f"default={root}")], case_insensitive=False)
    second = Resolver([Workspace.parse(f"proj={root}")], case_insensitive=False)
    assert first.resolve("x.py").key == second.resolve("x.py").key


def test_one_name_over_two_roots_is_two_keys(tmp_path: Path) -> None:
    first = Resolver(cwd=str(make_dir(tmp_path / "one")), case_insensitive=False)
    second = Resolver(cwd=str(make_dir(tmp_path / "two")), case_insensitive=False)
    in_first, in_second = first.resolve("x.py"), second.resolve("x.py")
    assert in_first.uri == in_second.uri == "file://default/x.py"
    assert in_first.key != in_second.key


@posix_only
def test_a_symlinked_root_and_its_target_are_one_key(tmp_path: Path) -> None:
    real = make_dir(tmp_path / "real")
    (tmp_path / "link").symlink_to(real)
    resolver = Resolver([Workspace.parse(f"a={tmp_path / 'link'}"), Workspace.parse(f"b={real}")])
    assert resolver.resolve("file://a/x.py").key == resolver.resolve("file://b/x.py").key


def test_the_key_is_file_scheme_plus_realpath_of_root_plus_path(
    resolver: Resolver, root: Path
) -> None:
    key = resolver.resolve("src/a.py").key
    assert key == "file://" + os.path.realpath(root).replace(os.sep, "/") + "/src/a.py"
    assert "//" not in key.removeprefix("file://")


# --- filesystem_path -------------------------------------------------------------------------


def test_filesystem_path_is_the_file_under_the_root(resolver: Resolver, root: Path) -> None:
    assert resolver.filesystem_path(resolver.resolve("src\\a.py")) == str(root / "src" / "a.py")


def test_filesystem_path_of_a_custom_resource_is_none(resolver: Resolver) -> None:
    assert resolver.filesystem_path(resolver.resolve("custom://lock")) is None


def test_filesystem_path_rechecks_a_hand_built_resource(resolver: Resolver) -> None:
    forged = Resource(
        uri="file://default/../etc/passwd",
        key="x",
        kind="file",
        workspace="default",
        path="../etc/passwd",
    )
    with pytest.raises(InvalidInputError, match="path traversal/dot segments"):
        resolver.filesystem_path(forged)
    stranger = Resource(uri="file://other/a", key="x", kind="file", workspace="other", path="a")
    with pytest.raises(InvalidInputError, match="unknown workspace 'other'"):
        resolver.filesystem_path(stranger)


# --- properties ------------------------------------------------------------------------------

PROPERTY_SETTINGS = settings(max_examples=300, deadline=None)

# Path segments a user could type: anything but separators and control characters, and not a
# dot segment. Surrounding whitespace is left out: the whole input is stripped, so " a" and "a"
# are one name but "./ a" is not.
SEGMENTS = st.text(
    alphabet=st.characters(exclude_categories=("Cc", "Cs"), exclude_characters="/\\"),
    min_size=1,
    max_size=6,
).filter(lambda s: s not in (".", "..") and s == s.strip())

# Raw material for hostile inputs: dot segments, empty segments, separators, case, Unicode.
HOSTILE_PIECES = st.sampled_from(
    ["..", ".", "", "a", "B", "é", "e\u0301", "İ", " x", "%2e%2e", "file:", "~", "...", "\\", "/"]
)


@pytest.fixture(scope="module")
def property_resolvers(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, Resolver]:
    root = tmp_path_factory.mktemp("prop") / "Root"
    root.mkdir()
    spaces = [Workspace.parse(f"default={root}")]
    return {flag: Resolver(spaces, case_insensitive=flag) for flag in (True, False)}


def hostile_text() -> st.SearchStrategy[str]:
    joined = st.lists(HOSTILE_PIECES | SEGMENTS, max_size=6).flatmap(
        lambda parts: st.sampled_from(["/", "\\", "//"]).map(lambda sep: sep.join(parts))
    )
    prefix = st.sampled_from(["", "./", ".\\", "/", "file://default/", "file:///", "custom://"])
    return st.one_of(
        st.text(st.characters(exclude_categories=()), max_size=30),
        st.tuples(prefix, joined).map("".join),
    )


def resolve_or_none(resolver: Resolver, text: str) -> Resource | None:
    try:
        return resolver.resolve(text)
    except InvalidInputError:
        return None


@PROPERTY_SETTINGS
@given(text=hostile_text(), case_insensitive=st.booleans())
def test_canonicalising_is_idempotent(
    property_resolvers: dict[bool, Resolver], text: str, case_insensitive: bool
) -> None:
    resolver = property_resolvers[case_insensitive]
    resource = resolve_or_none(resolver, text)
    if resource is not None:
        assert resolver.resolve(resource.uri) == resource


@pytest.mark.slow  # a long property search: seconds in one process
@PROPERTY_SETTINGS
@given(text=hostile_text(), case_insensitive=st.booleans())
def test_no_resolved_file_escapes_its_workspace(
    property_resolvers: dict[bool, Resolver], text: str, case_insensitive: bool
) -> None:
    resolver = property_resolvers[case_insensitive]
    resource = resolve_or_none(resolver, text)
    if resource is None or resource.kind == "custom":
        return
    assert resource.path
    assert all(segment not in ("", ".", "..") for segment in resource.path.split("/"))
    root = resolver.workspaces[0].root
    on_disk = resolver.filesystem_path(resource)
    assert on_disk is not None
    assert os.path.isabs(on_disk)
    assert os.path.commonpath([root, on_disk]) == root
    assert on_disk != root


@pytest.mark.slow  # a long property search: seconds in one process
@PROPERTY_SETTINGS
@given(segments=st.lists(SEGMENTS, min_size=1, max_size=5), case_insensitive=st.booleans())
def test_equivalent_spellings_always_agree(
    property_resolvers: dict[bool, Resolver], segments: list[str], case_insensitive: bool
) -> None:
    # "a:" + "//" + "b" is the URI "a://b", not a path with a doubled separator.
    assume(not re.match(r"[A-Za-z][A-Za-z0-9+.-]*:\Z", segments[0]))
    resolver = property_resolvers[case_insensitive]
    root = resolver.workspaces[0].root
    plain = "/".join(segments)
    spellings = [
        plain,
        "./" + plain,
        ".\\" + "\\".join(segments),
        "\\".join(segments),
        "//".join(segments),
        plain + "/",
        root + "/" + plain,
        root + "\\" + "\\".join(segments),
        "file://default/" + plain,
        "file://" + root + "/" + plain,
    ]
    canonical = {resolver.resolve(spelling) for spelling in spellings}
    assert len(canonical) == 1


# --- Aliases: symlinks and hard links --------------------------------------------------------


@posix_only
def test_a_symlinked_file_is_named_as_the_file_it_leads_to(root: Path, resolver: Resolver) -> None:
    (root / "AGENTS.md").write_text("rules")
    (root / "CLAUDE.md").symlink_to("AGENTS.md")
    via_link = resolver.resolve("CLAUDE.md")
    assert via_link == resolver.resolve("AGENTS.md")
    assert via_link.uri == "file://default/AGENTS.md"


@posix_only
def test_a_symlinked_parent_is_followed_even_for_a_file_not_yet_created(
    root: Path, resolver: Resolver
) -> None:
    make_dir(root / "real")
    (root / "alias").symlink_to(root / "real")
    assert resolver.resolve("alias/new.py").uri == "file://default/real/new.py"
    assert (
        resolver.resolve(str(root / "alias" / "new.py")).key == resolver.resolve("real/new.py").key
    )


@posix_only
@pytest.mark.parametrize(
    "spelling", ["etc-link/passwd", "etc-link/not-there", "file://default/etc-link/passwd"]
)
def test_a_symlink_that_leads_out_of_every_workspace_is_refused(
    tmp_path: Path, root: Path, resolver: Resolver, spelling: str
) -> None:
    outside = make_dir(tmp_path / "outside")
    (outside / "passwd").write_text("secret")
    (root / "etc-link").symlink_to(outside)
    with pytest.raises(InvalidInputError, match=r"symbolic link.*not a file inside any workspace"):
        resolver.resolve(spelling)


@posix_only
def test_a_symlinked_file_leading_out_is_refused(
    tmp_path: Path, root: Path, resolver: Resolver
) -> None:
    (tmp_path / "shadow").write_text("secret")
    (root / "innocent.txt").symlink_to(tmp_path / "shadow")
    with pytest.raises(InvalidInputError, match="symbolic link"):
        resolver.resolve("innocent.txt")


@posix_only
def test_a_symlink_into_another_workspace_names_the_file_there(tmp_path: Path) -> None:
    app = make_dir(tmp_path / "app")
    lib = make_dir(tmp_path / "lib")
    (lib / "core.py").write_text("")
    (app / "vendored").symlink_to(lib)
    resolver = Resolver([Workspace.parse(f"app={app}"), Workspace.parse(f"lib={lib}")])
    assert resolver.resolve("file://app/vendored/core.py").uri == "file://lib/core.py"


@posix_only
def test_a_symlink_to_a_workspace_root_is_refused(root: Path, resolver: Resolver) -> None:
    (root / "self").symlink_to(root)
    with pytest.raises(InvalidInputError, match="symbolic link"):
        resolver.resolve("self")


def test_an_existing_file_carries_its_device_and_inode(root: Path, resolver: Resolver) -> None:
    (root / "a.py").write_text("")
    found = os.stat(root / "a.py")
    assert resolver.resolve("a.py").file_id == f"{found.st_dev}:{found.st_ino}"
    assert resolver.resolve("missing.py").file_id is None
    make_dir(root / "pkg")
    assert resolver.resolve("pkg").file_id is None  # a directory cannot be hard-linked


@posix_only
def test_hard_links_share_a_file_id_but_keep_their_own_names(
    root: Path, resolver: Resolver
) -> None:
    (root / "AGENTS.md").write_text("rules")
    os.link(root / "AGENTS.md", root / "CLAUDE.md")
    first, second = resolver.resolve("AGENTS.md"), resolver.resolve("CLAUDE.md")
    assert first.file_id == second.file_id is not None
    assert first.uri != second.uri


@posix_only
def test_a_name_resolved_again_sees_what_changed_on_disk_since(
    root: Path, resolver: Resolver
) -> None:
    """The resolver keeps what a name means as text; what it leads to on disk is read every
    time: a file created, a directory turned into a link, a file replaced by a link leading out
    of the workspace, an error that goes away."""
    first = resolver.resolve("pkg/mod.py")
    assert (first.uri, first.file_id) == ("file://default/pkg/mod.py", None)
    make_dir(root / "pkg")
    (root / "pkg" / "mod.py").write_text("")
    found = os.stat(root / "pkg" / "mod.py")
    assert resolver.resolve("pkg/mod.py").file_id == f"{found.st_dev}:{found.st_ino}"
    (root / "pkg" / "mod.py").unlink()
    (root / "pkg").rmdir()
    make_dir(root / "real")
    (root / "pkg").symlink_to(root / "real")
    assert resolver.resolve("pkg/mod.py").uri == "file://default/real/mod.py"
    assert resolver.resolve("pkg/mod.py", follow_links=False).uri == first.uri
    (root / "pkg").unlink()
    make_dir(root / "pkg")
    (root / "pkg" / "mod.py").symlink_to("/etc/passwd")
    with pytest.raises(InvalidInputError, match="symbolic link"):
        resolver.resolve("pkg/mod.py")
    (root / "pkg" / "mod.py").unlink()
    assert resolver.resolve("pkg/mod.py") == first
    with pytest.raises(InvalidInputError, match="control character"):
        resolver.resolve("pkg/\x00")  # an error is not kept as a name
    with pytest.raises(InvalidInputError, match="control character"):
        resolver.resolve("pkg/\x00")


def test_the_names_a_resolver_keeps_are_bounded(
    monkeypatch: pytest.MonkeyPatch, resolver: Resolver
) -> None:
    monkeypatch.setattr(uris, "_NAMES_KEPT", 3)
    names = [f"n{i}.py" for i in range(10)]
    assert [resolver.resolve(n).path for n in names + names] == names + names
    assert len(resolver._names) <= 3


def test_a_path_that_does_not_exist_is_named_as_written(root: Path, resolver: Resolver) -> None:
    assert resolver.resolve("not/yet/here.py").uri == "file://default/not/yet/here.py"


@posix_only
def test_a_dangling_symlink_is_named_as_the_file_it_would_lead_to(
    root: Path, resolver: Resolver
) -> None:
    (root / "later.md").symlink_to("not-yet.md")
    resource = resolver.resolve("later.md")
    assert (resource.uri, resource.file_id) == ("file://default/not-yet.md", None)


@posix_only
def test_paths_resolved_with_one_walk_come_out_as_each_alone(
    root: Path, resolver: Resolver
) -> None:
    """A Walk spares the second look at a shared directory, never a look at a new name."""
    make_dir(root / "src")
    (root / "src" / "a.py").write_text("")
    (root / "link").symlink_to(root / "src")
    (root / "src" / "b.md").symlink_to("a.py")
    names = ["src/a.py", "src/new.py", "link/a.py", "src/b.md", "gone/x.py", "gone/y.py",
             "src/a.py", "src", "custom://lock"]  # fmt: skip
    walk = Walk()
    shared = [resolver.resolve(n, walk=walk) for n in names]
    alone = [resolver.resolve(n) for n in names]
    assert [(r, r.file_id) for r in shared] == [(r, r.file_id) for r in alone]
    assert shared[0].file_id is not None and shared[2].uri == shared[3].uri == shared[0].uri
    # the directories were seen once each, the files never kept: a walk is one call's view
    real = os.path.realpath(root)
    assert sorted(walk.seen) == [os.path.join(real, d) for d in ("gone", "link", "src")]
    both = [resolver.resolve_both(n, walk=walk) for n in names[:4]]
    assert [followed for _, followed in both] == alone[:4]
