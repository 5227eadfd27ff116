"""Frozen video encoders for SRPO: the builtin pixel encoder, a tiny random V-JEPA 2, and
the setting that picks one (``actor_rollout_ref.embodied.video_embedding_model_path``)."""

import json

import numpy as np
import pytest

from siirl.environment.embodied.video_embedding import (
    SETTING,
    PixelVideoEncoder,
    VideoEncoder,
    build_video_encoder,
)
from siirl.errors import ConfigError


def _videos(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (length, size, size, 3), dtype=np.uint8)
            for length, size in ((1, 32), (7, 64), (30, 48), (3, 8))]


def test_builtin_gives_one_float32_row_per_episode_whatever_its_length():
    encoder = build_video_encoder("builtin")
    assert isinstance(encoder, PixelVideoEncoder) and isinstance(encoder, VideoEncoder)
    embeddings = encoder.embed(_videos())
    assert embeddings.shape == (4, encoder.dim) and encoder.dim == 1920
    assert embeddings.dtype == np.float32 and np.isfinite(embeddings).all()
    assert encoder.embed([]).shape == (0, encoder.dim)


def test_builtin_is_deterministic_and_embeds_each_episode_on_its_own():
    videos = _videos()
    first = PixelVideoEncoder().embed(videos)
    assert np.array_equal(first, PixelVideoEncoder().embed(videos))
    assert np.array_equal(first[2:3], PixelVideoEncoder().embed(videos[2:3]))
    frames = list(videos[1])  # a list of frames is one video too
    assert np.array_equal(first[1:2], PixelVideoEncoder().embed([frames]))


def test_builtin_path_features_ignore_pauses():
    """Standing still changes only the mean frame: the path and the end stay put."""
    video = _videos()[2]
    paused = np.concatenate([video[:10], np.repeat(video[10:11], 20, axis=0), video[10:]])
    encoder = PixelVideoEncoder()
    a, b = encoder.embed([video, paused]).reshape(2, 5, -1)  # 3 quantiles, last, mean
    assert np.allclose(a[:4], b[:4]) and not np.allclose(a[4], b[4])


def test_builtin_refuses_what_is_not_a_video():
    encoder = PixelVideoEncoder()
    for bad in (np.zeros((4, 8, 8, 3), np.float32), np.zeros((8, 8, 3), np.uint8),
                np.zeros((0, 8, 8, 3), np.uint8)):
        with pytest.raises(ValueError, match="video 0 must be uint8"):
            encoder.embed([bad])


@pytest.mark.parametrize("path, reason", [
    ("~/models/vjepa/vitg-384.pt", "raw PyTorch checkpoint"),  # siiRL's default
    ("/no/such/vjepa2", "no such directory"),
])
def test_paths_we_cannot_load_name_the_setting_and_the_fix(path, reason):
    with pytest.raises(ConfigError) as caught:
        build_video_encoder(path)
    message = str(caught.value)
    assert SETTING in message and repr(path) in message and reason in message
    assert "=builtin" in message and "facebook/vjepa2-vitl-fpc64-256" in message


def test_a_directory_that_is_not_vjepa2_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="no readable config.json"):
        build_video_encoder(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    with pytest.raises(ConfigError, match="model_type 'qwen2', not 'vjepa2'"):
        build_video_encoder(str(tmp_path))


@pytest.fixture(scope="module")
def tiny_vjepa2(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "VJEPA2Model"):
        pytest.skip("this transformers has no V-JEPA 2")
    import torch

    config = transformers.VJEPA2Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2.0,
        crop_size=32, patch_size=8, frames_per_clip=4, tubelet_size=2,
        pred_hidden_size=16, pred_num_hidden_layers=1, pred_num_attention_heads=2,
        num_pooler_layers=1)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("vjepa2")
    transformers.VJEPA2Model(config).save_pretrained(path)
    return str(path)


def test_vjepa2_mean_pools_the_encoder_over_a_fixed_number_of_frames(tiny_vjepa2):
    from siirl.environment.embodied.video_embedding import VJEPA2VideoEncoder

    encoder = build_video_encoder(tiny_vjepa2, device="cpu", fp16=True)
    assert isinstance(encoder, VJEPA2VideoEncoder) and isinstance(encoder, VideoEncoder)
    assert encoder.dim == 32 and encoder.num_frames == 16
    assert str(encoder.dtype) == "torch.float32"  # fp16 only on CUDA
    videos = _videos()
    embeddings = encoder.embed(videos)
    assert embeddings.shape == (4, 32) and embeddings.dtype == np.float32
    assert np.isfinite(embeddings).all() and not np.allclose(embeddings[0], embeddings[1])
    again = encoder.embed(videos[::-1])[::-1]  # frozen, and each row on its own
    assert np.allclose(embeddings, again, atol=1e-5)
    assert encoder.embed([]).shape == (0, 32)


def test_vjepa2_frames_are_whole_tubelets(tiny_vjepa2):
    from siirl.environment.embodied.video_embedding import VJEPA2VideoEncoder

    encoder = VJEPA2VideoEncoder(tiny_vjepa2, num_frames=3, batch_size=2)
    assert encoder.num_frames == 4
    assert encoder.embed(_videos()).shape == (4, 32)
