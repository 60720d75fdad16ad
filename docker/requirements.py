"""Print the requirements of one optional-dependency group of pyproject.toml, self-references expanded.

The images install these before copying the sources, so that editing the code rebuilds only the last layer:
    python requirements.py evaluator > /tmp/requirements.txt
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path


def requirements(project: dict, group: str) -> list[str]:
    """The base dependencies plus `group`'s, with `<name>[a,b]` entries replaced by those groups' requirements."""
    name = project["name"]
    extras = project.get("optional-dependencies", {})
    if group not in extras:
        raise SystemExit(f"no optional-dependency group {group!r}; groups: {', '.join(sorted(extras))}")
    seen: set[str] = set()
    pending = [group]
    found: list[str] = list(project.get("dependencies", []))
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        for requirement in extras[current]:
            own = re.fullmatch(rf"{re.escape(name)}\[([^\]]+)\]", requirement.replace(" ", ""))
            if own:
                pending.extend(own.group(1).split(","))
            elif requirement not in found:
                found.append(requirement)
    return found


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    pyproject = Path(__file__).with_name("pyproject.toml")
    if not pyproject.exists():  # run from the repository rather than the image's build directory
        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    print("\n".join(requirements(tomllib.loads(pyproject.read_text())["project"], sys.argv[1])))
