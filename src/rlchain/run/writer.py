"""One logging path: TensorBoard always, ``metrics.jsonl`` always, Weights & Biases when enabled."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rlchain.files import write_text

__all__ = ["MetricWriter"]


class MetricWriter:
    """Writes each row of scalars to every sink, keyed by ``global_step`` (env transitions).

    Args:
        log_dir: the run directory; ``tensorboard/`` and ``metrics.jsonl`` go in it.
        use_wandb: mirror every row to W&B (imported lazily). Offline runs
            need no network: set ``WANDB_MODE=offline`` or ``wandb_mode="offline"``.
        wandb_project, wandb_entity, wandb_mode, run_name: passed to ``wandb.init``.
        wandb_group, wandb_tags: the W&B run's group and tags.
        wandb_id: the id of the W&B run to continue (a resumed run's), or
            None for a new one; :attr:`wandb_id` holds the id in use.
        config: the run's configuration, shown as a hyperparameter table in
            TensorBoard's text tab and as the W&B run config.
        purge_step: for a run resumed at this ``global_step``: the rows logged
            after it (by the run before it stopped) are dropped from
            ``metrics.jsonl`` and TensorBoard, so the resumed run does not
            repeat them.

    ``metrics.jsonl`` is line-buffered: each row is on disk when :meth:`log` returns.
    """

    def __init__(
        self,
        log_dir: str | Path,
        use_wandb: bool = False,
        wandb_project: str = "rlchain",
        wandb_entity: str | None = None,
        wandb_mode: str | None = None,
        run_name: str | None = None,
        config: dict[str, Any] | None = None,
        purge_step: int | None = None,
        wandb_group: str | None = None,
        wandb_tags: list[str] | None = None,
        wandb_id: str | None = None,
    ) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        jsonl = self.log_dir / "metrics.jsonl"
        if purge_step is not None and jsonl.exists():
            _drop_rows_after(jsonl, purge_step)
        # TensorBoard drops the events at or after its purge_step, i.e. after the checkpoint's step.
        self.tb = SummaryWriter(
            str(self.log_dir / "tensorboard"), purge_step=None if purge_step is None else purge_step + 1
        )
        self._jsonl = open(jsonl, "a", buffering=1, encoding="utf-8")
        self._wandb = None
        self.wandb_id: str | None = None
        """The id of the W&B run this writer mirrors to (None without W&B)."""
        if config:
            flat = _flatten(config)
            table = "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in flat.items())
            self.tb.add_text("hyperparameters", table)
        if use_wandb:
            import wandb  # lazy: optional at run time

            self._wandb = wandb.init(
                project=wandb_project,
                entity=wandb_entity,
                name=run_name,
                group=wandb_group,
                tags=wandb_tags or None,
                mode=wandb_mode,
                dir=str(self.log_dir),
                config=config,
                id=wandb_id,
                resume="allow" if wandb_id is not None else None,  # a resumed run continues its W&B run's curves
                reinit="finish_previous",
            )
            self.wandb_id = self._wandb.id

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Write one row of scalars at ``step`` (global_step) to every sink."""
        for key, value in metrics.items():
            self.tb.add_scalar(key, value, step)
        row = {"global_step": step, **{k: (v if math.isfinite(v) else str(v)) for k, v in metrics.items()}}
        self._jsonl.write(json.dumps(row) + "\n")
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)

    def log_video(self, tag: str, path: str | Path, frames: Any, fps: float, step: int) -> None:
        """Log the video at ``path`` (an MP4 of ``frames``, uint8 ``[T, H, W, 3]``) at ``step`` (global_step).

        TensorBoard shows it as an animated GIF in its Images tab (what
        ``SummaryWriter.add_video`` writes, encoded here with imageio) at half
        the size and every other frame (GIF encoding is slow); W&B gets the
        MP4 itself.
        """
        from tensorboard.compat.proto.summary_pb2 import Summary

        from rlchain.run.video import encode_gif

        frames, fps = frames[::2, ::2, ::2], fps / 2
        _, height, width, channels = frames.shape
        image = Summary.Image(
            height=height, width=width, colorspace=channels, encoded_image_string=encode_gif(frames, fps)
        )
        self.tb.file_writer.add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)
        if self._wandb is not None:
            import wandb

            self._wandb.log({tag: wandb.Video(str(path), format="mp4")}, step=step)

    def flush(self) -> None:
        """Push buffered TensorBoard events to disk."""
        self.tb.flush()
        self._jsonl.flush()

    def close(self) -> None:
        """Flush and close every sink (safe to call twice)."""
        if self._jsonl.closed:
            return
        self.tb.close()
        self._jsonl.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def _flatten(cfg: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def _drop_rows_after(path: Path, step: int) -> None:
    """Rewrite ``metrics.jsonl`` at ``path`` (atomically) without its rows whose ``global_step`` exceeds ``step``."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = []
    for line in lines:
        try:
            if json.loads(line)["global_step"] > step:
                continue
        except (ValueError, KeyError, TypeError):  # a torn last line of a killed run
            continue
        kept.append(line if line.endswith("\n") else line + "\n")
    if len(kept) != len(lines):
        write_text(path, "".join(kept))
