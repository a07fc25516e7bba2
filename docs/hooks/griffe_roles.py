"""Griffe extension: rlchain's docstrings (Google style, with Sphinx's habits) as Markdown reads them.

Cross-reference roles (``:class:`~rlchain.core.envs.VecEnv```) become code spans, a ``<placeholder>`` outside code
stays text instead of an HTML tag, and a paragraph that ends with reStructuredText's ``::`` before its literal
block ends with one colon.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|func|meth|attr|mod|data|exc|obj):`(~?)([^`]+)`")
#: A code span, or a placeholder such as ``<run dir>`` outside one.
_SPAN_OR_PLACEHOLDER = re.compile(r"(`+)(.+?)\1|<([\w .-]+)>")


def _code(match: re.Match) -> str:
    target = match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if match.group(1) else target}`"


def _escape(match: re.Match) -> str:
    return match.group(0) if match.group(1) else f"&lt;{match.group(3)}&gt;"


def markdown(text: str) -> str:
    """``text`` with its roles as code spans, its placeholders escaped (not in indented code) and ``::`` as ``:``."""
    text = _ROLE.sub(_code, text)
    lines = [line if line.startswith("    ") else _SPAN_OR_PLACEHOLDER.sub(_escape, line) for line in text.split("\n")]
    return re.sub(r"::\n\n", ":\n\n", "\n".join(lines))


class RolesAsCode(griffe.Extension):
    """Rewrite every docstring as :func:`markdown` says when griffe loads an object."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
