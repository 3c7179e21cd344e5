"""What the source checks (check_layering.py, check_type_names.py) share: running a check
on a made-up tree for their self-tests."""
import pathlib
import tempfile


def self_test(name, files, check, expected):
    """Writes `files` (path: text) into a temporary tree, runs check(root) -> errors, and
    passes when the errors are exactly one per `expected` prefix."""
    with tempfile.TemporaryDirectory() as temp:
        root = pathlib.Path(temp)
        for path, text in files.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text)
        errors = check(root)
    ok = len(errors) == len(expected) and all(
        any(error.startswith(prefix) for error in errors) for prefix in expected)
    print(f"{name} self-test: {'passed' if ok else 'FAILED'}: {errors}")
    return ok
