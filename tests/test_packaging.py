"""The licence is stated where packaging tools and users look: LICENSE, pyproject.toml, and
the installed distribution's metadata; the type marker ships with the package."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _project_table() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    start = text.index("[project]")
    end = text.find("\n[", start + 1)
    return text[start:end if end >= 0 else None]


def test_license_file_and_pyproject_name_the_same_licence():
    assert "SPDX-License-Identifier: EPL-2.0" in (ROOT / "LICENSE").read_text()
    assert re.search(r'^license\s*=\s*(\{\s*text\s*=\s*)?"EPL-2\.0"', _project_table(), re.MULTILINE)


def test_the_installed_distribution_carries_the_licence_and_the_type_marker():
    metadata = importlib.metadata.metadata("proxy-agent")
    assert "EPL-2.0" in (metadata.get("License-Expression") or metadata.get("License") or "")
    assert (ROOT / "proxy_agent" / "py.typed").is_file()
    assert 'proxy_agent = ["py.typed"]' in (ROOT / "pyproject.toml").read_text()
