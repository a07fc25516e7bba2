"""The ManiSkill tests' one skip: they run where mani-skill is installed and SAPIEN, its simulator, finds a Vulkan
device (``make test`` installs Mesa's CPU driver first where it can, ``.ci/vulkan``); elsewhere they skip, saying
which is missing. A test may not fail because of the machine."""

from __future__ import annotations

import functools
import importlib.util

import pytest


@functools.cache
def maniskill_missing() -> str | None:
    """What this machine lacks to build a ManiSkill env (the extra, a system library such as OpenCV's libGL, or
    SAPIEN's Vulkan device), or None.

    The Vulkan check is the adapter's own (:func:`rlchain.core.envs.maniskill_adapter.vulkan_error`); it imports
    SAPIEN, once per test process.
    """
    if importlib.util.find_spec("mani_skill") is None:
        return 'needs pip install "rlchain[maniskill]"'
    try:
        import mani_skill.envs  # noqa: F401  (what the adapter imports: its tasks, and OpenCV for their cameras)
    except ImportError as err:
        if "cannot open shared object file" not in str(err):
            raise  # mani-skill itself is broken: a failure, not the machine
        return f"ManiSkill's tasks need a system library this machine lacks ({err})"
    from rlchain.core.envs.maniskill_adapter import vulkan_error

    err = vulkan_error()
    return None if err is None else f"SAPIEN finds no Vulkan device ({err}): .ci/vulkan, run by make test, installs one"


def skip_without_maniskill() -> None:
    """``pytest.skip`` with :func:`maniskill_missing`'s reason where ManiSkill cannot run here; at a test module's
    top level it skips the whole module, in a test that test."""
    reason = maniskill_missing()
    if reason is not None:
        pytest.skip(reason, allow_module_level=True)
