"""Licences from package metadata, and the third-party packages an engine module imports,
found by reading its source (nothing is imported, no model is loaded)."""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import re
import sys
from importlib.metadata import Distribution, PackageNotFoundError, distribution
from pathlib import Path
from typing import Any

from voxserve.cli.errors import PROG


def dist_license(dist: Distribution) -> str:
    """The licence a distribution declares: License-Expression, License, or a classifier."""
    meta = dist.metadata
    expression = (meta.get_all("License-Expression") or [""])[0]
    if expression:
        return str(expression).strip()
    text = str((meta.get_all("License") or [""])[0]).strip()
    if text and text.upper() != "UNKNOWN":
        first = text.splitlines()[0].strip()
        return first if len(first) <= 80 else first[:77] + "..."
    classifiers = [
        c.split("::")[-1].strip()
        for c in (meta.get_all("Classifier") or [])
        if c.startswith("License ::")
    ]
    if classifiers:
        return ", ".join(classifiers)
    return "not declared"


def module_distributions(module: str, exclude: str | None = None) -> list[dict[str, str]]:
    """Third-party distributions an engine module imports (following voxserve's own
    modules), found by reading the source: nothing is imported and no model is loaded.

    voxserve's core dependencies are left out: they are always installed and are not what
    an engine choice adds to the licence picture."""
    from importlib.metadata import packages_distributions

    by_module = packages_distributions()
    skip = {_norm(PROG), *(_norm(d) for d in _core_requirements())}
    if exclude:
        skip.add(_norm(exclude))
    found: dict[str, dict[str, str]] = {}
    for top in sorted(_imported_top_modules(module)):
        for dist_name in by_module.get(top, []):
            if _norm(dist_name) in skip or _norm(dist_name) in found:
                continue
            try:
                dist = distribution(dist_name)
            except PackageNotFoundError:
                continue
            found[_norm(dist_name)] = {
                "package": dist.name,
                "version": dist.version,
                "license": dist_license(dist),
            }
    return list(found.values())


def _imported_top_modules(module: str) -> set[str]:
    tops: set[str] = set()
    seen: set[str] = set()
    pending = [module]
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        try:
            spec = importlib.util.find_spec(current)
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        try:
            tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            for name in names:
                top = name.split(".")[0]
                if top == "voxserve":
                    pending.append(name)
                elif top not in sys.stdlib_module_names:
                    tops.add(top)
    return tops


def _core_requirements() -> list[str]:
    """Names in voxserve's own Requires-Dist that are not behind an extra."""
    try:
        requires = distribution(PROG).requires or []
    except PackageNotFoundError:
        return []
    names = []
    for req in requires:
        if "extra ==" in req:
            continue
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req)
        if match:
            names.append(match.group())
    return names


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def licence_notes(report: dict[str, list[dict[str, Any]]]) -> list[str]:
    """GPL (copyleft) packages and packages that declare no licence, named once each."""
    voxserve_licence = "unknown"
    with contextlib.suppress(PackageNotFoundError):
        voxserve_licence = dist_license(distribution(PROG))
    copyleft: dict[str, list[str]] = {}  # "<what> is <licence>" -> engines using it
    undeclared: dict[str, list[str]] = {}
    for kind, rows in report.items():
        for row in rows:
            engine = f"{kind} engine {row['name']}"
            for dep in row["uses"]:
                key = f"{dep['package']} {dep['version']}"
                if "GPL" in dep["license"].upper():
                    copyleft.setdefault(f"{key} is {dep['license']}", []).append(engine)
                elif dep["license"] == "not declared":
                    undeclared.setdefault(key, []).append(engine)
            reported = str(row.get("loaded", {}).get("license", ""))
            if "GPL" in reported.upper() and not any(
                "GPL" in d["license"].upper() for d in row["uses"]
            ):
                copyleft.setdefault(f"the {engine} reports licence {reported}", [])
    notes = []
    for what, users in copyleft.items():
        used_by = f" (used by the {', '.join(users)})" if users else ""
        notes.append(
            f"{what}{used_by}: it is installed only with the optional 'default' extra, so "
            f"the core voxserve package stays {voxserve_licence}; distributing it means "
            "meeting the GPL's terms"
        )
    notes += [
        f"{what} declares no licence in its package metadata (used by the "
        f"{', '.join(users)}); check it before distributing"
        for what, users in undeclared.items()
    ]
    return notes
