"""Evaluation videos: H.264 MP4 files (imageio with imageio-ffmpeg) and their animated-GIF copy for TensorBoard.

Both encoders are imageio's; they come with the ``video`` extra
(``pip install "rlchain[video]"``).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np

from rlchain.files import write_bytes

__all__ = ["VIDEO_EXTRA", "check_video_support", "encode_gif", "prefer_headless_gl", "write_mp4"]

#: What to install for videos.
VIDEO_EXTRA = 'pip install "rlchain[video]"'


def check_video_support() -> str | None:
    """Why videos cannot be written here (the rest of a sentence), or None when they can."""
    missing = [name for name in ("imageio", "imageio_ffmpeg") if importlib.util.find_spec(name) is None]
    if missing:
        return f" needs {' and '.join(m.replace('_', '-') for m in missing)}, an optional extra: {VIDEO_EXTRA}"
    return None


def prefer_headless_gl() -> None:
    """Without a display, let MuJoCo render through EGL unless ``MUJOCO_GL`` is set: call before ``mujoco`` is
    imported (it reads the variable then), i.e. before any env is built."""
    if not os.environ.get("DISPLAY"):
        os.environ.setdefault("MUJOCO_GL", "egl")


def write_mp4(path: str | os.PathLike, frames: np.ndarray, fps: float) -> Path:
    """Encode ``frames`` (uint8 ``[T, H, W, 3]``, RGB; H and W even) as an H.264 MP4 at ``fps`` and write it
    atomically to ``path``; returns the path.

    Raises:
        OSError: the file cannot be written (the previous file stays).
        ValueError: frames that are not uint8 ``[T, H, W, 3]`` with T >= 1.
    """
    import imageio.v3 as iio

    _check_frames(frames)
    # yuv420p: the pixel format every player decodes; macro_block_size=2 keeps any even size as it is;
    # veryfast: x264's speed preset, which makes files of the same size as its default here in 80% of the time.
    data = iio.imwrite(
        "<bytes>",
        frames,
        extension=".mp4",
        fps=float(fps),
        codec="libx264",
        pixelformat="yuv420p",
        macro_block_size=2,
        output_params=["-preset", "veryfast"],
    )
    return write_bytes(path, data)


def encode_gif(frames: np.ndarray, fps: float) -> bytes:
    """``frames`` (uint8 ``[T, H, W, 3]``) as the bytes of a looping animated GIF at ``fps`` (Pillow, via imageio).

    Raises:
        ValueError: frames that are not uint8 ``[T, H, W, 3]`` with T >= 1.
    """
    import imageio.v3 as iio

    _check_frames(frames)
    return iio.imwrite("<bytes>", frames, extension=".gif", duration=1000.0 / float(fps), loop=0)


def _check_frames(frames: np.ndarray) -> None:
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or frames.shape[0] < 1:
        raise ValueError(f"frames of dtype {frames.dtype} and shape {frames.shape}: expected uint8 [T >= 1, H, W, 3]")
