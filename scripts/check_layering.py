#!/usr/bin/env python3
"""Checks that no #include runs against the architecture's order (docs/architecture.md).

Every source and header of the library belongs to one component; a component may include
only itself and the components listed for it below. The C++ API's headers
(lib/include/hybridnn/) belong to the component they declare; include/hybridnn/ holds the
stable C ABI and the header-only C++ API over it (the "api" component, lib/capi/). Exits 1 listing each include out of order, with the
file and line; run by CI and by ctest (test 'layering').
"""
import pathlib
import re
import sys

# Bottom to top. A component sees itself and what is listed here.
ALLOWED = {
    "core": [],
    "drivers": ["core"],
    "layers": ["core"],
    "proto": ["core"],
    "comm": ["core"],
    "data": ["core", "proto"],
    "scheduler": ["core", "layers"],
    "net": ["core", "layers", "scheduler", "proto", "data", "comm"],
    "solver": ["core", "layers", "scheduler", "net", "proto", "data", "comm"],
    "api": ["core", "layers", "scheduler", "net", "solver", "comm", "proto"],
}

# Where each component lives: path prefixes, longest match wins.
PLACES = {
    "lib/core/": "core",
    "lib/include/hybridnn/device.h": "core",
    "lib/include/hybridnn/driver.h": "core",
    "lib/include/hybridnn/driver_registry.h": "core",
    "include/hybridnn/error.h": "core",
    "include/hybridnn/hybridnn_c.h": "api",
    "include/hybridnn/hybridnn.hpp": "api",
    "lib/capi/": "api",
    "lib/include/hybridnn/memory.h": "core",
    "lib/include/hybridnn/phase.h": "core",
    "lib/include/hybridnn/version.h": "core",
    "lib/include/hybridnn/runtime.h": "core",
    "lib/include/hybridnn/shapes.h": "core",
    "lib/include/hybridnn/solver_update.h": "core",
    "lib/include/hybridnn/driver_calls.def": "core",
    "lib/include/hybridnn/tensor.h": "core",
    "lib/include/hybridnn/tune.h": "core",
    "drivers/": "drivers",
    "layers/": "layers",
    "lib/include/hybridnn/layer.h": "layers",
    "lib/include/hybridnn/layers.h": "layers",
    "lib/include/hybridnn/layers/": "layers",
    "lib/proto/": "proto",
    "hybridnn.pb.h": "proto",  # generated from lib/proto/hybridnn.proto
    "comm/": "comm",
    "lib/include/hybridnn/comm.h": "comm",
    "lib/data/": "data",
    "lib/scheduler/": "scheduler",
    "lib/include/hybridnn/split.h": "scheduler",
    "lib/net/": "net",
    "lib/include/hybridnn/net.h": "net",
    "lib/solver/": "solver",
    "lib/include/hybridnn/solver.h": "solver",
    "lib/include/hybridnn/hybridnn.h": "api",
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCES = ("lib", "drivers", "comm", "layers", "include")
SUFFIXES = {".h", ".hpp", ".cpp", ".cu", ".cuh"}


def component(path):
    """The component of a repository path or include name, or None (outside the library)."""
    if path.startswith("hybridnn/"):
        public = ("hybridnn/error.h", "hybridnn/hybridnn_c.h", "hybridnn/hybridnn.hpp")
        path = ("include/" if path in public else "lib/include/") + path
    best = None
    for prefix, name in PLACES.items():
        if (path == prefix or (prefix.endswith("/") and path.startswith(prefix))) and (
                best is None or len(prefix) > len(best[0])):
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
                if target is None or target == owner or target in ALLOWED[owner]:
                    continue
                errors.append(f"{path}:{number}: {owner} includes {match.group(1)} ({target}); "
                              f"{owner} may use only {', '.join(ALLOWED[owner]) or 'itself'}")
    return errors, files


def self_test():
    """The checker itself: an upward include and an unplaced file are caught, others pass."""
    import tempfile
    with tempfile.TemporaryDirectory() as temp:
        root = pathlib.Path(temp)
        files = {
            "lib/core/tensor.cpp": '#include "hybridnn/tensor.h"\n#include "lib/core/check.h"\n',
            "layers/relu.cpp": '#include "hybridnn/layer.h"\n#include "lib/core/check.h"\n',
            "drivers/cpu/gemm.cpp": '#include "lib/net/graph.h"\n',
            "lib/misc/thing.cpp": "\n",
        }
        for path, text in files.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text)
        errors, _ = check(root)
    expected = ["drivers/cpu/gemm.cpp:1: drivers includes lib/net/graph.h (net)",
                "lib/misc/thing.cpp: belongs to no component"]
    ok = len(errors) == 2 and all(any(e.startswith(x) for e in errors) for x in expected)
    print(f"layering self-test: {'passed' if ok else 'FAILED'}: {errors}")
    return ok


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
