#!/usr/bin/env python3
"""Checks what libhybridnn.so exports: exactly the functions hybridnn_c.h declares.

Usage: check_exports.py LIBRARY HEADER   (or --self-test)

Lists the library's defined dynamic symbols (nm -D --defined-only) and the HN_API
functions of the header. Fails listing every exported symbol the header does not declare
(C++ or a dependency's symbol leaking out) and every declared function the library does
not export. Run by ctest (test 'capi.exported_symbols').
"""
import re
import subprocess
import sys

DECLARED = re.compile(r"HN_API\s+[^;(]*?\b(hn_\w+)\s*\(", re.S)


def declared(header_text):
    """The function names the header declares with HN_API."""
    return set(DECLARED.findall(header_text))


def exported(nm_output):
    """Defined dynamic symbols from `nm -D --defined-only` output, version nodes left out."""
    names = set()
    for line in nm_output.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        kind, name = parts[-2], parts[-1].split("@")[0]
        if kind == "A":  # the version node (HYBRIDNN_1)
            continue
        names.add(name)
    return names


def compare(exports, declarations):
    errors = [f"exported but not in the C ABI: {name}" for name in sorted(exports - declarations)]
    errors += [f"declared but not exported: {name}" for name in sorted(declarations - exports)]
    return errors


def self_test():
    header = "HN_API hn_status hn_a(int x);\nHN_API const char*\n  hn_b(void);\n#define HN_X 1\n"
    nm = ("0000000000001000 T hn_a\n0000000000000000 A HYBRIDNN_1\n"
          "0000000000002000 T _ZN2hn3NetC1Ev\n")
    errors = compare(exported(nm), declared(header))
    expected = ["exported but not in the C ABI: _ZN2hn3NetC1Ev", "declared but not exported: hn_b"]
    ok = errors == expected and declared(header) == {"hn_a", "hn_b"}
    print(f"exports self-test: {'passed' if ok else 'FAILED'}: {errors}")
    return ok


def main():
    if sys.argv[1:] == ["--self-test"]:
        return 0 if self_test() else 1
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    library, header = sys.argv[1], sys.argv[2]
    nm = subprocess.run(["nm", "-D", "--defined-only", library], check=True,
                        capture_output=True, text=True).stdout
    with open(header, encoding="utf-8") as file:
        declarations = declared(file.read())
    exports = exported(nm)
    errors = compare(exports, declarations)
    for error in errors:
        print(error)
    print(f"exports: {library}: {len(exports)} symbols exported, {len(declarations)} declared "
          f"in {header}, {len(errors)} problem(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
