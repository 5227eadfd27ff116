"""Episode videos for validation, and a still for the README.

:class:`EpisodeRecorder` keeps an episode's frames (uint8 H x W x 3) within a budget: past
``max_frames`` it drops every other frame it holds and keeps half as many from then on,
so a long episode still spans start to end. ``write_video`` writes ``.gif`` with Pillow
and ``.mp4`` with imageio when that is installed; both are imported only when a video is
written, so training without videos needs neither. Small simulator frames (64 x 64) are
scaled up by whole pixels (nearest neighbour: no blur) to be watchable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence, Union

import numpy as np

Frame = np.ndarray


def _pillow() -> Any:
    try:
        from PIL import Image
    except ImportError as exc:  # an optional dependency: say how to get it
        raise RuntimeError("writing GIF/PNG needs Pillow: pip install pillow") from exc
    return Image


def resize_frame(frame: Frame, scale: int = 1, max_side: Optional[int] = None) -> Frame:
    """``frame`` scaled up ``scale`` times (whole pixels), then shrunk to fit ``max_side``
    (every n-th pixel: cheap, and fine for a preview)."""
    frame = np.asarray(frame)
    if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
        raise ValueError(f"a frame is uint8 HxWx3, got {frame.dtype} {frame.shape}")
    if scale > 1:
        frame = frame.repeat(scale, axis=0).repeat(scale, axis=1)
    if max_side is not None and max(frame.shape[:2]) > max_side:
        stride = -(-max(frame.shape[:2]) // int(max_side))  # ceil
        frame = frame[::stride, ::stride]
    return np.ascontiguousarray(frame)


class EpisodeRecorder:
    """Frames of one episode: ``add`` an image or an observation dict after each step."""

    def __init__(self, max_frames: int = 200, every: int = 1, scale: int = 1,
                 max_side: Optional[int] = None):
        if max_frames < 2 or every < 1:
            raise ValueError("max_frames must be >= 2 and every >= 1")
        self.max_frames, self.scale, self.max_side = int(max_frames), int(scale), max_side
        self._every0 = int(every)
        self.reset()

    def reset(self) -> None:
        """Forget the frames (a new episode)."""
        self.frames: List[Frame] = []
        self.every = self._every0
        self._seen = 0

    def add(self, frame_or_obs: Union[Frame, Mapping[str, Any]]) -> None:
        image = frame_or_obs["image"] if isinstance(frame_or_obs, Mapping) else frame_or_obs
        self._seen += 1
        if (self._seen - 1) % self.every:
            return
        self.frames.append(resize_frame(image, self.scale, self.max_side))
        if len(self.frames) > self.max_frames:  # halve the frame rate, keep the whole span
            self.frames = self.frames[::2]
            self.every *= 2

    def __len__(self) -> int:
        return len(self.frames)

    def save(self, path: Union[str, Path], fps: float = 10.0) -> Path:
        return write_video(self.frames, path, fps)


def write_video(frames: Sequence[Frame], path: Union[str, Path], fps: float = 10.0) -> Path:
    """Write ``frames`` as ``path`` (``.gif`` or ``.mp4``); the path written. Pillow
    merges identical consecutive GIF frames (their durations add up)."""
    path = Path(path)
    if not frames:
        raise ValueError("no frames to write")
    frames = [resize_frame(f) for f in frames]
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix.lower()
    if suffix == ".gif":
        image = _pillow()
        first, *rest = [image.fromarray(f) for f in frames]
        first.save(path, save_all=True, append_images=rest, loop=0,
                   duration=max(1, int(round(1000.0 / fps))))
    elif suffix == ".mp4":
        try:
            import imageio.v2 as imageio
        except ImportError as exc:
            raise RuntimeError("writing MP4 needs imageio with ffmpeg: "
                               "pip install 'imageio[ffmpeg]' (or write a .gif)") from exc
        imageio.mimwrite(path, frames, fps=fps)
    else:
        raise ValueError(f"write .gif or .mp4, not {path.name!r}")
    return path


def first_frame_png(frames: Union[Frame, Sequence[Frame]], path: Union[str, Path],
                    scale: int = 4) -> Path:
    """The first frame (or the one frame given) as a PNG, ``scale`` times larger."""
    first = frames if isinstance(frames, np.ndarray) and frames.ndim == 3 else frames[0]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _pillow().fromarray(resize_frame(first, scale)).save(path, format="PNG")
    return path
