"""The commands of the documentation's ```bash blocks, and how a test runs
them inside Bazel (used by //docs:doc_commands_test and
//tests:quickstart_doc_test).

A test cannot call Bazel, so a command is translated before it runs:
`bazel run //coordinator -- SUB` and `bazel-bin/coordinator/coordinator SUB`
become the built coordinator with `--bin_dir=<runfiles root>` after SUB (the
role binaries lie there); any other `bazel-bin/X` becomes the built X;
`python3` is the test's interpreter; /tmp/ is the test's own temporary
folder. `scripts/setup.sh` and `bazel build` are skipped (the test's
dependencies are the build), and so is `bazel test` (the test runs inside
it): the targets it names are checked to exist instead.
"""
import os
import re
import shlex
import sys

# A fence's info string: the language, then the marker (rendered pages
# highlight by the first word and ignore the rest).
_FENCE = re.compile(r"^( *)```bash(.*)$")


class Block:
    def __init__(self, path, line, info, body):
        self.path = path  # as given, for messages
        self.line = line  # of the opening fence, 1-based
        self.info = info.strip()  # the info string after `bash`
        self.body = body

    def where(self):
        return f"{self.path}:{self.line}"


def bash_blocks(text, path):
    """Every ```bash block of a markdown page, in order (fences may be
    indented, as in a list)."""
    lines = text.split("\n")
    out = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m:
            indent = len(m.group(1))
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith("```"):
                j += 1
            if j == len(lines):
                raise ValueError(f"{path}:{i + 1}: unclosed ```bash block")
            body = "\n".join(line[indent:] if line[:indent].isspace() else line.lstrip() for line in lines[i + 1:j])
            out.append(Block(path, i + 1, m.group(2), body))
            i = j
        i += 1
    return out


def _split_comment(line):
    """(command, comment) of one shell line: a `#` that starts a word outside
    quotes begins the comment."""
    quote = None
    for k, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
            elif c == "\\" and quote == '"':
                continue
        elif c in "'\"":
            quote = c
        elif c == "#" and (k == 0 or line[k - 1].isspace()):
            return line[:k].rstrip(), line[k + 1:].strip()
    return line.rstrip(), ""


class Command:
    def __init__(self, text, comment, line):
        self.text = text  # continuations joined, comment stripped
        self.comment = comment  # the comments of its lines, joined
        self.line = line  # of its first line in the page


def commands(block):
    """The commands of a block: backslash continuations joined, comments
    stripped (a command's own trailing comments kept in .comment), blank
    and comment-only lines dropped."""
    out = []
    text, comments, first = "", [], None
    for k, raw in enumerate(block.body.split("\n")):
        cmd, comment = _split_comment(raw)
        if not cmd.strip():
            if text:
                raise ValueError(f"{block.where()}: a continuation line is followed by a blank or comment line")
            continue
        if first is None:
            first = block.line + 1 + k
        if comment:
            comments.append(comment)
        if cmd.endswith("\\"):
            text += cmd[:-1].strip() + " "
            continue
        text += cmd.strip()
        out.append(Command(text.strip(), " ".join(comments), first))
        text, comments, first = "", [], None
    if text:
        raise ValueError(f"{block.where()}: a continuation line ends the block")
    return out


class Skipped(Exception):
    """A command the test does not run; the message says why."""


def bazel_targets(argv):
    """The target patterns of a `bazel build/test ...` argv."""
    return [a for a in argv[2:] if a.startswith("//")]


def check_target(root, label, where):
    """Fails unless //pkg:name (or //pkg/..., //...) names something in the
    BUILD files under `root` (the BUILD files are the test's data)."""
    m = re.fullmatch(r"//([\w/.-]*?)(/\.\.\.|\.\.\.|:([\w.+-]+))?", label)
    if not m:
        sys.exit(f"{where}: cannot read the target {label!r}")
    package, rest, name = m.group(1), m.group(2) or "", m.group(3)
    build = os.path.join(root, package, "BUILD")
    if rest.endswith("..."):
        if package and not os.path.isdir(os.path.join(root, package)):
            sys.exit(f"{where}: {label}: no package {package}")
        return
    if name is None:
        name = os.path.basename(package)
    if not os.path.exists(build):
        sys.exit(f"{where}: {label}: no {package}/BUILD among the test's data (add //{package}:BUILD to it)")
    if not re.search(r'^\s*name = "' + re.escape(name) + r'",', open(build).read(), flags=re.M):
        sys.exit(f"{where}: {label}: no target named {name!r} in {package}/BUILD")


def translate(cmd, root, tmp):
    """The shell command a test runs for a page's command `cmd` (a string
    for `bash -c`), or raises Skipped. `root`: the runfiles tree; `tmp`:
    the test's temporary folder, ending in /."""
    if cmd.startswith("scripts/setup.sh && "):
        cmd = cmd[len("scripts/setup.sh && "):]
    argv = shlex.split(cmd)
    if argv == ["scripts/setup.sh"]:
        raise Skipped("setup: the test's dependencies are the build")
    if argv[:2] == ["bazel", "build"]:
        raise Skipped("bazel build: the test's dependencies are the build")
    if argv[:2] == ["bazel", "test"]:
        for label in bazel_targets(argv):
            check_target(root, label, cmd)
        raise Skipped("bazel test: this test runs inside it; " + ", ".join(bazel_targets(argv)) + " exist")
    cmd = cmd.replace("/tmp/", tmp)
    coordinator = shlex.quote(os.path.join(root, "coordinator/coordinator"))
    bin_dir = "--bin_dir=" + shlex.quote(root)
    out = re.sub(r"(?<![\w/.-])bazel run //coordinator -- (\w+)", lambda m: f"{coordinator} {m.group(1)} {bin_dir}", cmd)
    out = re.sub(r"(?<![\w/.-])bazel-bin/coordinator/coordinator (\w+)",
                 lambda m: f"{coordinator} {m.group(1)} {bin_dir}", out)
    out = re.sub(r"(?<![\w/.-])bazel-bin/([\w/.-]+)", lambda m: shlex.quote(os.path.join(root, m.group(1))), out)
    out = re.sub(r"(?<![\w/.-])python3(?= )", lambda m: shlex.quote(sys.executable), out)
    if re.search(r"(?<![\w/.-])bazel(?= )", out):
        raise ValueError(f"no translation for {cmd!r}")
    return out


def scratch_dir(root, work, names=("configs", "scripts", "examples")):
    """Makes `work` (the commands' working directory) with links to the
    repository's folders `names`, and its tmp/ (returned, ending in /)."""
    os.makedirs(work, exist_ok=True)
    for name in names:
        link = os.path.join(work, name)
        if not os.path.exists(link) and os.path.exists(os.path.join(root, name)):
            os.symlink(os.path.join(root, name), link)
    tmp = os.path.join(work, "tmp") + "/"
    os.makedirs(tmp, exist_ok=True)
    return tmp
