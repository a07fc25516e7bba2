"""A small recurrent policy for the tests of recurrence (collection, replay, evaluation, export)."""

from __future__ import annotations

import torch

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
