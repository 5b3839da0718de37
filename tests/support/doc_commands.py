"""The commands the README and docs/ show in their code fences (tests/unit/test_doc_commands.py runs the forecasts,
tests/workflow/test_guide_commands.py the guide's result-reading commands)."""
import re

from support import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def fenced_commands(pattern: str) -> list[tuple[str, int, str]]:
    """(doc, line, command) of every line inside a code fence that starts with the pattern (a `$ ` prompt, a
    `.venv/bin/` prefix and a trailing `# comment` taken off)."""
    found = []
    for doc in DOCS:
        inside = False
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            if line.startswith("```"):
                inside = not inside
                continue
            text = line.strip().removeprefix("$ ").removeprefix(".venv/bin/")
            if inside and re.match(pattern, text):
                found.append((doc.name, number, re.split(r"\s+#\s", text, maxsplit=1)[0].strip()))
    return found
