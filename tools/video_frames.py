"""Lay frames of an episode GIF side by side in one PNG (the README's validation frames).

    python tools/video_frames.py RUN_DIR/val_videos/step_150/reach_blue_success.gif \
        --frames 3 --scale 3 --out docs/images/embodied_val_frames.png

``--frames`` frames evenly spaced from the first to the last, each enlarged ``--scale``
times (nearest neighbour, so the pixels the policy saw stay visible).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from PIL import Image, ImageSequence


def frames_strip(gif: Path, count: int, scale: int) -> Image.Image:
    """``count`` evenly spaced frames of ``gif``, left to right, each ``scale`` times larger."""
    with Image.open(gif) as video:
        frames = [frame.convert("RGB") for frame in ImageSequence.Iterator(video)]
    if not frames:
        raise ValueError(f"{gif} has no frames")
    count = max(1, min(count, len(frames)))
    picks = [round(i * (len(frames) - 1) / max(count - 1, 1)) for i in range(count)]
    width, height = frames[0].size
    strip = Image.new("RGB", (width * scale * count, height * scale))
    for slot, index in enumerate(picks):
        big = frames[index].resize((width * scale, height * scale), Image.NEAREST)
        strip.paste(big, (slot * width * scale, 0))
    return strip


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gif", type=Path)
    parser.add_argument("--frames", type=int, default=3)
    parser.add_argument("--scale", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    strip = frames_strip(args.gif, args.frames, args.scale)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    strip.save(args.out)
    print(f"wrote {args.out} ({strip.size[0]}x{strip.size[1]})")


if __name__ == "__main__":
    main()
