#!/usr/bin/env python3
"""Checks that no part of the library above the layers and drivers names a concrete layer
type or device kind (docs/architecture.md, "Registries").

A layer type is named once, in its registry entry (`type.name = "ReLU";` in lib/layers/), and
a driver kind once, in its DriverKind (`kind.name = "cpu";` in lib/drivers/). The Net, the
scheduler, the solver, the C ABI and the tools read the entries' traits instead; a string
literal equal to a registered name in their code is an error, reported with its file and
line. Comments do not count. Run by CI and by ctest (test 'type_names').
"""
import pathlib
import re
import sys

import source_checks

# Where the names are registered, and where they must not appear.
LAYER_ENTRIES = "lib/layers"
KIND_ENTRIES = "lib/drivers"
CHECKED = ("lib/net", "lib/scheduler", "lib/solver", "lib/capi", "lib/data", "lib/comm", "lib/tool",
           "tools")
SUFFIXES = {".h", ".hpp", ".cpp", ".cu", ".cuh"}

# An entry's name, or a constant naming a type (kSplitLayerType, the Net's own Split layers).
LAYER_NAME = re.compile(r'(?:\btype\.name\s*=|\bk\w*LayerType\[\]\s*=)\s*"([^"]+)"')
KIND_NAME = re.compile(r'\bkind\.name\s*=\s*"([^"]+)"')
LITERAL = re.compile(r'"((?:[^"\\\n]|\\.)*)"')


def sources(root, folder):
    for file in sorted((root / folder).rglob("*")):
        if file.suffix in SUFFIXES:
            yield file


def code_of(line):
    """The line without a // comment (string literals holding // are kept)."""
    out, quoted, i = [], False, 0
    while i < len(line):
        c = line[i]
        if c == '"' and (i == 0 or line[i - 1] != "\\"):
            quoted = not quoted
        if not quoted and line.startswith("//", i):
            break
        out.append(c)
        i += 1
    return "".join(out)


def registered(root):
    layers, kinds = set(), set()
    for file in sources(root, LAYER_ENTRIES):
        layers.update(LAYER_NAME.findall(file.read_text()))
    for file in sources(root, KIND_ENTRIES):
        kinds.update(KIND_NAME.findall(file.read_text()))
    return layers, kinds


def check(root):
    layers, kinds = registered(root)
    errors = []
    for folder in CHECKED:
        for file in sources(root, folder):
            path = file.relative_to(root).as_posix()
            in_block_comment = False
            for number, line in enumerate(file.read_text().splitlines(), 1):
                text = line
                if in_block_comment:
                    if "*/" not in text:
                        continue
                    text = text.split("*/", 1)[1]
                    in_block_comment = False
                if "/*" in text and "*/" not in text.split("/*", 1)[1]:
                    text = text.split("/*", 1)[0]
                    in_block_comment = True
                text = re.sub(r"/\*.*?\*/", "", text)
                for literal in LITERAL.findall(code_of(text)):
                    if literal in layers:
                        errors.append(f"{path}:{number}: names the layer type \"{literal}\"; "
                                      "read its registry entry's traits (lib/layers/registry.h)")
                    elif literal in kinds:
                        errors.append(f"{path}:{number}: names the device kind \"{literal}\"; "
                                      "read its DriverKind's traits (lib/core/driver_registry.h)")
    return layers, kinds, errors


def self_test():
    """The checker itself: names in code are caught, in comments and entries they are not."""
    files = {
        "lib/layers/relu.cpp": 'type.name = "ReLU";\n',
        "lib/drivers/cpu/cpu_driver.cpp": 'kind.name = "cpu";\n',
        "lib/net/net.cpp": '// a "ReLU" in a comment\nif (type == "ReLU") {}\n',
        "lib/tool/common.cpp": 'x = "cpu:0"; /* "cpu" */\nif (kind == "cpu") {}\n',
    }
    expected = ["lib/net/net.cpp:2: names the layer type \"ReLU\"",
                "lib/tool/common.cpp:2: names the device kind \"cpu\""]
    return source_checks.self_test("type names", files, lambda root: check(root)[2], expected)


def main():
    if sys.argv[1:] == ["--self-test"]:
        return 0 if self_test() else 1
    layers, kinds, errors = check(pathlib.Path(__file__).resolve().parent.parent)
    for error in errors:
        print(error)
    if not layers or not kinds:
        print("type names: found no registered layer types or device kinds: the check is broken")
        return 1
    print(f"type names: {len(layers)} layer types, {len(kinds)} device kinds, "
          f"{len(errors)} named outside their registration")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
