"""``rlchain-export``: a trained policy as one standalone file, TorchScript or ONNX.

Usage::

    rlchain-export outputs/2026-11-24/10-00-00_1a2b3c format=onnx           # -> checkpoints/best.onnx
    rlchain-export outputs/... format=torchscript checkpoint=latest output=robot/policy.pt
    rlchain-export path/to/latest.pt format=onnx output=policy.onnx
    rlchain-export outputs/... format=onnx --allow-target my_robot          # a run whose env is my_robot.envs.Arm

The options (:class:`ExportConfig`) are ``key=value``, as ``rlchain-eval``'s are:
``format`` (required), ``checkpoint`` ('best', 'latest' or a path) and ``output``.

The file is the deterministic policy alone (:class:`ExportedPolicy`): input
``obs`` float32 ``[B, obs_dim]`` (any ``B``; a run of observation groups has
one input per actor group, an image uint8 in the env's layout), the run's
observation normalisation baked in, output ``action``: the action the env receives,
float32 ``[B, act_dim]`` clipped to the Box action space, or int64 ``[B]``
(the likeliest category of a Discrete one). Its metadata (JSON under the key
``rlchain``: TorchScript's extra file ``rlchain.json``, ONNX's
``metadata_props``) gives the spaces, the observation layout, the checkpoint,
its ``global_step`` and the rlchain version.

A recurrent actor's file takes its state as inputs after the observations
and returns the next state after the action: ``h_in`` -> ``h_out`` (an
LSTM's ``c_in`` -> ``c_out`` too), float32 ``[B, num_layers, hidden_size]``.
Start each env with zeros, feed ``h_out`` back as ``h_in`` on its next
step, and zero an env's state where its episode ended (the metadata's
``state`` says so, with the names and shapes). Load it with
``torch.jit.load(path)`` or ``onnxruntime.InferenceSession(path)``; neither
needs rlchain.

The run's config is read as data (:mod:`rlchain.commands.saved_run`): only rlchain's
targets and those of ``--allow-target`` modules are instantiated, and only
those modules are imported for an ``env=gym`` id (``env.imports``). ONNX needs
the ``export`` extra (``pip install "rlchain[export]"``).
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import logging
import math
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from rlchain.commands.arguments import SavedRunOptions, command_parser, option_names, read_options
from rlchain.core import observations
from rlchain.files import write_bytes
from rlchain.settings import setting

__all__ = [
    "EXPORT_EXTRA",
    "FORMATS",
    "ExportConfig",
    "ExportedPolicy",
    "export_policy",
    "input_spaces",
    "main",
    "metadata_of",
    "state_spaces",
]

#: Export formats and the file suffix each gets by default.
FORMATS = {"torchscript": ".torchscript.pt", "onnx": ".onnx"}
#: The flags of rlchain 0.1.0 (``--format onnx``), still read as the options of the same names (``format=onnx``).
_FLAGS = ("format", "checkpoint", "output")


@dataclass
class ExportConfig(SavedRunOptions):
    """The options of ``rlchain-export`` (``key=value`` on its command line), their defaults and ranges."""

    format: str | None = setting(None, choices=tuple(FORMATS))
    """The file format, required: 'torchscript' or 'onnx' (the ``export`` extra)."""
    output: str | None = None
    """Where to write; None: next to the checkpoint, as <checkpoint name>.torchscript.pt or .onnx."""


#: What to install for ONNX.
EXPORT_EXTRA = 'pip install "rlchain[export]"'
#: The key of the metadata in the exported file.
METADATA_KEY = "rlchain"


class ExportedPolicy(nn.Module):
    """The deterministic policy as the env sees it: observations in, the env's action out.

    Args:
        policy: an rlchain policy with :meth:`~rlchain.core.policies.Policy.deterministic_action`
            (its observation normaliser, if any, comes with it).
        action_space: one env's action space: a ``Box`` (the output is
            clipped to its bounds) or a ``Discrete``.
        action_start: added to a Discrete action: the start of the gymnasium
            env's own ``Discrete(n, start)`` (``env=gym``), so the output is
            the action that env receives.

        groups: the names of the inputs, in order, for a policy of observation
            groups (its actor's groups, each a ``[B, *group_shape]`` input);
            None for one flat observation.
        state_inputs: the number of state inputs of a recurrent actor (its
            ``deterministic_step``'s state: 1 for a GRU, 2 for an LSTM), after
            the observations; 0 for a feed-forward one.

    Shapes: ``obs`` float32 ``[B, obs_dim]`` (grouped: one ``[B, *group_shape]`` input per group, in the order of
    ``groups``; an image group uint8, as the env gives it) -> float32 ``[B, act_dim]`` (Box) or int64 ``[B]``
    (Discrete); a recurrent actor takes its state after them (float32 ``[B, num_layers, hidden_size]`` each) and
    returns ``(action, *next_state)``.
    """

    def __init__(
        self,
        policy: nn.Module,
        action_space: gym.Space,
        action_start: int = 0,
        groups: Sequence[str] | None = None,
        state_inputs: int = 0,
    ) -> None:
        super().__init__()
        self.policy, self.state_inputs = policy, int(state_inputs)
        self.groups = tuple(groups) if groups is not None else None
        self.box = isinstance(action_space, gym.spaces.Box)
        self.action_start = int(action_start)
        if self.box:
            self.register_buffer("low", torch.as_tensor(action_space.low, dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(action_space.high, dtype=torch.float32))

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        split = len(inputs) - self.state_inputs
        obs = dict(zip(self.groups, inputs[:split])) if self.groups is not None else inputs[0]
        if self.state_inputs:
            action, state = self.policy.deterministic_step(obs, tuple(inputs[split:]))
            return (self._env_action(action), *state)
        return self._env_action(self.policy.deterministic_action(obs))

    def _env_action(self, action: torch.Tensor) -> torch.Tensor:
        """The policy's action as the env receives it: clipped to the Box, or shifted to the Discrete's start."""
        if self.box:
            return torch.maximum(torch.minimum(action, self.high), self.low)
        return action + self.action_start if self.action_start else action


def state_spaces(policy: nn.Module) -> dict[str, tuple[int, ...]]:
    """A recurrent actor's state inputs of the exported file, in order: name -> one env's shape (``h_in``, and an
    LSTM's ``c_in``: ``(num_layers, hidden_size)``); empty for a feed-forward actor.

    Raises:
        ValueError: a recurrent policy whose actor's state the file cannot carry (it has no ``actor_memory`` with
            ``deterministic_step``, rlchain's :class:`~rlchain.core.policies.ActorCritic` way of acting from a state).
    """
    if not getattr(policy, "is_recurrent", False):
        return {}
    memory = getattr(policy, "actor_memory", False)
    if memory is False or not hasattr(policy, "deterministic_step"):
        raise ValueError(
            f"the policy cannot be exported: {type(policy).__name__} is recurrent, and an exported file carries an "
            "actor's state only through actor_memory and deterministic_step(obs, state) (as ActorCritic's)"
        )
    if memory is None:  # a feed-forward actor (only the critic is recurrent)
        return {}
    return {f"{name}_in": tuple(memory.state_shape) for name in memory.state_names}


def input_spaces(policy: nn.Module, observation_space: gym.Space) -> dict[str, gym.spaces.Box]:
    """The inputs of the exported file, in order: name -> one env's ``Box`` (its shape and dtype).

    One flat observation is the input ``obs``; observation groups are the actor's groups
    (``policy.actor_groups``; every group for a policy that does not name them). An image is a uint8 input.
    """
    if not observations.is_grouped(observation_space):
        return {"obs": observation_space}
    spaces = observations.group_spaces(observation_space)
    return {g: spaces[g] for g in getattr(policy, "actor_groups", None) or spaces}


def _as_spaces(inputs: int | dict[str, Any]) -> dict[str, gym.spaces.Box]:
    """``inputs`` as :func:`input_spaces` gives them: an int is one flat float32 observation of that many features;
    a shape tuple a float32 input of that shape."""
    if isinstance(inputs, int):
        inputs = {"obs": (int(inputs),)}
    return {
        name: box if isinstance(box, gym.spaces.Box) else gym.spaces.Box(-math.inf, math.inf, tuple(box))
        for name, box in inputs.items()
    }


def _described(name: str, box: gym.spaces.Box) -> dict[str, Any]:
    """One input of the metadata: name, dtype, shape, and what the file does to it."""
    if not observations.is_image(box):
        return {"name": name, "dtype": "float32", "shape": ["B", *box.shape], "normalization": "baked in"}
    layout = "HWC" if observations.channels_last(tuple(box.shape)) else "CHW"
    dtype = "uint8" if box.dtype == "uint8" else "float32"
    scaled = "divided by 255 inside" if dtype == "uint8" else "taken as it is"
    return {"name": name, "dtype": dtype, "shape": ["B", *box.shape], "layout": layout, "normalization": scaled}


def _space(space: gym.Space) -> dict[str, Any]:
    """A gymnasium Box, Discrete or Dict of them as JSON data (infinite bounds as the strings ``"inf"`` / ``"-inf"``)."""
    if isinstance(space, gym.spaces.Dict):
        return {"type": "Dict", "spaces": {name: _space(sub) for name, sub in space.spaces.items()}}
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    bound = lambda a: [x if math.isfinite(x) else ("inf" if x > 0 else "-inf") for x in a.astype(float).tolist()]  # noqa: E731
    return {
        "type": "Box",
        "shape": list(space.shape),
        "dtype": str(space.dtype),
        "low": bound(space.low.ravel()),
        "high": bound(space.high.ravel()),
    }


def _state_output(name: str) -> str:
    """The output that returns the next value of a state input: ``h_in`` -> ``h_out``."""
    return name.removesuffix("_in") + "_out"


def metadata_of(
    env: Any,
    checkpoint: Path,
    global_step: int,
    fmt: str,
    inputs: dict[str, Any] | None = None,
    state: dict[str, tuple[int, ...]] | None = None,
) -> dict[str, Any]:
    """What an exported file says about itself: format, inputs and output, spaces, observation layout, source, version.

    ``inputs``: :func:`input_spaces` (default: the env's one flat observation). ``input`` describes the first
    input (the one of a flat observation), ``inputs`` every input in order: name, dtype, shape and, for an image,
    its layout (``HWC`` or ``CHW``). ``state``: :func:`state_spaces` of a recurrent actor, described under
    ``state`` (its inputs, outputs and the reset rule) and added to ``inputs`` and ``outputs``.
    """
    from rlchain import __version__

    discrete = isinstance(env.single_action_space, gym.spaces.Discrete)
    action_space = _space(env.single_action_space)
    if discrete:
        action_space["start"] = int(env.action_start)
    inputs = _as_spaces(inputs if inputs is not None else {"obs": env.single_observation_space})
    described = [_described(name, box) for name, box in inputs.items()]
    names = env.observation_names
    layout = {g: list(v) for g, v in names.items()} if isinstance(names, dict) else names
    output = {
        "name": "action",
        "dtype": "int64" if discrete else "float32",
        "shape": ["B"] if discrete else ["B", int(env.single_action_space.shape[0])],
        "meaning": "the likeliest category" if discrete else "the Gaussian's mean, clipped to the Box",
    }
    state_in = [{"name": n, "dtype": "float32", "shape": ["B", *shape]} for n, shape in (state or {}).items()]
    state_out = [{**entry, "name": _state_output(entry["name"])} for entry in state_in]
    recurrent = {
        "inputs": state_in,
        "outputs": state_out,
        "reset": "zeros before an env's first step and wherever its previous step ended an episode; otherwise "
        "the previous step's outputs, in order",
    }
    return {
        "format": fmt,
        "rlchain_version": __version__,
        "input": described[0],
        "inputs": described + state_in,
        "output": output,
        "outputs": [output, *state_out],
        **({"state": recurrent} if state_in else {}),
        "observation_space": _space(env.single_observation_space),
        "action_space": action_space,
        "observation_layout": list(layout) if isinstance(layout, (list, tuple)) else layout,
        "env": getattr(env.cfg, "_target_", f"{type(env).__module__}.{type(env).__qualname__}"),
        "env_id": getattr(env.cfg, "id", getattr(env.cfg, "task", None)),  # env=gym's id, env=mjlab's task
        "checkpoint": str(checkpoint),
        "global_step": int(global_step),
    }


def export_policy(
    policy: nn.Module,
    action_space: gym.Space,
    inputs: int | dict[str, Any],
    fmt: str,
    path: str | Path,
    metadata: dict[str, Any],
    action_start: int = 0,
) -> Path:
    """Write ``policy``'s :class:`ExportedPolicy` to ``path`` (atomically) as ``fmt``; returns the path.

    Args:
        policy: the policy (moved to a CPU copy for the export).
        action_space: one env's action space.
        inputs: :func:`input_spaces` (or name -> shape for float32 inputs), or the features of one flat
            observation (an int).
        fmt: ``torchscript`` (``torch.jit.trace``, frozen) or ``onnx``
            (``torch.onnx.export``, a dynamic batch dimension).
        metadata: JSON data stored with the file (see :func:`metadata_of`).
        action_start: see :class:`ExportedPolicy`.

    A recurrent actor's state (:func:`state_spaces`) becomes inputs after ``inputs`` and outputs after ``action``.

    Raises:
        ValueError: an unknown ``fmt``; a policy without ``deterministic_action``, or a recurrent one whose state
            the file cannot carry (:func:`state_spaces`).
        ImportError: ``onnx`` without the onnx packages (naming the extra).
        OSError: ``path`` cannot be written.
    """
    import copy

    if fmt not in FORMATS:
        raise ValueError(f"format={fmt!r} is not allowed: expected one of {', '.join(FORMATS)}")
    inputs = _as_spaces(inputs)
    state = state_spaces(policy)
    groups = list(inputs) if getattr(policy, "grouped", list(inputs) != [observations.FLAT]) else None
    module = ExportedPolicy(copy.deepcopy(policy).cpu().eval(), action_space, action_start, groups, len(state))
    module.eval()
    example = tuple(torch.zeros(2, *box.shape, dtype=observations.dtype(box)) for box in inputs.values())
    example += tuple(torch.zeros(2, *shape) for shape in state.values())
    names = list(inputs) + list(state)
    outputs = ["action"] + [_state_output(name) for name in state]
    try:
        module(*example)
    except NotImplementedError as err:
        raise ValueError(f"the policy cannot be exported: {err}") from None
    with torch.no_grad():
        if fmt == "torchscript":
            buffer = io.BytesIO()
            with warnings.catch_warnings():  # torch 2.9+ deprecates TorchScript; a libtorch program still loads it
                warnings.simplefilter("ignore", DeprecationWarning)
                warnings.simplefilter("ignore", torch.jit.TracerWarning)  # torch's RNNs check shapes in Python
                torch.jit.save(
                    torch.jit.freeze(torch.jit.trace(module, example)),  # positional inputs, in order
                    buffer,
                    _extra_files={f"{METADATA_KEY}.json": json.dumps(metadata)},
                )
            data = buffer.getvalue()
        else:
            data = _onnx_bytes(module, example, names, outputs, metadata)
    return write_bytes(path, data)


def _onnx_bytes(
    module: nn.Module, example: tuple[torch.Tensor, ...], names: list[str], outputs: list[str], metadata: dict[str, Any]
) -> bytes:
    """``torch.onnx.export`` (the torch.export-based exporter) with a dynamic batch and the metadata: the file's bytes."""
    missing = [m for m in ("onnx", "onnxscript") if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(f"format=onnx needs {' and '.join(missing)}, an optional extra: {EXPORT_EXTRA}")
    import onnx

    batch = torch.export.Dim("batch", min=1)
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module,
            example,
            input_names=names,
            output_names=outputs,
            dynamic_shapes=(tuple({0: batch} for _ in example),),
            dynamo=True,
            verbose=False,
        )
    model = program.model_proto
    entry = model.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, json.dumps(metadata)
    onnx.checker.check_model(model)
    return model.SerializeToString()


def main(argv: Sequence[str] | None = None) -> int:
    """The ``rlchain-export`` command; 1 (one line on stderr) on bad input."""
    from rlchain.commands.saved_run import SavedRunError, open_run

    parser = command_parser("rlchain-export", __doc__, ExportConfig)
    for flag in _FLAGS:  # rlchain 0.1.0's flags, read as the options they became
        parser.add_argument(f"--{flag}", dest=f"flag_{flag}", help=argparse.SUPPRESS)
    args = parser.parse_intermixed_args(argv)
    overrides = list(args.overrides)
    for flag in _FLAGS:
        if getattr(args, f"flag_{flag}") is not None:
            overrides.append(f"{flag}={getattr(args, f'flag_{flag}')}")
            print(
                f"rlchain-export: --{flag} {getattr(args, f'flag_{flag}')} is read as {overrides[-1]} "
                "(the flag will go: write the option)",
                file=sys.stderr,
                flush=True,
            )
    try:
        cfg, passed_on = read_options(overrides, ExportConfig)
        if passed_on:
            raise SavedRunError(
                f"{passed_on[0]}: an export takes the saved run as it is: its options are "
                + ", ".join(option_names(ExportConfig))
            )
        if cfg.format is None:
            raise SavedRunError(f"format=<{'|'.join(FORMATS)}> is required: the file format")
        if cfg.format == "onnx" and importlib.util.find_spec("onnx") is None:
            raise SavedRunError(f"format=onnx needs onnx, an optional extra: {EXPORT_EXTRA}")
        run = open_run(args.source, cfg.checkpoint, args.allow_target)
        env = run.build_env(num_envs=1, device="cpu")
        policy = run.build_policy(env)
        output = Path(cfg.output) if cfg.output else run.checkpoint.with_name(run.checkpoint.stem + FORMATS[cfg.format])
        inputs = input_spaces(policy, env.single_observation_space)
        try:
            state = state_spaces(policy)
        except ValueError as err:
            raise SavedRunError(str(err)) from None
        metadata = metadata_of(env, run.checkpoint, run.global_step, cfg.format, inputs, state)
        action_space, action_start = env.single_action_space, int(env.action_start)
        env.close()
        try:
            path = export_policy(policy, action_space, inputs, cfg.format, output, metadata, action_start)
        except OSError as err:
            raise SavedRunError(f"output={output} cannot be written: {err.strerror or err}") from None
        except (ValueError, ImportError) as err:
            raise SavedRunError(str(err)) from None
    except SavedRunError as err:
        print(f"rlchain-export: {err}", file=sys.stderr, flush=True)
        return 1
    shown = ", ".join(
        f"{name} {observations.dtype(box)} [B, {', '.join(map(str, box.shape))}]".replace("torch.", "")
        for name, box in inputs.items()
    )
    if state:
        shown += ", " + ", ".join(f"{name} float32 [B, {', '.join(map(str, shape))}]" for name, shape in state.items())
    after = "".join(f", {_state_output(name)}" for name in state)
    print(
        f"rlchain-export: wrote {path} ({cfg.format}; {shown} -> action{after}; "
        f"{run.checkpoint}, global_step {run.global_step:,})",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
