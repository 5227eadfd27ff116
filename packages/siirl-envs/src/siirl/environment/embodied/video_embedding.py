"""Frozen video encoders: one embedding per episode, for SRPO's progress reward.

SRPO scores a failed episode by how near its video embedding lies to the successful
episodes of the same task (``siirl.engine.reward_score.embodied.progress_rewards``). The
embodied rollout records each episode's frames (uint8 ``[T, H, W, 3]``, any ``T``) and
calls ``build_video_encoder(path, device=..., fp16=...).embed(videos)`` to get
float32 ``[N, D]``. Two encoders:

* ``builtin`` (:class:`PixelVideoEncoder`): blurred colour grids of a few frames; no
  weights, deterministic, milliseconds on a CPU. Enough for the ``reach`` tasks and tests.
* a transformers V-JEPA 2 checkpoint directory (:class:`VJEPA2VideoEncoder`), for real
  simulators (LIBERO): a fixed number of frames per episode, the encoder's last hidden
  state mean-pooled over its tokens.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, List, Optional, Protocol, Sequence, runtime_checkable

import numpy as np

from siirl.errors import ConfigError

if TYPE_CHECKING:
    import torch

SETTING = "actor_rollout_ref.embodied.video_embedding_model_path"


@runtime_checkable
class VideoEncoder(Protocol):
    """``embed(videos)``: N episodes (uint8 ``[T, H, W, 3]``, lengths may differ) ->
    float32 ``[N, dim]``. Frozen: the same videos always give the same embeddings."""

    dim: int

    def embed(self, videos: Sequence[np.ndarray]) -> np.ndarray: ...


def check_video(video: np.ndarray, index: int) -> np.ndarray:
    """``video`` as a uint8 ``[T, H, W, 3]`` array with ``T >= 1`` (a list of frames is
    stacked); anything else is the caller's bug, so it raises ValueError."""
    array = np.asarray(video)
    if array.dtype != np.uint8 or array.ndim != 4 or array.shape[-1] != 3 or not len(array):
        raise ValueError(f"video {index} must be uint8 [T, H, W, 3] with T >= 1, got "
                         f"{array.dtype} {array.shape}")
    return array


# ------------------------------------------------------------------------ the builtin one

def _area_resize(frames: np.ndarray, size: int) -> np.ndarray:
    """uint8 ``frames`` [K, H, W, 3] averaged into float64 [K, size, size, 3] cells.
    Summed as uint32: exact (a cell would need 16 million pixels to overflow), and ten
    times faster on a long video than floats or 64-bit integers."""
    sums = frames
    counts = np.ones((1, 1, 1, 1))
    for axis in (1, 2):
        length = sums.shape[axis]
        if length < size:  # too small to average: repeat pixels first
            sums = np.repeat(sums, -(-size // length), axis=axis)
            length = sums.shape[axis]
        starts = (np.arange(size) * length) // size
        shape = [1, 1, 1, 1]
        shape[axis] = size
        counts = counts * np.diff(np.append(starts, length)).reshape(shape)
        sums = np.add.reduceat(sums, starts, axis=axis, dtype=np.uint32)
    return sums / counts


def _projection(fine: int, grid: int, sigma: float) -> np.ndarray:
    """[grid, fine]: a Gaussian blur of ``sigma`` fine cells (rows renormalised at the
    border), then averaging down to ``grid`` cells; applied to rows and to columns."""
    cells = np.arange(fine)
    if sigma > 0:
        blur = np.exp(-0.5 * ((cells[:, None] - cells[None, :]) / sigma) ** 2)
        blur /= blur.sum(axis=1, keepdims=True)
    else:
        blur = np.eye(fine)
    width = fine // grid
    pool = (cells[None, :] // width == np.arange(grid)[:, None]) / width
    return pool @ blur


class PixelVideoEncoder:
    """The ``builtin`` encoder: where the episode ended up and how it got there, in pixels.

    Space: each frame is averaged into a ``fine`` x ``fine`` colour grid, blurred at each
    of ``sigmas`` (in fine cells: 4 and 8 are a quarter and half of the frame) and
    averaged down to ``grid`` x ``grid``. Blur makes the distance between two frames grow
    smoothly with how far an object moved instead of jumping once it leaves its cell;
    that is what puts a failure that stopped nearer the goal nearer the successes. The
    scales are first weighted so that a point of colour has the same norm at each, then
    by ``scale_weights``: the widest blur counts most, as it alone still grades moves
    across the whole frame (narrower ones saturate a quarter of the frame away).

    Time: the features of the frames at ``quantiles`` of the distance travelled in pixel
    space (how it got there), of the last frame times ``last_weight`` (where it got to:
    SRPO asks this first) and of the mean frame (where it spent its time). Quantiles of
    the distance, not of the time: a failure that stood still for most of its episode
    still shows its path, lined up with the successes' paths however long either lasted.
    A video that never changes uses its first frame there.

    ``dim = (len(quantiles) + 2) * len(sigmas) * grid * grid * 3``: 1920 by default. The
    defaults were chosen on ``reach`` episodes (failures that stop or turn back at
    different distances from the goal). Pixels know nothing of a robot's arm or a
    cluttered scene: real simulators want a pretrained encoder (V-JEPA 2).
    """

    def __init__(self, grid: int = 8, fine: int = 16, sigmas: Sequence[float] = (4.0, 8.0),
                 scale_weights: Sequence[float] = (1.0, 4.0), last_weight: float = 3.0,
                 quantiles: Sequence[float] = (0.25, 0.5, 0.75)):
        if fine % grid or not sigmas or len(scale_weights) != len(sigmas):
            raise ValueError(f"fine={fine} must be a multiple of grid={grid}, and sigmas "
                             f"{tuple(sigmas)} non-empty with one weight each")
        self.grid, self.fine = int(grid), int(fine)
        self.quantiles = tuple(float(q) for q in quantiles)
        self.last_weight = float(last_weight)
        projections = [_projection(self.fine, self.grid, float(s)) for s in sigmas]
        # a point at the centre has norm ||P[:, centre]||^2 after rows and columns, and
        # a weight w on the features is sqrt(w) on P
        centre = self.fine // 2
        unit = np.linalg.norm(projections[0][:, centre])
        self._projections = [p * (unit / np.linalg.norm(p[:, centre])) * np.sqrt(w)
                             for p, w in zip(projections, scale_weights, strict=True)]
        self.dim = (len(self.quantiles) + 2) * len(self._projections) * self.grid ** 2 * 3

    def _key_cells(self, video: np.ndarray) -> np.ndarray:
        """[Q + 2, fine, fine, 3]: the path's quantile frames, the last (weighted), the
        mean (every step is linear, so the mean frame's cells are the mean of the cells)."""
        cells = _area_resize(video, self.fine) / 255.0
        moves = np.linalg.norm(np.diff(cells.reshape(len(cells), -1), axis=0), axis=1)
        travelled = np.concatenate([[0.0], np.cumsum(moves)])
        picks = [int(np.searchsorted(travelled, q * travelled[-1])) for q in self.quantiles]
        last = cells[-1:] * self.last_weight
        return np.concatenate([cells[picks], last, cells.mean(axis=0)[None]])

    def embed(self, videos: Sequence[np.ndarray]) -> np.ndarray:
        rows: List[np.ndarray] = []
        for index, video in enumerate(videos):
            cells = self._key_cells(check_video(video, index))
            scales = [np.einsum("ai,kijc,bj->kabc", p, cells, p) for p in self._projections]
            rows.append(np.stack(scales, axis=1).reshape(-1))
        if not rows:
            return np.zeros((0, self.dim), np.float32)
        return np.stack(rows).astype(np.float32)


# ------------------------------------------------------------------------ V-JEPA 2

_IMAGENET_MEAN = (0.485, 0.456, 0.406)  # what V-JEPA 2 was trained on
_IMAGENET_STD = (0.229, 0.224, 0.225)


class VJEPA2VideoEncoder:
    """A transformers V-JEPA 2 checkpoint (``VJEPA2Model``), frozen.

    Each episode is cut to ``num_frames`` frames spread evenly from the first to the last
    (short episodes repeat frames; rounded up to whole tubelets), each frame is resized
    to the checkpoint's ``crop_size`` without cropping (the goal may lie at the edge of
    the workspace) and normalised as in pretraining; the encoder runs under no_grad
    without the predictor, and its last hidden state is averaged over all tokens:
    ``dim = hidden_size``. ``fp16`` applies on CUDA only: CPU half kernels are slow or
    missing, and siiRL's default turns fp16 on.
    """

    def __init__(self, path: str, *, device: str = "cpu", fp16: bool = False,
                 num_frames: int = 16, batch_size: int = 8):
        import torch
        from transformers import VJEPA2Model

        self._torch = torch
        self.device = torch.device(device)
        self.dtype = torch.float16 if fp16 and self.device.type == "cuda" else torch.float32
        # cast after loading: older transformers spell the loading dtype differently
        model = VJEPA2Model.from_pretrained(path)
        self.model = model.to(self.device, self.dtype).eval().requires_grad_(False)
        config = model.config
        tubelet = int(config.tubelet_size)
        self.num_frames = -(-max(int(num_frames), 1) // tubelet) * tubelet
        self.image_size = int(config.crop_size)
        self.batch_size = max(int(batch_size), 1)
        self.dim = int(config.hidden_size)

    def _pixels(self, video: np.ndarray) -> torch.Tensor:
        """[num_frames, 3, S, S] float32, normalised."""
        torch = self._torch
        picks = np.linspace(0, len(video) - 1, self.num_frames).round().astype(int)
        frames = torch.from_numpy(np.ascontiguousarray(video[picks])).to(self.device)
        frames = frames.permute(0, 3, 1, 2).float() / 255.0
        frames = torch.nn.functional.interpolate(
            frames, size=(self.image_size, self.image_size), mode="bilinear",
            align_corners=False, antialias=True)
        mean = torch.tensor(_IMAGENET_MEAN, device=self.device).view(1, 3, 1, 1)
        std = torch.tensor(_IMAGENET_STD, device=self.device).view(1, 3, 1, 1)
        return (frames - mean) / std

    def embed(self, videos: Sequence[np.ndarray]) -> np.ndarray:
        torch = self._torch
        videos = [check_video(v, i) for i, v in enumerate(videos)]
        out: List[np.ndarray] = []
        with torch.no_grad():
            for start in range(0, len(videos), self.batch_size):
                batch = torch.stack([self._pixels(v) for v in
                                     videos[start:start + self.batch_size]])
                hidden = self.model(pixel_values_videos=batch.to(self.dtype),
                                    skip_predictor=True).last_hidden_state
                out.append(hidden.float().mean(dim=1).cpu().numpy())
        if not out:
            return np.zeros((0, self.dim), np.float32)
        return np.concatenate(out).astype(np.float32)


# ------------------------------------------------------------------------ choosing one

def _refuse(path: str, reason: str) -> ConfigError:
    return ConfigError(
        f"{SETTING}={path!r}: {reason}. SRPO's progress reward embeds every episode's video "
        f"with a frozen encoder: set {SETTING}=builtin (a small pixel encoder, no download; "
        f"right for the reach tasks) or to a local directory holding a transformers V-JEPA 2 "
        f"checkpoint, e.g. `huggingface-cli download facebook/vjepa2-vitl-fpc64-256 "
        f"--local-dir ~/models/vjepa2-vitl-fpc64-256`.")


def _model_type(path: str) -> Optional[str]:
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as handle:
            return json.load(handle).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def build_video_encoder(path: Optional[str], *, device: str = "cpu",
                        fp16: bool = False) -> VideoEncoder:
    """The encoder ``path`` names: None, ``""`` or ``builtin`` -> :class:`PixelVideoEncoder`;
    a directory whose config.json has model_type ``vjepa2`` -> :class:`VJEPA2VideoEncoder`
    on ``device``. Anything else is a ConfigError naming the setting and the fix."""
    if path is None or str(path).strip() in ("", "builtin"):
        return PixelVideoEncoder()
    full = os.path.expanduser(str(path))
    if full.endswith(".pt") or full.endswith(".pth"):
        raise _refuse(path, "a raw PyTorch checkpoint (siiRL's original V-JEPA format), "
                            "which this port cannot load")
    if not os.path.isdir(full):
        raise _refuse(path, "no such directory")
    model_type = _model_type(full)
    if model_type != "vjepa2":
        found = "no readable config.json" if model_type is None else \
            f"config.json has model_type {model_type!r}"
        raise _refuse(path, f"{found}, not 'vjepa2'")
    try:
        from transformers import VJEPA2Model  # noqa: F401  (added to transformers mid-2025)
    except ImportError as exc:
        raise _refuse(path, "the installed transformers has no VJEPA2Model (pip install -U "
                            "transformers)") from exc
    return VJEPA2VideoEncoder(full, device=device, fp16=fp16)
