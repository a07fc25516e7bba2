"""Headless batched drawing in torch: the shapes the built-in tasks' ``render`` is made of.

A frame is drawn in world coordinates (metres, y up) on a fixed grid of pixel
centres (:func:`pixel_centres`), built once per env. Each shape is a bool
mask ``[K, H, W]`` over the ``K`` frames being drawn, computed from the
separable coordinates of the grid: a pixel's offset from a shape's centre is
an x part ``[K, 1, W]`` plus a y part ``[K, H, 1]``, so each mask costs a few
elementwise ops of ``K * H * W`` elements and no Python loop over envs. The
masks paint integer labels into a uint8 label map ``[K, H, W]`` (later shapes
over earlier ones, :meth:`torch.Tensor.masked_fill_`) and one palette lookup
turns labels into RGB (:func:`colour`). Everything stays on the device of its
inputs: no host-device transfer and no sync, on the CPU as on CUDA.

Shapes are not anti-aliased: a pixel belongs to a shape when its centre does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["blend", "box_frame", "colour", "disc", "palette", "pixel_centres", "squared_distance"]


def pixel_centres(
    height: int, width: int, x_range: tuple[float, float], y_range: tuple[float, float], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """World coordinates of the pixel centres of a ``height x width`` frame that shows ``x_range x y_range``.

    Column ``j`` is at ``x = x0 + (j + 0.5) * (x1 - x0) / width``; row ``i``
    at ``y = y1 - (i + 0.5) * (y1 - y0) / height`` (row 0 is the top: y up).

    Args:
        height, width: frame size, pixels.
        x_range, y_range: ``(low, high)`` of the world shown, m.
        device: torch device of the result.

    Returns:
        ``(xs, ys)``: float32 ``[W]`` and ``[H]``, m.
    """
    (x0, x1), (y0, y1) = x_range, y_range
    cols = torch.arange(width, device=device, dtype=torch.float32) + 0.5
    rows = torch.arange(height, device=device, dtype=torch.float32) + 0.5
    return x0 + cols * ((x1 - x0) / width), y1 - rows * ((y1 - y0) / height)


def _offsets(
    xs: torch.Tensor, ys: torch.Tensor, cx: torch.Tensor, cy: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Offsets of the pixel centres from ``K`` points: x part ``[K, 1, W]`` and y part ``[K, H, 1]``, m."""
    return xs[None, None, :] - cx[:, None, None], ys[None, :, None] - cy[:, None, None]


def disc(xs: torch.Tensor, ys: torch.Tensor, cx: torch.Tensor, cy: torch.Tensor, radius: float) -> torch.Tensor:
    """The pixels within ``radius`` of ``(cx, cy)``, one disc per frame.

    Args:
        xs, ys: pixel centres, float32 ``[W]`` and ``[H]`` (:func:`pixel_centres`), m.
        cx, cy: disc centres, float32 ``[K]``, m.
        radius: m.

    Returns:
        bool ``[K, H, W]``.
    """
    return squared_distance(xs, ys, cx, cy) <= radius * radius


def squared_distance(xs: torch.Tensor, ys: torch.Tensor, cx: torch.Tensor, cy: torch.Tensor) -> torch.Tensor:
    """Squared distance of every pixel centre from ``(cx, cy)``: float32 ``[K, H, W]``, m^2.

    Args:
        xs, ys: pixel centres, float32 ``[W]`` and ``[H]``, m.
        cx, cy: points, float32 ``[K]``, m.
    """
    dx, dy = _offsets(xs, ys, cx, cy)
    return dx.square() + dy.square()


def box_frame(
    xs: torch.Tensor, ys: torch.Tensor, cx: torch.Tensor, cy: torch.Tensor, yaw: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every pixel centre in the frame of a body at ``(cx, cy)`` turned by ``yaw``: ``(u, v)``.

    ``u`` runs along the body's x axis (``(cos yaw, sin yaw)`` in the world),
    ``v`` along its y axis; a box of half sizes ``(a, b)`` is then
    ``(u.abs() <= a) & (v.abs() <= b)``.

    Args:
        xs, ys: pixel centres, float32 ``[W]`` and ``[H]``, m.
        cx, cy: body positions, float32 ``[K]``, m.
        yaw: body angles, float32 ``[K]``, rad (counter-clockwise from the world x axis).

    Returns:
        ``(u, v)``, float32 ``[K, H, W]`` each, m.
    """
    dx, dy = _offsets(xs, ys, cx, cy)
    c, s = torch.cos(yaw)[:, None, None], torch.sin(yaw)[:, None, None]
    return c * dx + s * dy, c * dy - s * dx


def palette(colours: Sequence[Sequence[float]], device: torch.device) -> torch.Tensor:
    """The colours of labels ``0..P-1`` as a uint8 ``[P, 3]`` RGB tensor on ``device``.

    Args:
        colours: ``P`` RGB triples in ``[0, 255]`` (rounded; a blend of two colours may be fractional).
    """
    return torch.tensor(colours, dtype=torch.float32, device=device).round().clamp(0, 255).to(torch.uint8)


def colour(labels: torch.Tensor, colours: torch.Tensor) -> torch.Tensor:
    """RGB frames of a label map: ``colours[labels]``.

    Args:
        labels: uint8 ``[K, H, W]``, each below ``P``.
        colours: uint8 ``[P, 3]`` (:func:`palette`), on the device of ``labels``.

    Returns:
        uint8 ``[K, H, W, 3]``, contiguous.
    """
    # index_select over the flat map is several times faster than colours[labels] on the CPU.
    return colours.index_select(0, labels.reshape(-1).int()).view(*labels.shape, 3)


def blend(under: Sequence[float], over: Sequence[float], alpha: float) -> tuple[float, ...]:
    """The colour of ``over`` drawn with opacity ``alpha`` on ``under`` (RGB triples)."""
    return tuple((1 - alpha) * a + alpha * b for a, b in zip(under, over))
