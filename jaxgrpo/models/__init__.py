"""Flax policies (Llama, Qwen2, Qwen3, Gemma 3), checkpoint loading, partitioning and log-prob kernels."""

from jaxgrpo.models.config import SUPPORTED_ARCHITECTURES, DecoderConfig, RopeConfig, UnsupportedConfigError
from jaxgrpo.models.decoder import Decoder, KVCache
from jaxgrpo.models.loading import decoder_from_params, load, load_config
from jaxgrpo.models.registry import register, registered_names
from jaxgrpo.models.weights import WeightFileError
