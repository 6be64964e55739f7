"""rlmesh_fuzz_test: one fuzz target, two ways.

In the default build it is a cc_test whose main (regression_main.cc) runs
the function on its seed corpus and on seeded mutations of it. Under
--config=fuzz (clang, -fsanitize=fuzzer,address) the same target links
libFuzzer's main: `bazel run --config=fuzz //fuzz:X -- -runs=N corpus/X`.
"""

def rlmesh_fuzz_test(name, srcs, deps, corpus, data = [], mutations = 300, size = "small"):
    """`mutations`: seeded mutations of each corpus input in the smoke.

    `size`: the test's Bazel size (small: a 60 s timeout; medium: 300 s).
    """
    native.cc_test(
        name = name,
        size = size,
        srcs = srcs,
        args = ["$(locations %s)" % corpus],
        env = {"RLMESH_FUZZ_MUTATIONS": str(mutations)},
        data = [corpus] + data,
        deps = deps + select({
            "//fuzz:libfuzzer": [],
            "//conditions:default": ["//fuzz:regression_main"],
        }),
        linkopts = select({
            "//fuzz:libfuzzer": ["-fsanitize=fuzzer,address,undefined"],
            "//conditions:default": [],
        }),
    )
