#!/usr/bin/env python3
"""Fails when the product carries its development history in text.

The history of how rlmesh was built lives in git. The product (README.md,
docs/, configs/, bench/ reports and the comments of the sources) states what
is true now. This check reads those files and reports, as file:line, each:

  * the word "session" (whole word, any case);
  * a git commit hash: 7 to 40 lowercase hex characters with at least one
    digit and one letter, as a whole word;
  * "the issue", or "issue N" / "issues N" with N a number;
  * a path or markdown link that leads outside the repository: "/work/",
    "../shared/", or a relative markdown link that climbs above the root.

Prose files (*.md) are read whole. Source files (*.cc, *.h, *.proto, *.py,
*.sh, *.bzl, *.yaml, BUILD) are read only in their comments (and, for Python,
docstrings), so identifiers, string constants and hex test vectors in code
never match.

Which files: `git ls-files` in the repository root. Run from a checkout as
`python3 scripts/check_history.py`; under `bazel test //scripts:history_test`
the test is tagged local and finds the root by resolving the runfiles link of
this script (see check_history_test.sh), because a glob in one BUILD package
cannot see the files of the others.
"""

import io
import os
import re
import subprocess
import sys
import tokenize

# Specific lines that match a pattern but are not history, each with why.
# Keys are "path:stripped line text" so an edit that moves the line keeps it.
ALLOWED = {
    # A fuzz input quoted in a comment: a number too large for a double,
    # which happens to be 12 hex digits.
    'actor/safetensors.cc:// Not only syntax: a number too large for a double ("55e555555551") is',
}

# Files that name the patterns themselves.
SKIPPED = {"scripts/check_history.py", "scripts/check_history_test.sh"}

SESSION = re.compile(r"\bsessions?\b", re.IGNORECASE)
HASH = re.compile(r"(?<![0-9A-Za-z_])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![0-9A-Za-z_])")
THE_ISSUE = re.compile(r"\bthe issue\b", re.IGNORECASE)
ISSUE_N = re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE)
OUTSIDE = re.compile(r"/work/|\.\./shared/")
MD_LINK = re.compile(r"\]\(([^)\s]+)")

PROSE_SUFFIXES = (".md",)
HASH_COMMENT_SUFFIXES = (".sh", ".yaml", ".yml", ".bzl")
SLASH_COMMENT_SUFFIXES = (".cc", ".h", ".proto")


def in_scope(path):
    """Whether `path` (relative to the root) is one this check reads."""
    name = os.path.basename(path)
    if path.startswith("third_party/") or path in SKIPPED:
        return False
    if path.endswith(PROSE_SUFFIXES):
        return path == "README.md" or path.startswith("docs/") or (
            path.startswith("bench/") and path.count("/") == 1)
    if name in ("BUILD", "BUILD.bazel", "WORKSPACE"):
        return True
    return path.endswith(HASH_COMMENT_SUFFIXES + SLASH_COMMENT_SUFFIXES + (".py",))


def slash_comments(text):
    """Yields (line number, comment text) of // and /* */ comments in C++/proto."""
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            yield line, text[i + 2:j]
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j
            for k, part in enumerate(text[i + 2:j].split("\n")):
                yield line + k, part
            line += text.count("\n", i, j)
            i = j + 2
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            open_paren = text.find("(", i + 2)
            delim = text[i + 2:open_paren]
            j = text.find(")" + delim + '"', open_paren)
            j = n if j < 0 else j + len(delim) + 2
            line += text.count("\n", i, j)
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        else:
            i += 1


def python_comments(text):
    """Yields (line number, text) of comments and docstrings in Python/Starlark."""
    prev = tokenize.NEWLINE
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
        elif tok.type == tokenize.STRING and prev in (tokenize.NEWLINE, tokenize.INDENT,
                                                        tokenize.DEDENT, tokenize.NL):
            for k, part in enumerate(tok.string.split("\n")):
                yield tok.start[0] + k, part
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            prev = tok.type


def hash_comments(text):
    """Yields (line number, text) of # comments in shell and YAML.

    A # starts a comment at the start of a line or after whitespace, outside
    quotes; that is the rule of both languages for all the files here.
    """
    for number, raw in enumerate(text.split("\n"), 1):
        quote = None
        for k, c in enumerate(raw):
            if quote:
                if c == quote:
                    quote = None
                elif c == "\\" and quote == '"':
                    continue
            elif c in "\"'" and (k == 0 or not raw[k - 1].isalnum()):
                quote = c
            elif c == "#" and (k == 0 or raw[k - 1] in " \t"):
                yield number, raw[k:]
                break


def checked_text(path, text):
    """Yields (line number, text) for the parts of `path` that are checked."""
    name = os.path.basename(path)
    if path.endswith(PROSE_SUFFIXES):
        yield from enumerate(text.split("\n"), 1)
    elif path.endswith(SLASH_COMMENT_SUFFIXES):
        yield from slash_comments(text)
    elif path.endswith(".py") or name in ("BUILD", "BUILD.bazel", "WORKSPACE"):
        try:
            yield from list(python_comments(text))
        except (tokenize.TokenError, SyntaxError, IndentationError):
            yield from hash_comments(text)
    else:
        yield from hash_comments(text)


def problems(path, root, text):
    """Yields (line number, message) for each finding in one file."""
    lines = text.split("\n")
    for number, part in checked_text(path, text):
        full = lines[number - 1].strip() if number - 1 < len(lines) else part
        if "%s:%s" % (path, full) in ALLOWED:
            continue
        for pattern, what in ((SESSION, "history word"), (HASH, "commit hash"),
                              (THE_ISSUE, "issue reference"), (ISSUE_N, "issue reference"),
                              (OUTSIDE, "path outside the repository")):
            m = pattern.search(part)
            if m:
                yield number, "%s %r" % (what, m.group(0))
        if path.endswith(PROSE_SUFFIXES):
            for m in MD_LINK.finditer(part):
                target = m.group(1).split("#")[0]
                if not target or re.match(r"[a-z]+:", target):
                    continue
                resolved = os.path.normpath(os.path.join(os.path.dirname(path), target))
                if resolved == ".." or resolved.startswith("../") or target.startswith("/"):
                    yield number, "link outside the repository %r" % m.group(1)


def find_root():
    """The repository root: this script's real location, one folder up."""
    here = os.path.dirname(os.path.realpath(__file__))
    return os.path.dirname(here)


def main(argv):
    root = argv[1] if len(argv) > 1 else find_root()
    files = subprocess.run(["git", "ls-files", "-z"], cwd=root, check=True,
                           stdout=subprocess.PIPE).stdout.decode().split("\0")
    found = 0
    for path in sorted(f for f in files if f and in_scope(f)):
        full = os.path.join(root, path)
        if not os.path.isfile(full):
            continue  # deleted in the working tree, not yet committed
        with open(full, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for number, message in problems(path, root, text):
            line = text.split("\n")[number - 1].strip()
            print("%s:%d: %s: %s" % (path, number, message, line[:160]))
            found += 1
    if found:
        print("check_history: %d finding(s). State the fact without its history; "
              "the history is in git." % found)
        return 1
    print("check_history: clean")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
