"""Building one bench binary at a reference commit and at the working tree,
for the A/B scripts (generate_ab.py, weight_sync_ab.py).

The reference tree is a git worktree under /tmp with this tree's bench
source (and its BUILD rule when missing) copied in, so both sides run the
same measurement code on their own libraries.
"""
import os
import shutil
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build(tree, target):
    """Builds //bench:<target> in `tree`; returns a copy of the binary."""
    subprocess.run(["bazel", "build", f"//bench:{target}"], cwd=tree, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Copy out: bazel-bin of a tree is replaced by its next build.
    out = os.path.join("/tmp", f"{target}-{os.path.basename(tree)}-{os.getpid()}")
    shutil.copy(os.path.join(tree, f"bazel-bin/bench/{target}"), out)
    return out


def reference_tree(ref, target, sources, rule):
    """A worktree at `ref` with `sources` (paths under the root) copied from
    this tree and `rule` appended to bench/BUILD when //bench:<target> is
    missing there."""
    tree = f"/tmp/rlmesh-{target}-ref-{ref}"
    if not os.path.isdir(tree):
        subprocess.run(["git", "worktree", "add", "--detach", tree, ref], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)
    for path in sources:
        shutil.copy(os.path.join(ROOT, path), os.path.join(tree, path))
    # The commit's own BUILD file, then this tree's rule: a rule appended by
    # an earlier run may be stale.
    subprocess.run(["git", "checkout", "--", "bench/BUILD"], cwd=tree, check=True)
    build_file = os.path.join(tree, "bench/BUILD")
    if f'name = "{target}"' not in open(build_file).read():
        with open(build_file, "a") as f:
            f.write(rule)
    return tree
