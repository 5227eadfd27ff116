"""A tiny vision-language-action model (``builtin:tiny-vla``): camera image + proprio +
instruction in, action tokens out.

The prompt is ``instruction ids + [image_token_id] * g*g + [proprio_token_id]``; the
placeholders' embeddings are replaced by the image encoder's ``g*g`` tokens (in order) and
the projected proprio vector, then a small Llama backbone runs on the embeddings. Only the
last ``action_bins`` ids (the action tokens of ``ActionTokenizer``) get real logits; every
other id gets the finite constant ``-1e9``, so sampling can only pick actions and an
entropy over the whole vocabulary stays finite (``exp(-1e9)`` is exactly 0 in float32).

Registered with transformers' Auto classes at import, so ``AutoModelForCausalLM
.from_pretrained`` loads a saved one (``siirl.engine.models.loader`` imports this module).
"""

from __future__ import annotations

import inspect

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaModel,
    PretrainedConfig,
    PreTrainedModel,
)
from transformers.modeling_outputs import CausalLMOutputWithPast

try:  # transformers 5: init functions that leave loaded weights alone
    from transformers import initialization as init
except ImportError:  # transformers 4
    from torch.nn import init

__all__ = ["NON_ACTION_LOGIT", "TinyVLAConfig", "TinyVLAForActionPrediction"]

MODEL_TYPE = "siirl_tiny_vla"
NON_ACTION_LOGIT = -1e9
# transformers 5 renamed the KV cache argument and output field past_key_values -> cache
_CACHE = "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters \
    else "past_key_values"


class TinyVLAConfig(PretrainedConfig):
    """Sizes of the backbone (Llama's names), the image grid ``g`` (an image becomes
    ``g*g`` tokens), the proprio width, the action bins and the placeholder ids."""

    model_type = MODEL_TYPE

    def __init__(self, vocab_size: int = 512, hidden_size: int = 96,
                 intermediate_size: int = 256, num_hidden_layers: int = 3,
                 num_attention_heads: int = 3, head_dim: int = 32,
                 max_position_embeddings: int = 128, rms_norm_eps: float = 1e-5,
                 initializer_range: float = 0.02, image_grid: int = 4,
                 image_channels: tuple = (16, 32, 32), proprio_dim: int = 4,
                 action_bins: int = 256, image_token_id: int = 4, proprio_token_id: int = 5,
                 pad_token_id: int = 0, bos_token_id: int = 1, eos_token_id: int = 2,
                 tie_word_embeddings: bool = True, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.head_dim = head_dim
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range
        self.image_grid = image_grid
        self.image_channels = list(image_channels)
        self.proprio_dim = proprio_dim
        self.action_bins = action_bins
        self.image_token_id = image_token_id
        self.proprio_token_id = proprio_token_id
        kwargs.setdefault("use_cache", True)
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id,
                         eos_token_id=eos_token_id, tie_word_embeddings=tie_word_embeddings,
                         **kwargs)
        # transformers versions differ in whether the base __init__ keeps these
        self.pad_token_id, self.bos_token_id, self.eos_token_id = (
            pad_token_id, bos_token_id, eos_token_id)
        self.tie_word_embeddings = tie_word_embeddings

    @property
    def image_tokens(self) -> int:
        """Tokens per image: ``image_grid ** 2``."""
        return int(self.image_grid) ** 2

    def llama_config(self) -> LlamaConfig:
        """The backbone's config (not saved: it is derived from this one)."""
        cfg = LlamaConfig(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_attention_heads, head_dim=self.head_dim,
            max_position_embeddings=self.max_position_embeddings,
            rms_norm_eps=self.rms_norm_eps, initializer_range=self.initializer_range,
            pad_token_id=self.pad_token_id, bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id, tie_word_embeddings=self.tie_word_embeddings)
        impl = getattr(self, "_attn_implementation", None)
        if impl:
            cfg._attn_implementation = impl
        return cfg


class TinyImageEncoder(nn.Module):
    """Channels-last images ``[N, H, W, 3]`` (uint8 or float in [0, 1]) -> ``[N, g*g,
    hidden]``: stride-2 convolutions, an average pool to ``g x g`` and a linear map.

    Every convolution also sees two coordinate channels (CoordConv): a unit can then gate a
    coordinate by a colour, so after pooling a cell's features still say where in the cell
    a block is, which the policy needs to aim."""

    def __init__(self, channels: list, grid: int, hidden: int):
        super().__init__()
        convs, width = [], 3
        for out in channels:
            convs.append(nn.Conv2d(width + 2, out, 3, stride=2, padding=1))
            width = out
        self.convs = nn.ModuleList(convs)
        self.pool = nn.AdaptiveAvgPool2d(grid)
        self.proj = nn.Linear(width, hidden)
        # which cell a token came from (RoPE gives order, not 2D layout)
        self.position = nn.Parameter(torch.zeros(grid * grid, hidden))

    @staticmethod
    def _with_coords(x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        ys = torch.linspace(1.0, -1.0, h, dtype=x.dtype, device=x.device)  # y up
        xs = torch.linspace(-1.0, 1.0, w, dtype=x.dtype, device=x.device)
        grid = torch.stack(torch.meshgrid(xs, ys, indexing="xy"))  # [2, h, w]
        return torch.cat([x, grid.expand(n, 2, h, w)], dim=1)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        dtype = self.proj.weight.dtype
        x = pixels.to(dtype) / 255.0 if pixels.dtype == torch.uint8 else pixels.to(dtype)
        x = x.permute(0, 3, 1, 2) * 2.0 - 1.0  # centred: the convolutions learn much faster
        for conv in self.convs:
            x = nn.functional.gelu(conv(self._with_coords(x)))
        cells = self.pool(x).flatten(2).transpose(1, 2)  # [N, g*g, C], row-major cells
        return self.proj(cells) + self.position


class TinyVLAPreTrainedModel(PreTrainedModel):
    config_class = TinyVLAConfig
    config: TinyVLAConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["LlamaDecoderLayer"]  # FSDP shards these one by one
    _supports_sdpa = True

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Conv2d):  # a 0.02 normal would all but zero a conv stack
            init.kaiming_normal_(module.weight, nonlinearity="relu")
            init.zeros_(module.bias)
        elif isinstance(module, TinyImageEncoder):
            init.normal_(module.position, mean=0.0, std=self.config.initializer_range)
        else:
            super()._init_weights(module)


class TinyVLAForActionPrediction(TinyVLAPreTrainedModel):
    """Image encoder + proprio projector + ``LlamaModel`` backbone (``self.model``) + LM
    head restricted to the action tokens (see the module docstring)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: TinyVLAConfig):
        super().__init__(config)
        self.vision = TinyImageEncoder(config.image_channels, config.image_grid,
                                       config.hidden_size)
        self.proprio_proj = nn.Linear(config.proprio_dim, config.hidden_size)
        self.model = LlamaModel(config.llama_config())
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Module) -> None:
        self.lm_head = value

    # ---- inputs ---------------------------------------------------------------------

    def _proprio(self, proprio: torch.Tensor, rows: int) -> torch.Tensor:
        proprio = torch.as_tensor(proprio).to(self.proprio_proj.weight)
        if proprio.dim() != 2 or proprio.shape[0] != rows:
            raise ValueError(f"proprio must be [{rows}, P] (one vector per row), got "
                             f"{tuple(proprio.shape)}")
        width = self.config.proprio_dim
        if proprio.shape[1] < width:  # a robot with fewer state values: zeros for the rest
            proprio = nn.functional.pad(proprio, (0, width - proprio.shape[1]))
        return self.proprio_proj(proprio[:, :width])

    def embed(self, input_ids: torch.Tensor, pixel_values=None, proprio=None
              ) -> torch.Tensor:
        """Token embeddings with the image and proprio placeholders filled in."""
        cfg = self.config
        embeds = self.model.embed_tokens(input_ids)
        is_image = input_ids == cfg.image_token_id
        is_proprio = input_ids == cfg.proprio_token_id
        rows = input_ids.shape[0]
        if pixel_values is None:
            if is_image.any():
                raise ValueError("input_ids hold image placeholders but no pixel_values "
                                 "were given")
        else:
            pixel_values = torch.as_tensor(pixel_values)
            if pixel_values.dim() != 4 or pixel_values.shape[0] != rows \
                    or pixel_values.shape[-1] != 3:
                raise ValueError(f"pixel_values must be [{rows}, H, W, 3] (channels last, one "
                                 f"image per row), got {tuple(pixel_values.shape)}")
            counts = is_image.sum(dim=1)
            if (counts != cfg.image_tokens).any():
                raise ValueError(f"each row with an image needs exactly {cfg.image_tokens} "
                                 f"image placeholders (id {cfg.image_token_id}); rows hold "
                                 f"{counts.tolist()}")
            image = self.vision(pixel_values.to(embeds.device)).to(embeds.dtype)
            # row-major nonzero order: row by row, left to right, as the image tokens
            embeds = embeds.masked_scatter(is_image.unsqueeze(-1), image)
        if proprio is None:
            if is_proprio.any():
                raise ValueError("input_ids hold a proprio placeholder but no proprio was "
                                 "given")
        else:
            counts = is_proprio.sum(dim=1)
            if (counts != 1).any():
                raise ValueError(f"each row with proprio needs exactly 1 proprio placeholder "
                                 f"(id {cfg.proprio_token_id}); rows hold {counts.tolist()}")
            state = self._proprio(proprio, rows).to(embeds.dtype)
            embeds = embeds.masked_scatter(is_proprio.unsqueeze(-1), state)
        return embeds

    # ---- forward ----------------------------------------------------------------------

    def forward(self, input_ids: torch.Tensor, attention_mask=None, position_ids=None,
                pixel_values=None, proprio=None, past_key_values=None, use_cache=None,
                logits_to_keep=0, **kwargs) -> CausalLMOutputWithPast:
        """Logits ``[B, T or logits_to_keep, vocab]`` (non-action ids at ``-1e9``) and the
        KV cache. ``pixel_values [B, H, W, 3]`` and ``proprio [B, P]`` fill the
        placeholders of ``input_ids``; decode steps (new action tokens after a prefill
        with ``use_cache=True``) need neither, and ignore them when given."""
        cache = kwargs.pop("cache", None) if past_key_values is None else past_key_values
        kwargs.pop("cache", None)
        kwargs.pop("labels", None)  # losses are computed outside (action tokens only)
        if (cache is not None and cache.get_seq_length() > 0
                and not ((input_ids == self.config.image_token_id)
                         | (input_ids == self.config.proprio_token_id)).any()):
            pixel_values = proprio = None  # a decode step: the prefill consumed them
        embeds = self.embed(input_ids, pixel_values, proprio)
        kwargs[_CACHE] = cache
        out = self.model(inputs_embeds=embeds, attention_mask=attention_mask,
                         position_ids=position_ids, use_cache=use_cache, **kwargs)
        hidden = out.last_hidden_state
        if isinstance(logits_to_keep, int):
            hidden = hidden[:, -logits_to_keep:] if logits_to_keep else hidden
        else:
            hidden = hidden[:, logits_to_keep]
        first = self.config.vocab_size - self.config.action_bins
        # the head only for the action rows: the others are constant (and get no gradient)
        actions = nn.functional.linear(hidden, self.lm_head.weight[first:])
        # float16 cannot hold -1e9 (it would be -inf, and an entropy NaN): its lowest then
        fill = max(NON_ACTION_LOGIT, torch.finfo(actions.dtype).min)
        fixed = actions.new_full((*actions.shape[:-1], first), fill)
        logits = torch.cat([fixed, actions], dim=-1)
        return CausalLMOutputWithPast(logits=logits, **{_CACHE: getattr(out, _CACHE)})


def _register() -> None:
    # exist_ok: a second import (or a reload) re-registers instead of failing
    AutoConfig.register(MODEL_TYPE, TinyVLAConfig, exist_ok=True)
    AutoModelForCausalLM.register(TinyVLAConfig, TinyVLAForActionPrediction, exist_ok=True)


_register()
