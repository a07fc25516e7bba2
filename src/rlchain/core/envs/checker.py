"""``check_vec_env``: test an env against the :class:`~rlchain.core.envs.base.VecEnv` contract.

The VecEnv counterpart of ``gymnasium.utils.env_checker.check_env``. A user
who writes their own batched env runs it once::

    from rlchain.core.envs import check_vec_env
    check_vec_env(MyEnv(num_envs=8))

Every broken rule raises :class:`VecEnvContractError` whose message starts
with ``VecEnv contract, rule '<rule>'``, so the fix is named, not guessed.
The rules, in the order they are checked:

==================  ==========================================================
rule                what is checked
==================  ==========================================================
attributes          ``num_envs`` (int > 0), ``device`` (torch.device),
                    ``max_episode_steps`` (int > 0), ``reports_success`` and
                    ``resumes_episodes`` (bool; a VecEnv subclass inherits
                    False for the latter), ``reward_terms`` and
                    ``metric_names`` (None, or a tuple of distinct strings)
spaces              ``single_observation_space`` a Box or a Dict of Box groups,
                    ``single_action_space`` a Box or Discrete;
                    ``observation_space``/``action_space`` their batches of
                    ``num_envs``
reset               ``reset(seed=...)`` returns ``(obs, info)``: obs float32
                    (uint8 for a uint8 Box: an image) ``[N, *obs_shape]`` on
                    ``device``, finite (for a Dict space a TensorDict with
                    exactly its groups, each ``[N, *group_shape]`` of its
                    Box's dtype); ``info`` a dict
seeding             ``reset(seed=s)`` and the same actions replay the same
                    observations, rewards and dones
step                ``step(action)`` returns five values; obs as for reset,
                    reward float32 ``[N]``, terminated/truncated bool ``[N]``,
                    on ``device``
info keys           ``info`` holds ``final_obs``, ``rewards``, ``metrics``,
                    ``success``
final_obs           as obs (every group), finite on done rows, and there the
                    observation the episode ended on (not the reset one)
reward terms        ``info["rewards"]``: with ``reward_terms`` declared, a
                    float32 tensor ``[N, len(reward_terms)]`` on ``device``;
                    else a dict of float32 ``[N]`` tensors, the same names
                    every step; either way the terms sum to the reward
metrics             ``info["metrics"]``: with ``metric_names`` declared, a
                    float32 tensor ``[N, len(metric_names)]`` on ``device``;
                    else a dict of float32 ``[N]`` tensors, the same names
                    every step
success             ``info["success"]``: bool ``[N]``; all False when
                    ``reports_success`` is False
same-step reset     ``metadata["autoreset_mode"]`` is SAME_STEP, and no episode
                    runs past ``max_episode_steps`` (an env that resets one
                    step late shows an episode one step too long)
group reset         ``reset(options={"group_size": G})``: identical initial
                    observations within each block of G envs; a G that does
                    not divide ``num_envs`` raises ValueError
render              only for an env with ``render_mode == "rgb_array"``:
                    ``metadata`` lists ``"rgb_array"`` in ``render_modes`` and
                    a ``render_fps`` > 0; ``render(env_ids)`` of the first and
                    last env returns uint8 ``[2, H, W, 3]`` (H, W > 0) on
                    ``device`` or the CPU
==================  ==========================================================

The check steps the env (``2 * max_episode_steps + 2`` steps by default,
with actions drawn from a seeded generator) and leaves it in whatever state
that produces; build a fresh env for training.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import torch
from gymnasium.vector import AutoresetMode

from rlchain.core import observations
from rlchain.core.envs.base import _TERM_ATTRIBUTES, info_terms

__all__ = ["VecEnvContractError", "check_vec_env"]


class VecEnvContractError(ValueError):
    """An env broke a rule of the :class:`~rlchain.core.envs.base.VecEnv` contract; the message names the rule."""

    def __init__(self, rule: str, message: str) -> None:
        self.rule = rule
        super().__init__(f"VecEnv contract, rule '{rule}': {message}")


def _require(ok: bool, rule: str, message: str | Callable[[], str]) -> None:
    """Raise :class:`VecEnvContractError` unless ``ok``; a callable message is built only then."""
    if not ok:
        raise VecEnvContractError(rule, message() if callable(message) else message)


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    if a.type == "cuda":
        index = lambda d: d.index if d.index is not None else torch.cuda.current_device()  # noqa: E731
        return index(a) == index(b)
    return True


def _check_tensor(
    rule: str, name: str, x: Any, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> None:
    _require(isinstance(x, torch.Tensor), rule, f"{name} is a {type(x).__name__}: expected a torch.Tensor")
    _require(tuple(x.shape) == shape, rule, f"{name} has shape {tuple(x.shape)}: expected {shape}")
    _require(x.dtype == dtype, rule, f"{name} has dtype {x.dtype}: expected {dtype}")
    _require(_same_device(x.device, device), rule, f"{name} is on {x.device}: expected the env's device {device}")


def _check_attributes(env: Any) -> None:
    rule = "attributes"
    for name in (
        "num_envs",
        "device",
        "max_episode_steps",
        "single_observation_space",
        "single_action_space",
        "observation_space",
        "action_space",
        "reports_success",
        "resumes_episodes",
        "reset",
        "step",
        "state_dict",
        "load_state_dict",
    ):
        _require(hasattr(env, name), rule, f"the env has no attribute {name!r}")
    n = env.num_envs
    _require(isinstance(n, int) and not isinstance(n, bool) and n > 0, rule, f"num_envs={n!r}: expected an integer > 0")
    _require(
        isinstance(env.device, torch.device),
        rule,
        f"device={env.device!r} is a {type(env.device).__name__}: expected a torch.device",
    )
    limit = env.max_episode_steps
    _require(
        isinstance(limit, int) and not isinstance(limit, bool) and limit > 0,
        rule,
        f"max_episode_steps={limit!r}: expected an integer > 0 (episodes must end for evaluation)",
    )
    for name in ("reports_success", "resumes_episodes"):
        flag = getattr(env, name)
        _require(isinstance(flag, bool), rule, f"{name}={flag!r}: expected True or False")
    for group, name in _TERM_ATTRIBUTES.items():
        names = getattr(env, name, None)
        if names is None:
            continue
        _require(
            isinstance(names, tuple) and all(isinstance(x, str) and x for x in names),
            rule,
            f"{name}={names!r}: expected a tuple of non-empty strings (the columns of info[{group!r}]) or None",
        )
        repeated = sorted({x for x in names if names.count(x) > 1})
        _require(
            not repeated, rule, f"{name}={names!r} repeats {', '.join(map(repr, repeated))}: expected distinct names"
        )


def _check_spaces(env: Any) -> None:
    rule, n = "spaces", env.num_envs
    obs_space, act_space = env.single_observation_space, env.single_action_space
    try:
        observations.group_spaces(obs_space)
    except ValueError as err:
        raise VecEnvContractError(rule, f"single_observation_space: {err}") from None
    _require(
        isinstance(act_space, (gym.spaces.Box, gym.spaces.Discrete)),
        rule,
        f"single_action_space is {act_space!r}: expected a gymnasium Box or Discrete",
    )
    for batched, single, name in (
        (env.observation_space, obs_space, "observation_space"),
        (env.action_space, act_space, "action_space"),
    ):
        expected = gym.vector.utils.batch_space(single, n)
        _require(
            isinstance(batched, gym.Space) and batched.shape == expected.shape,
            rule,
            f"{name} is {batched!r}: expected the batch of {n} single spaces, {expected!r}",
        )


def _check_obs(rule: str, name: str, obs: Any, env: Any, rows: torch.Tensor | None = None) -> None:
    """``obs`` of the env's observation space (each group's dtype, shape and device), finite (on ``rows`` only)."""
    space, n = env.single_observation_space, env.num_envs
    if not observations.is_grouped(space):
        _check_tensor(rule, name, obs, (n, *space.shape), observations.dtype(space), env.device)
        _require(bool(torch.isfinite(obs if rows is None else obs[rows]).all()), rule, f"{name} {_nan(rows)}")
        return
    groups = observations.group_spaces(space)
    keys = sorted(obs.keys()) if hasattr(obs, "keys") and hasattr(obs, "batch_size") else None
    _require(
        keys == sorted(groups),
        rule,
        f"{name} is a {type(obs).__name__}"
        + (f" with the groups {keys}" if keys is not None else "")
        + f": expected a TensorDict of the groups {sorted(groups)} (the Dict observation space's)",
    )
    for group, box in groups.items():
        x = obs[group]
        _check_tensor(rule, f"{name}[{group!r}]", x, (n, *box.shape), observations.dtype(box), env.device)
        _require(bool(torch.isfinite(x if rows is None else x[rows]).all()), rule, f"{name}[{group!r}] {_nan(rows)}")


def _nan(rows: torch.Tensor | None) -> str:
    return "contains NaN or inf" if rows is None else "has NaN or inf on a done row"


def _flat(obs: Any, env: Any) -> torch.Tensor:
    """Every group of ``obs`` flattened and concatenated: ``[N, total]``, for comparing observations."""
    names = observations.group_names(env.single_observation_space)
    return torch.cat([x.reshape(x.shape[0], -1).float() for x in observations.leaves(obs, names)], -1)


def _action_sampler(env: Any, seed: int):
    """``sample() -> action`` of the env's action dtype and shape, from a seeded CPU generator."""
    space, n = env.single_action_space, env.num_envs
    gen = torch.Generator().manual_seed(seed)
    if isinstance(space, gym.spaces.Discrete):
        return lambda: torch.randint(0, int(space.n), (n,), generator=gen).to(env.device)
    low = torch.as_tensor(space.low, dtype=torch.float32).clamp(-1.0, 1.0)
    high = torch.as_tensor(space.high, dtype=torch.float32).clamp(-1.0, 1.0)
    return lambda: (low + (high - low) * torch.rand((n, *space.shape), generator=gen)).to(env.device)


def _check_reset(env: Any, seed: int) -> torch.Tensor:
    out = env.reset(seed=seed)
    _require(isinstance(out, tuple) and len(out) == 2, "reset", "reset() must return (obs, info)")
    obs, info = out
    _check_obs("reset", "reset() obs", obs, env)
    _require(isinstance(info, dict), "reset", f"reset() info is a {type(info).__name__}: expected a dict")
    return obs


def _check_step(env: Any, action: torch.Tensor, step: int) -> tuple:
    n = env.num_envs
    out = env.step(action)
    _require(
        isinstance(out, tuple) and len(out) == 5,
        "step",
        "step() must return (obs, reward, terminated, truncated, info)",
    )
    obs, reward, terminated, truncated, info = out
    _check_obs("step", f"step {step}: obs", obs, env)
    _check_tensor("step", f"step {step}: reward", reward, (n,), torch.float32, env.device)
    _check_tensor("step", f"step {step}: terminated", terminated, (n,), torch.bool, env.device)
    _check_tensor("step", f"step {step}: truncated", truncated, (n,), torch.bool, env.device)
    _require(isinstance(info, dict), "info keys", f"step {step}: info is a {type(info).__name__}: expected a dict")
    missing = [k for k in ("final_obs", "rewards", "metrics", "success") if k not in info]
    _require(not missing, "info keys", f"step {step}: info lacks {', '.join(map(repr, missing))}")
    done = terminated | truncated
    _check_obs("final_obs", f"step {step}: info['final_obs']", info["final_obs"], env, rows=done)
    for group, rule in _RULES.items():
        _check_terms(env, info, group, rule, step)
    names, terms = info_terms(env, info, "rewards")
    if names:
        total = terms.sum(-1)
        _require(
            torch.allclose(total, reward, rtol=1e-4, atol=1e-5),
            "reward terms",
            lambda: (
                f"step {step}: the info['rewards'] terms sum to {total.tolist()}, the reward is {reward.tolist()}: "
                f"the terms {list(names)} must be weighted and sum to the reward"
            ),
        )
    _check_tensor("success", f"step {step}: info['success']", info["success"], (n,), torch.bool, env.device)
    if not env.reports_success:
        _require(
            not bool(info["success"].any()),
            "success",
            f"step {step}: info['success'] is True somewhere while reports_success is False",
        )
    return obs, reward, terminated, truncated, info


#: The rule of each ``info`` group of named terms.
_RULES = {"rewards": "reward terms", "metrics": "metrics"}


def _check_terms(env: Any, info: dict, group: str, rule: str, step: int) -> None:
    """``info[group]`` in its form: the declared ``[N, K]`` tensor, or a dict of ``[N]`` tensors."""
    n, terms, attribute = env.num_envs, info[group], _TERM_ATTRIBUTES[group]
    names = getattr(env, attribute, None)
    where = f"step {step}: info[{group!r}]"
    if names is None:
        _require(
            isinstance(terms, dict),
            rule,
            f"{where} is a {type(terms).__name__}: expected a dict of [N] tensors, "
            f"or declare its column names in {attribute} for the [N, K] tensor form",
        )
        for name, value in terms.items():
            _check_tensor(rule, f"{where}[{name!r}]", value, (n,), torch.float32, env.device)
        return
    shape = (n, len(names))
    _require(
        isinstance(terms, torch.Tensor),
        rule,
        f"{where} is a {type(terms).__name__}: expected a float32 tensor {shape}, one column per name of "
        f"{attribute}={names!r} (None for the dict form)",
    )
    _require(
        tuple(terms.shape) == shape,
        rule,
        f"{where} has shape {tuple(terms.shape)}: expected {shape} = (num_envs, len({attribute})), "
        f"one column per name of {attribute}={names!r}",
    )
    _check_tensor(rule, where, terms, shape, torch.float32, env.device)


def _check_rollout(env: Any, num_steps: int, seed: int) -> None:
    """Step ``num_steps`` times: every per-step rule and the time limit."""
    n, limit = env.num_envs, env.max_episode_steps
    mode = getattr(env, "metadata", {}).get("autoreset_mode")
    _require(
        mode in (AutoresetMode.SAME_STEP, AutoresetMode.SAME_STEP.value),
        "same-step reset",
        f"metadata['autoreset_mode'] is {mode!r}: expected AutoresetMode.SAME_STEP",
    )
    sample = _action_sampler(env, seed)
    _check_reset(env, seed)
    length = torch.zeros(n, dtype=torch.int64)
    names: dict[str, Any] = {}
    final_rows, final_equal_obs, obs_seen = 0, 0, None
    obs_varies = False
    for step in range(num_steps):
        obs, reward, terminated, truncated, info = _check_step(env, sample(), step)
        for group, rule in _RULES.items():
            declared = getattr(env, _TERM_ATTRIBUTES[group], None) is not None
            current = info_terms(env, info, group)[0]
            current = current if declared else frozenset(current)  # a declared order is the columns'
            first = names.setdefault(group, current)
            _require(
                current == first,
                rule,
                f"step {step}: info[{group!r}] has {_listed(current)}, the first step had {_listed(first)}: "
                "report the same names every step",
            )
        done = (terminated | truncated).cpu()
        length += 1
        too_long = (length > limit) | (length.eq(limit) & ~done)
        _require(
            not bool(too_long.any()),
            "same-step reset",
            lambda: (
                f"step {step}: env {int(too_long.nonzero()[0])} has run {int(length.max())} steps without "  # noqa: B023 - built before the loop goes on
                f"terminated or truncated: episodes must end by max_episode_steps={limit}, and an env that ends "
                "must reset in the same step()"
            ),
        )
        length.masked_fill_(done, 0)
        flat = _flat(obs, env)
        if obs_seen is not None and not torch.equal(obs_seen, flat):
            obs_varies = True
        obs_seen = flat.clone()
        if bool(done.any()):
            rows = done.to(flat.device)
            final_rows += int(rows.sum())
            final_equal_obs += int((_flat(info["final_obs"], env)[rows] == flat[rows]).all(-1).sum())
    # An env that puts the reset observation (or nothing new) into final_obs
    # breaks bootstrapping at every time-out; over many ends it shows.
    _require(
        not (obs_varies and final_rows >= 4 and final_equal_obs == final_rows),
        "final_obs",
        f"on all {final_rows} done rows info['final_obs'] equals the returned obs: final_obs must be the "
        "observation the episode ended on, and obs the first of the new episode",
    )


def _listed(names: Any) -> list[str]:
    """Names as a list: a declared tuple in its order, a dict's in sorted order."""
    return list(names) if isinstance(names, tuple) else sorted(names)


def _check_seeding(env: Any, seed: int, steps: int) -> None:
    """Two resets with one seed and one action sequence give one trajectory."""
    trajectories = []
    for _ in range(2):
        sample = _action_sampler(env, seed + 1)
        obs, _ = env.reset(seed=seed)
        record = [_flat(obs, env).clone()]
        for _ in range(steps):
            obs, reward, terminated, truncated, _ = env.step(sample())
            record += [_flat(obs, env).clone(), reward.clone(), terminated.clone(), truncated.clone()]
        trajectories.append(record)
    for i, (a, b) in enumerate(zip(*trajectories)):
        _require(
            torch.equal(a, b),
            "seeding",
            f"reset(seed={seed}) twice, then the same actions, gave different trajectories "
            f"(first difference at step {(i + 3) // 4}): seed every random stream of the env from reset's seed",
        )


def _check_group_reset(env: Any, seed: int) -> None:
    n = env.num_envs
    divisors = [g for g in range(2, n + 1) if n % g == 0]
    for g in divisors[:1] + divisors[-1:] if divisors else []:
        obs, _ = env.reset(seed=seed, options={"group_size": g})
        _check_obs("group reset", f"reset(options={{'group_size': {g}}}) obs", obs, env)
        blocks = _flat(obs, env).reshape(n // g, g, -1)
        same = (blocks == blocks[:, :1]).all(-1).all(-1)
        _require(
            bool(same.all()),
            "group reset",
            lambda: (
                f"reset(options={{'group_size': {g}}}): the envs of group {int((~same).nonzero()[0])} start from "  # noqa: B023
                f"different observations: each block of {g} consecutive envs must share one initial state"  # noqa: B023
            ),
        )
    bad = next((g for g in range(2, n + 2) if n % g), None)
    try:
        env.reset(seed=seed, options={"group_size": bad})
    except ValueError:
        pass
    else:
        raise VecEnvContractError(
            "group reset", f"reset(options={{'group_size': {bad}}}) with num_envs={n} did not raise ValueError"
        )


def _check_render(env: Any) -> None:
    """The render rule, for an env built with ``render_mode="rgb_array"`` (two frames only: cheap at any N)."""
    if getattr(env, "render_mode", None) != "rgb_array":
        return
    rule, metadata = "render", getattr(env, "metadata", {})
    modes, fps = metadata.get("render_modes") or [], metadata.get("render_fps")
    _require(
        "rgb_array" in modes, rule, f"render_mode is 'rgb_array' but metadata['render_modes'] is {modes!r}: list it"
    )
    _require(
        isinstance(fps, (int, float)) and not isinstance(fps, bool) and fps > 0,
        rule,
        f"metadata['render_fps'] is {fps!r}: expected a number > 0 (frames per second, one frame per step)",
    )
    ids = [0, env.num_envs - 1]
    frames = env.render(ids)
    _require(
        isinstance(frames, torch.Tensor), rule, f"render({ids}) is a {type(frames).__name__}: expected a torch.Tensor"
    )
    shape = tuple(frames.shape)
    _require(
        len(shape) == 4 and shape[0] == 2 and shape[3] == 3 and shape[1] > 0 and shape[2] > 0,
        rule,
        f"render({ids}) has shape {shape}: expected (2, H, W, 3), RGB frames of the 2 envs asked for",
    )
    _require(frames.dtype == torch.uint8, rule, f"render({ids}) has dtype {frames.dtype}: expected torch.uint8")
    _require(
        _same_device(frames.device, env.device) or frames.device.type == "cpu",
        rule,
        f"render({ids}) is on {frames.device}: expected the env's device {env.device} or the CPU",
    )


def check_vec_env(env: Any, num_steps: int | None = None, seed: int = 0) -> None:
    """Check ``env`` against every rule of the VecEnv contract (see the module docstring).

    Args:
        env: the env to check; it is reset and stepped.
        num_steps: steps of the main rollout; default ``2 * max_episode_steps + 2``,
            enough for every env to pass its time limit twice.
        seed: seeds the env's resets and the random actions.

    Raises:
        VecEnvContractError: (a ``ValueError``) the first broken rule, named
            in the message with what was found and what is expected.
    """
    _check_attributes(env)
    _check_spaces(env)
    _check_rollout(env, num_steps if num_steps is not None else 2 * env.max_episode_steps + 2, seed)
    _check_seeding(env, seed, steps=min(env.max_episode_steps + 1, 64))
    _check_group_reset(env, seed)
    _check_render(env)
