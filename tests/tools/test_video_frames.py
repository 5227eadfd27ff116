"""tools/video_frames.py lays evenly spaced frames of an episode GIF side by side."""

import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

SCRIPT = Path(__file__).resolve().parents[2] / "tools/video_frames.py"


def test_strip_holds_first_middle_and_last_frame_enlarged(tmp_path):
    gif = tmp_path / "episode.gif"
    # five flat frames whose red channel counts 0, 50, ..., 200
    frames = [Image.fromarray(np.full((8, 10, 3), (50 * i, 0, 0), dtype=np.uint8))
              for i in range(5)]
    frames[0].save(gif, save_all=True, append_images=frames[1:], duration=100)
    out = tmp_path / "strip.png"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(gif), "--frames", "3",
                           "--scale", "2", "--out", str(out)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    strip = np.asarray(Image.open(out))
    assert strip.shape == (16, 60, 3)
    reds = [int(strip[0, 20 * i, 0]) for i in range(3)]
    assert abs(reds[0] - 0) <= 4 and abs(reds[1] - 100) <= 4 and abs(reds[2] - 200) <= 4
