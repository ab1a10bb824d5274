"""The README and docs/ tell the truth about the tree: links resolve, quoted commands parse, the code
map names every module.

- Every relative link in README.md and docs/*.md points at a file that exists, and at a heading that
  exists when it names an #anchor (GitHub's rule for heading anchors).
- Every `python -m simpar ...` / `simpar SUBCOMMAND ...` command quoted in them (in code blocks and
  inline code) parses with simpar's own parsers: `plan` and `--help` commands run (no MPI needed,
  exit 0); `train` and `tour` commands parse without running, and a `train` command with a known world
  size (`mpiexec -n N`, or one process) also passes `config.validate`; `bench`, `plot` and `debug`
  commands parse with their own parser, stopped before they run.
- The map in docs/design.md names every module under simpar/ and kernels/, and no module that is not
  there; the README's folder table names every package folder. Every `*.py` path the pages mention
  exists.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from tests.paths import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^ *```[^\n]*\n(.*?)^ *```", re.S | re.M)
SUBCOMMANDS = ("tour", "train", "plan", "bench", "plot", "debug")


def _rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _prose(text: str) -> str:
    """The page without fenced code blocks and inline code (links there are not links)."""
    return re.sub(r"`[^`]*`", "", FENCE.sub("", text))


# -- links -----------------------------------------------------------------------------------------


def github_anchor(heading: str) -> str:
    """GitHub's heading id: lower case, punctuation dropped (letters, digits, _, - and spaces kept),
    each space a hyphen. "When does parallelism pay off? The simulated clock" ->
    "when-does-parallelism-pay-off-the-simulated-clock"."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found, seen = set(), {}
    for line in FENCE.sub("", page.read_text()).splitlines():
        m = re.match(r"#{1,6} +(.+?) *#*$", line)
        if m:
            slug = github_anchor(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            found.add(slug if n == 0 else f"{slug}-{n}")  # a repeated heading gets -1, -2, ...
    return found


def links(page: Path) -> list[str]:
    return re.findall(r"!?\[[^\]]*\]\(([^)\s]+)(?: \"[^\"]*\")?\)", _prose(page.read_text()))


def broken_links(page: Path) -> list[str]:
    bad = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # https:, mailto: -- not ours to check offline
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target} (no heading #{anchor} in {dest.name})")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_relative_link_resolves(page):
    assert links(page), f"{_rel(page)} links nowhere (the pages link to each other)"
    assert broken_links(page) == [], _rel(page)


def test_anchor_rule_matches_github():
    assert github_anchor("When does parallelism pay off? The simulated clock") == (
        "when-does-parallelism-pay-off-the-simulated-clock"
    )
    assert github_anchor("Bruck's all-to-all") == "brucks-all-to-all"
    assert github_anchor("`train` options") == "train-options"


# -- quoted commands -------------------------------------------------------------------------------


def snippets(text: str) -> list[str]:
    """Every line of every code block (backslash continuations joined) and every inline code span."""
    out = []
    for block in FENCE.findall(text):
        out += block.replace("\\\n", " ").splitlines()
    out += [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", FENCE.sub("", text))]
    return out


# `python -m simpar ...`, `mpiexec -n 4 python -m mpi4py -m simpar ...`, `simpar plan ...`, and an inline
# `plan --pp 4 ...` (a subcommand with options, as the prose quotes them; `a|b` choice lists are not commands)
LAUNCH = re.compile(
    r"(?:^|\s)(?:python3? -m mpi4py -m simpar|python3? -m simpar)(?=\s|$)|^simpar(?= \w)"
    r"|^(?=(?:tour|train|plan|bench|plot|debug) -[^|]*$)"
)


def commands(page: Path) -> list[tuple[int | None, list[str]]]:
    """(world size or None when unknown, argv) for each simpar command the page quotes."""
    found = []
    for snippet in snippets(page.read_text()):
        for piece in re.split(r" : |;|&&|\|\s", snippet):  # MPMD parts, command lists, pipes
            m = LAUNCH.search(piece)
            if not m:
                continue
            rest = re.split(r"\s#", piece[m.end() :])[0]  # a comment
            rest = re.sub(r"\[([^\]]*)\]", r"\1", rest)  # [--sp], [--kernels numba]: check the option too
            argv = shlex.split(rest)
            if m.group(0).strip() in ("simpar", "") and (not argv or argv[0] not in SUBCOMMANDS):
                continue  # prose: "simpar numbers ranks", not a command
            launcher = piece[: m.start()]
            n = re.search(r"-n (\d+)", launcher)
            if not m.group(0):  # a bare `train --dp 2 ...`: the world size is not given
                if sum(a.startswith("--") for a in argv) < 2:
                    continue  # `plan --compare`: the prose naming an option, not a command
                world = None
            else:
                world = int(n.group(1)) if n else (None if re.search(r"mpiexec|srun", launcher) else 1)
            found.append((world, argv))
    return found


def is_template(argv: list[str]) -> bool:
    """`plan --tp T --sp ...`: a pattern to fill in, not a command."""
    return any(a == "..." or re.fullmatch(r"[A-Z]|FILE(\.json)?|DIR|my\.json", a) for a in argv)


class Parsed(BaseException):
    """Raised by the patched parsers once the arguments parsed: stops a subcommand before it runs.
    A BaseException, so that cli.main's `except Exception` (a bug on one rank) does not catch it."""

    def __init__(self, namespace):
        super().__init__()
        self.namespace = namespace  # not `args`: BaseException keeps its own tuple there


def parse_only(monkeypatch, argv: list[str]):
    """simpar's own parser for argv (the subcommand's, as cli.main dispatches), stopped after
    parsing. Returns the argparse namespace, or raises AssertionError with simpar's error line."""
    from simpar.cli import base, main

    original = base.Parser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise Parsed(original(self, args, namespace))

    monkeypatch.setattr(base.Parser, "parse_args", parse_then_stop)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            rc = main(list(argv))
    except Parsed as done:
        return done.namespace
    finally:
        monkeypatch.setattr(base.Parser, "parse_args", original)
    raise AssertionError(f"{shlex.join(argv)}: exit {rc}: {err.getvalue().strip()}")


def check_command(world, argv, monkeypatch, tmp_path) -> None:
    from simpar.cli import main
    from simpar.cli.train import config_from_args
    from simpar.config import validate

    command = argv[0] if argv and argv[0] in SUBCOMMANDS else "tour"
    if command == "plan" or "--help" in argv or "-h" in argv:
        monkeypatch.chdir(tmp_path)  # plan --sweep ... -o sweep.png writes here
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(list(argv))
        assert rc == 0, f"{shlex.join(argv)}: exit {rc}: {err.getvalue().strip()}"
        assert out.getvalue().strip(), f"{shlex.join(argv)} printed nothing"
        return
    args = parse_only(monkeypatch, argv)
    if command == "train":
        from simpar.config import SimparError

        try:
            cfg = config_from_args(args)
            if world is not None:
                validate(cfg, world)
        except SimparError as exc:
            raise AssertionError(f"{shlex.join(argv)} on {world} rank(s): {exc}") from None


class Crashed(BaseException):
    """cli.main met an unexpected exception: it would end the process (MPI_Abort); end the test instead."""


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_quoted_command_parses(page, monkeypatch, tmp_path):
    from simpar.runtime import flight

    def crash(message=None, *rest, **kw):
        raise Crashed(message)

    monkeypatch.setattr(flight, "fatal", crash)
    quoted = [(w, a) for w, a in commands(page) if not is_template(a)]
    failures = []
    for world, argv in quoted:
        try:
            check_command(world, argv, monkeypatch, tmp_path)
        except AssertionError as exc:
            failures.append(str(exc))
    assert failures == [], _rel(page)


def test_the_pages_quote_commands_of_every_kind():
    """The extraction finds what the pages show (so a page whose commands all vanished is noticed)."""
    kinds = {argv[0] if argv and argv[0] in SUBCOMMANDS else "tour" for p in PAGES for _, argv in commands(p)}
    assert kinds == set(SUBCOMMANDS)
    readme = commands(ROOT / "README.md")
    assert (4, []) in readme  # the tour: mpiexec -n 4 python -m mpi4py -m simpar


# -- the code map ----------------------------------------------------------------------------------


def modules() -> set[str]:
    return {
        str(p.relative_to(ROOT))
        for top in ("simpar", "kernels")
        for p in (ROOT / top).rglob("*.py")
        if "__pycache__" not in p.parts
    }


def design_map() -> set[str]:
    """The modules named in docs/design.md's map: a line that starts at column 0 with a folder sets
    the folder the names after it are in; a line that starts with a file names that file."""
    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("## The layers", 1)[1]
    block = FENCE.search(section).group(1)
    named, folder = set(), None
    for line in block.splitlines():
        head = re.match(r"(\S+)", line)
        names = re.findall(r"(?<![\w./])([\w/]+\.py)\b", line)
        if head and head.group(1).endswith("/"):
            folder = head.group(1)
        elif head and head.group(1).endswith(".py"):
            folder = None
            named.add(head.group(1))
            names = names[1:]
        named |= {folder + n if folder else n for n in names}
    return named


def test_design_map_names_every_module_and_no_other():
    named, real = design_map(), modules()
    assert sorted(real - named) == [], "modules missing from docs/design.md's map"
    assert sorted(named - real) == [], "docs/design.md's map names modules that do not exist"


def test_readme_folder_table_names_every_package():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Layout of the code", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"^\| `([\w/]+/)`", section, re.M))
    packages = {str(p.parent.relative_to(ROOT)) + "/" for p in (ROOT / "simpar").glob("*/__init__.py")}
    packages.add("kernels/")
    assert sorted(packages - named) == [], "package folders missing from the README's table"
    ghosts = sorted(n for n in named if not (ROOT / n).is_dir())
    assert ghosts == [], "the README names folders that do not exist"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_python_file_mentioned_exists(page):
    """`parallel/pipeline/engine.py`, `tests/paths.py`, `step_breakdown.py`: a path resolves from
    the repository or from simpar/; a bare name is some file's name."""
    names = {p.name for p in ROOT.rglob("*.py") if ".venv" not in p.parts}
    missing = []
    for span in re.findall(r"`([^`]+)`", page.read_text()):
        for path in re.findall(r"(?<![\w./])([\w][\w/]*\.py)\b", span):
            if "/" in path:
                ok = (ROOT / path).is_file() or (ROOT / "simpar" / path).is_file()
            else:
                ok = path in names
            if not ok:
                missing.append(path)
    assert missing == [], _rel(page)
