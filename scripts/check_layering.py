#!/usr/bin/env python3
"""Checks that no #include runs against the architecture's order (docs/architecture.md).

The library's tree is lib/, one folder per component, bottom to top as the floors; a
component may include only itself, the installed headers (include/hybridnn/: the stable C
ABI and the header-only C++ API, which include nothing of lib/) and the components listed
for it below. The tool's commands (lib/tool/, on top) see the installed headers and the
C ABI's folder, whose lib/capi/hybridnn.h is the C++ API's umbrella; the executable's
main (tools/) sees lib/tool/. Exits 1 listing each include out of
order, with the file and line; run by CI and by ctest (test 'layering').
"""
import pathlib
import re
import sys

import source_checks

# Bottom to top. A component sees itself, "public" and what is listed here.
ALLOWED = {
    "public": [],
    "core": [],
    "drivers": ["core"],
    "layers": ["core", "proto"],
    "proto": ["core"],
    "onnx": ["core", "proto"],
    "comm": ["core"],
    "data": ["core", "proto"],
    "scheduler": ["core", "layers"],
    "net": ["core", "layers", "scheduler", "proto", "onnx", "data", "comm"],
    "solver": ["core", "layers", "scheduler", "net", "proto", "onnx", "data", "comm"],
    "api": ["core", "drivers", "layers", "scheduler", "net", "solver", "comm", "proto", "onnx",
            "data"],
    "tool": ["api"],
    "tools": ["tool"],
}

# Where each component lives: folders only, longest match wins.
PLACES = {
    "include/": "public",
    "lib/core/": "core",
    "lib/drivers/": "drivers",
    "lib/layers/": "layers",
    "lib/proto/": "proto",
    "lib/onnx/": "onnx",
    "lib/comm/": "comm",
    "lib/data/": "data",
    "lib/scheduler/": "scheduler",
    "lib/net/": "net",
    "lib/solver/": "solver",
    "lib/capi/": "api",
    "lib/tool/": "tool",
    "tools/": "tools",
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCES = ("lib", "include", "tools")
SUFFIXES = {".h", ".hpp", ".cpp", ".cu", ".cuh", ".def"}


def component(path):
    """The component of a repository path or include name, or None (outside the library)."""
    if path.startswith("hybridnn/"):
        path = "include/" + path
    elif path == "hybridnn.pb.h":  # generated from lib/proto/hybridnn.proto
        path = "lib/proto/" + path
    best = None
    for prefix, name in PLACES.items():
        if path.startswith(prefix) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, name)
    return best[1] if best else None


def check(root):
    """Every include out of order under `root`, as messages, and the number of files read."""
    errors, files = [], 0
    for top in SOURCES:
        for file in sorted((root / top).rglob("*")):
            if file.suffix not in SUFFIXES:
                continue
            path = file.relative_to(root).as_posix()
            owner = component(path)
            if owner is None:
                errors.append(f"{path}: belongs to no component (add it to PLACES)")
                continue
            files += 1
            for number, line in enumerate(file.read_text().splitlines(), 1):
                match = INCLUDE.match(line)
                if not match:
                    continue
                target = component(match.group(1))
                if target in (None, owner, "public") or target in ALLOWED[owner]:
                    continue
                errors.append(f"{path}:{number}: {owner} includes {match.group(1)} ({target}); "
                              f"{owner} may use only {', '.join(ALLOWED[owner]) or 'itself'}")
    return errors, files


def self_test():
    """The checker itself: an upward include and an unplaced file are caught, others pass."""
    files = {
        "lib/core/tensor.cpp": '#include "hybridnn/error.h"\n#include "lib/core/check.h"\n',
        "lib/layers/relu.cpp": '#include "lib/layers/layer.h"\n#include "lib/core/check.h"\n',
        "lib/drivers/cpu/gemm.cpp": '#include "lib/net/graph.h"\n',
        "lib/misc/thing.cpp": "\n",
    }
    expected = ["lib/drivers/cpu/gemm.cpp:1: drivers includes lib/net/graph.h (net)",
                "lib/misc/thing.cpp: belongs to no component"]
    return source_checks.self_test("layering", files, lambda root: check(root)[0], expected)


def main():
    if sys.argv[1:] == ["--self-test"]:
        return 0 if self_test() else 1
    errors, files = check(pathlib.Path(__file__).resolve().parent.parent)
    for error in errors:
        print(error)
    print(f"layering: {files} files, {len(errors)} include(s) out of order")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
