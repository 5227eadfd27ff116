"""Episode videos: a readable GIF with one frame per step, a frame budget that keeps the
whole episode, and a PNG still."""

import numpy as np
import pytest

from siirl.environment.embodied import (
    EpisodeRecorder,
    Reach2D,
    expert_action,
    first_frame_png,
    write_video,
)

Image = pytest.importorskip("PIL.Image")


def _expert_episode():
    env = Reach2D(image_size=32)
    recorder = EpisodeRecorder(scale=2)
    recorder.add(env.reset("push_green_right", 1))
    done = False
    while not done:
        obs, _, done, _ = env.step(expert_action(env)[None])
        recorder.add(obs)
    return recorder


def test_gif_has_one_frame_per_step(tmp_path):
    recorder = _expert_episode()
    path = recorder.save(tmp_path / "videos" / "episode.gif", fps=10)
    with Image.open(path) as gif:
        assert gif.n_frames == len(recorder) > 5
        assert gif.size == (64, 64)  # 32 x 32 frames scaled twice
        gif.seek(0)
        assert np.array_equal(np.asarray(gif.convert("RGB")), recorder.frames[0])


def test_png_still(tmp_path):
    frame = Reach2D(image_size=16).reset("reach_red", 0)["image"]
    path = first_frame_png([frame], tmp_path / "still.png", scale=4)
    with Image.open(path) as still:
        assert still.format == "PNG" and still.size == (64, 64)
        assert np.array_equal(np.asarray(still.convert("RGB"))[::4, ::4], frame)


def test_long_episodes_keep_their_span_within_the_budget():
    recorder = EpisodeRecorder(max_frames=10)
    frames = [np.full((8, 8, 3), i, np.uint8) for i in range(25)]
    for frame in frames:
        recorder.add(frame)
    assert 5 <= len(recorder) <= 10
    assert recorder.frames[0][0, 0, 0] == 0 and recorder.frames[-1][0, 0, 0] >= 16


def test_mp4_needs_imageio_or_says_so(tmp_path):
    frames = [np.full((16, 16, 3), 10 * i, np.uint8) for i in range(4)]
    try:
        import imageio  # noqa: F401
    except ImportError:
        with pytest.raises(RuntimeError, match="imageio"):
            write_video(frames, tmp_path / "episode.mp4")
        return
    assert write_video(frames, tmp_path / "episode.mp4").stat().st_size > 0
