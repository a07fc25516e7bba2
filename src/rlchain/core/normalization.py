"""Observation normalisation: running mean and variance of a stream of batches, kept in buffers.

:class:`RunningMeanStd` is the policy's normaliser of each vector observation group (and the reward scale's
statistics); its buffers travel with the ``state_dict``, so every checkpoint holds the statistics it acted with.
"""

from __future__ import annotations

import torch
from torch import nn

from rlchain.distributed import moments

__all__ = ["RunningMeanStd"]


class RunningMeanStd(nn.Module):
    """Running mean and variance of a stream of batches (Chan et al. 1979 parallel update).

    Buffers ``mean`` / ``var`` (float32 ``[dim]``) and ``count`` (float64 scalar)
    are part of the ``state_dict``. :meth:`update` runs on the device with no
    host sync; :meth:`normalize` returns ``clamp((x - mean) / sqrt(var + eps), ±clip)``.
    """

    def __init__(self, dim: int, eps: float = 1e-8, clip: float = 10.0) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("var", torch.ones(dim))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.eps, self.clip = eps, clip

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Fold a batch ``x`` of shape ``[..., dim]`` into the statistics (every rank's batch, in a multi-process run)."""
        x = x.reshape(-1, x.shape[-1]).float()
        batch_mean, batch_var, batch_count = moments(x, "the all-reduce of the observation statistics", unbiased=False)
        total = self.count + batch_count
        w = (batch_count / total).float()
        delta = batch_mean - self.mean
        self.mean += delta * w
        self.var.copy_(self.var * (1 - w) + batch_var * w + delta.square() * w * (1 - w))
        self.count.copy_(total)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised ``x``, same shape."""
        return ((x - self.mean) / torch.sqrt(self.var + self.eps)).clamp(-self.clip, self.clip)
