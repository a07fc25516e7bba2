"""A small recurrent policy for the tests of recurrence (collection, replay, evaluation, export), and the plain
step-by-step reference they hold sequence replay against."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from rlchain.core.policies import ActorCritic


def recurrent(env, rnn_type: str = "gru", cls=ActorCritic, **settings):
    """``cls`` for ``env``'s spaces with a 2-layer recurrent core of 8 features before an MLP of [16]; seeded."""
    torch.manual_seed(0)
    return cls(
        env.single_observation_space,
        env.single_action_space,
        rnn_type=rnn_type,
        rnn_hidden_size=8,
        rnn_num_layers=2,
        hidden_sizes=[16],
        **settings,
    )


def masked(state: TensorDict, done: torch.Tensor) -> TensorDict:
    """``state`` ``[B]`` zeroed where ``done`` (bool ``[B]``)."""
    return state.apply(lambda h: torch.where(done.view(-1, 1, 1), torch.zeros_like(h), h))


@torch.no_grad()
def step_by_step(policy, data: TensorDict):
    """The plain reference: one step at a time from ``data["hidden"][0]``, each step's state the one the previous
    step left, zeroed after a done step. Returns the log-probabilities and values of the stored actions ``[T, N]``,
    the state each step acted from and the state after each step (before any reset)."""
    h = data["hidden"][0]
    log_probs, values, states, after = [], [], [], []
    for t in range(data.batch_size[0]):
        step = TensorDict(
            {"obs": data["obs"][t], "hidden": h, "action": data["action"][t], "done": data["done"][t]},
            data.batch_size[1:],
        )
        out = policy.evaluate_actions(step.unsqueeze(0))  # a sequence of one step
        log_probs.append(out["sample_log_prob"][0])
        values.append(out["value"][0])
        states.append(h)
        after.append(policy.get_action(step.clone())["next_hidden"])
        h = masked(after[-1], data["done"][t])
    return torch.stack(log_probs), torch.stack(values), torch.stack(states), torch.stack(after)
