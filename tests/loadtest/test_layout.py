"""What every tool in loadtest/ keeps to: a docstring (or, for a shell script, a header)
that shows its command, and a name that does not shadow a standard-library module (a
script's folder comes first on sys.path, so `profile.py` there would be what `cProfile`,
and through it PySpark, imports as `profile`)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOLS = sorted(p for p in (ROOT / "loadtest").iterdir() if p.is_file())


def test_loadtest_holds_a_few_tools_besides_the_peers() -> None:
    assert 0 < len(TOOLS) <= 8, [p.name for p in TOOLS]


def test_no_loadtest_script_shadows_a_standard_library_module() -> None:
    shadowing = [p.name for p in TOOLS if p.suffix == ".py" and p.stem in sys.stdlib_module_names]
    assert shadowing == []


def test_every_loadtest_tool_shows_its_command_at_the_top() -> None:
    for path in TOOLS:
        text = path.read_text()
        if path.suffix == ".py":
            doc = ast.get_docstring(ast.parse(text)) or ""
        else:
            doc = "\n".join(line for line in text.splitlines()[:20] if line.startswith("#"))
        assert path.name in doc or "locust -f" in doc, f"{path.name}: no command in its docstring"
