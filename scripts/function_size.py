#!/usr/bin/env python3
"""Fails when a function of the product's C++ is long without a reason.

A function whose definition, from the first line of its signature to its
closing brace, is over 120 lines must say why in the comment right above it:
a line of that comment holds "Long because:" followed by the reason, e.g.

  // Long because: one switch over every message type; each case is short.
  void Dispatch(const Message& m) {

Each such function without one is reported as file:line: name (N lines).

Which files: the .cc files `git ls-files` lists in the repository root,
except third_party/, tests (*_test.cc, tests/, testing/) and fuzz targets
(*_fuzz.cc). scripts/function_size_allow.txt lists functions let through
for now, one "path name: reason" a line; an entry that no longer matches a
long function fails too, so the list only shrinks.

How: comments, string and character literals (raw strings too) are blanked
out, then braces are matched. A '{' outside any function opens a function
body when the text before it (since the last ';', '{' or '}') has a
parameter list and no '=' before it; namespace, class, struct and enum
braces are looked through, other braces (initializers) are skipped.
Lambdas and local classes count toward the function they are in.

`--self-test` checks the reader itself on a small source with each of the
cases above. Run from a checkout as `python3 scripts/function_size.py`, or
through `bazel test //scripts:function_size_test` (local, like history_test:
it finds the checkout by resolving the runfiles link of this script).
"""

import os
import re
import subprocess
import sys

LIMIT = 120
MARKER = "Long because:"
ALLOW_FILE = "scripts/function_size_allow.txt"

KEYWORD_BLOCK = re.compile(r"^\s*(?:template\s*<.*>\s*)?(namespace|class|struct|union|enum|extern)\b", re.S)
ACCESS_LABEL = re.compile(r"^\s*(?:(?:public|private|protected)\s*:(?!:)\s*)+")
INIT_LIST = re.compile(r"\)\s*(?:const\s*)?(?:noexcept\s*)?:(?!:)")
NOT_NAMES = {"if", "for", "while", "switch", "return", "sizeof", "decltype", "alignof", "catch",
             "ABSL_GUARDED_BY", "ABSL_EXCLUSIVE_LOCKS_REQUIRED", "ABSL_LOCKS_EXCLUDED"}


def in_scope(path):
    """Whether `path` (relative to the root) is product C++ this check reads."""
    if not path.endswith(".cc") or path.startswith("third_party/"):
        return False
    parts = path.split("/")
    if "tests" in parts[:-1] or "testing" in parts[:-1]:
        return False
    return not (path.endswith("_test.cc") or path.endswith("_fuzz.cc"))


def blank_literals(text):
    """`text` with comments and string/char literals replaced by spaces
    (newlines kept, so line numbers hold)."""
    out = []
    i, n = 0, len(text)

    def blank(s):
        out.append(re.sub(r"[^\n]", " ", s))

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(text[i:j])
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            blank(text[i:j])
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            open_paren = text.find("(", i + 2)
            delim = text[i + 2:open_paren]
            j = text.find(")" + delim + '"', open_paren)
            j = n if j < 0 else j + len(delim) + 2
            blank(text[i:j])
            i = j
        elif c == "#" and text[text.rfind("\n", 0, i) + 1:i].strip() == "":
            # A preprocessor line, with its continuations.
            j = i
            while True:
                j = text.find("\n", j)
                if j < 0 or text[j - 1] != "\\":
                    break
                j += 1
            j = n if j < 0 else j
            blank(text[i:j])
            i = j
        elif c == '"' or (c == "'" and not digit_separator(text, i)):
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            blank(text[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def digit_separator(text, i):
    """Whether the ' at `i` separates digits (1'000) rather than opening a
    character literal ('a', L'a')."""
    return (i > 0 and text[i - 1].isalnum() and i + 1 < len(text) and text[i + 1].isalnum()
            and text[i + 2:i + 3] != "'")


def function_name(header):
    """The (qualified) name before the parameter list of `header`, or None."""
    depth_paren = depth_angle = 0
    for k, c in enumerate(header):
        if c == "<" and depth_paren == 0 and not header[:k].rstrip().endswith("operator"):
            depth_angle += 1
        elif c == ">" and depth_paren == 0 and depth_angle > 0 and header[k - 1] != "-":
            depth_angle -= 1
        elif c == "(":
            if depth_paren == 0 and depth_angle == 0:
                m = re.search(r"((?:[A-Za-z_~][\w]*\s*::\s*)*(?:operator\s*[^\s(]+|operator\s*\(\s*\)|~?[A-Za-z_]\w*))\s*$",
                              header[:k])
                if m and m.group(1) not in NOT_NAMES:
                    return re.sub(r"\s+", "", m.group(1))
                return None
            depth_paren += 1
        elif c == ")":
            depth_paren = max(0, depth_paren - 1)
    return None


def is_function_header(header):
    """Whether the text before a '{' outside functions opens a function body."""
    if KEYWORD_BLOCK.match(header) or "(" not in header:
        return False
    first_paren = header.index("(")
    if "=" in header[:first_paren].replace("operator=", "").replace("==", ""):
        return False  # an initializer: `auto f = [](...) {`, `T x = F(...) {`
    return function_name(header) is not None


def functions(text):
    """Yields (first line, last line, name) of every function definition in
    C++ source `text` (functions inside namespaces and classes included)."""
    code = blank_literals(text)
    # Kinds of the open braces: "scope" (namespace, class: look inside),
    # "skip" (initializer), "init" (a member's brace-init in a constructor's
    # initializer list, or a braced argument: the header goes on after it).
    stack = []
    header_start = 0
    i, n = 0, len(code)
    while i < n:
        c = code[i]
        if c == ";" and (not stack or stack[-1] == "scope"):
            header_start = i + 1
        elif c == "{":
            header = code[header_start:i]
            if stack and stack[-1] != "scope":
                stack.append("skip")
            elif header.count("(") > header.count(")"):
                stack.append("init")  # a braced argument: ABSL_FLAG(T, name, {}, ...)
            elif INIT_LIST.search(header) and re.search(r"[\w>]\s*$", header) and is_function_header(header):
                stack.append("init")
            elif is_function_header(header):
                body_end = matching_brace(code, i)
                signature = ACCESS_LABEL.sub("", header).lstrip()
                start = header_start + len(header) - len(signature)
                first = code.count("\n", 0, start) + 1
                last = code.count("\n", 0, body_end) + 1
                yield first, last, function_name(header)
                i = body_end + 1
                header_start = i
                continue
            elif KEYWORD_BLOCK.match(header) and "=" not in header:
                stack.append("scope")
                header_start = i + 1
            else:
                stack.append("skip")
        elif c == "}":
            kind = stack.pop() if stack else "scope"
            if kind != "init" and (not stack or stack[-1] == "scope"):
                header_start = i + 1
        i += 1


def matching_brace(code, open_index):
    """Index of the '}' closing the '{' at `open_index` in blanked code."""
    depth = 0
    for k in range(open_index, len(code)):
        if code[k] == "{":
            depth += 1
        elif code[k] == "}":
            depth -= 1
            if depth == 0:
                return k
    return len(code) - 1


def has_reason(lines, first):
    """Whether the comment block right above line `first` (1-based) gives a
    reason after MARKER."""
    k = first - 2
    while k >= 0 and lines[k].strip().startswith("//"):
        at = lines[k].find(MARKER)
        if at >= 0 and lines[k][at + len(MARKER):].strip():
            return True
        k -= 1
    return False


def long_functions(text):
    """Yields (line, name, length) of the functions over LIMIT lines of
    `text` without a reason."""
    lines = text.split("\n")
    for first, last, name in functions(text):
        length = last - first + 1
        if length > LIMIT and not has_reason(lines, first):
            yield first, name, length


SELF_TEST_SOURCE = r'''
#include <x>
#define M(a) { \
  a; }
namespace a {
namespace {
const char* kS = "}{";
constexpr char kR[] = R"x(
{ { {
)x";
ABSL_FLAG(std::vector<std::string>, roots, {}, "flag");
struct S : B {
 public:
  S(int x) : a_{x}, b_(2) {
    f('}');
  }
  int Get() const { return 1'000; }
 private:
  int a_;
};
const std::map<int, int> kM = {{1, 2}, {3, 4}};
auto L = [](int x) { return x; };
}  // namespace
// Long because: a test of the marker.
template <typename T>
std::vector<T> Foo::Bar(const std::function<void(int)>& f) const {
  // }
  if (x) { y(); }
}
int main(int argc, char** argv) {
  return 0;
}
}
'''


def self_test():
    """Checks the reader on SELF_TEST_SOURCE; returns the failures."""
    failures = []
    got = list(functions(SELF_TEST_SOURCE))
    want = [(14, 16, "S"), (17, 17, "Get"), (25, 29, "Foo::Bar"), (30, 32, "main")]
    if got != want:
        failures.append("functions: got %r, want %r" % (got, want))
    lines = SELF_TEST_SOURCE.split("\n")
    if not has_reason(lines, 25) or has_reason(lines, 30):
        failures.append("has_reason: the marker above Foo::Bar is read, none above main")
    return failures


def read_allowlist(root):
    """{(path, name): reason} from ALLOW_FILE; blank lines and # lines skipped."""
    allowed = {}
    path = os.path.join(root, ALLOW_FILE)
    if not os.path.exists(path):
        return allowed
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            m = re.match(r"^(\S+)\s+(\S+):\s+(\S.*)$", line)
            if not m:
                raise SystemExit("%s:%d: expected 'path name: reason', got %r" % (ALLOW_FILE, number, line))
            allowed[(m.group(1), m.group(2))] = m.group(3)
    return allowed


def main(argv):
    if argv[1:] == ["--self-test"]:
        failures = self_test()
        for f in failures:
            print("function_size --self-test: " + f)
        return 1 if failures else 0
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    files = subprocess.run(["git", "ls-files", "-z", "*.cc"], cwd=root, check=True,
                           stdout=subprocess.PIPE).stdout.decode().split("\0")
    allowed = read_allowlist(root)
    used = set()
    found = 0
    for path in sorted(f for f in files if f and in_scope(f)):
        full = os.path.join(root, path)
        if not os.path.isfile(full):
            continue  # deleted in the working tree, not yet committed
        with open(full, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for line, name, length in long_functions(text):
            if (path, name) in allowed:
                used.add((path, name))
                continue
            print("%s:%d: %s: %d lines (over %d) and no '%s' reason in the comment above it"
                  % (path, line, name, length, LIMIT, MARKER))
            found += 1
    for path, name in sorted(set(allowed) - used):
        print("%s: %s %s: no long function of that name any more; remove the entry" % (ALLOW_FILE, path, name))
        found += 1
    if found:
        print("function_size: %d problem(s): split the function, or say why it is long in a "
              "'// %s ...' line of the comment above it" % (found, MARKER))
        return 1
    print("function_size: clean")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
