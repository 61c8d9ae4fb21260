"""The model configurations ``tensorarena bench exec`` measures, at each size.

A configuration is one architecture of :mod:`tensorarena.planning.models` at one input shape, run
for inference or as a training step. ``base`` holds the published full-size configurations at
shapes a user runs: GPT-2 124M at 1x128 and 2x512 tokens, BERT-base at 2x256, a 135M Llama
(SmolLM's shape) at 1x256, T5-small, ViT-B/16 and a ResNet-50 layout at two 224x224 images,
Whisper-tiny's encoder on 30 s of audio, and GPT-2 and BERT training steps at 2x128. ``tiny``
holds the same list at the test-sized configs and their default shapes (seconds each).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = ["SUITES", "Config", "suite"]

Size = Literal["tiny", "base"]
Mode = Literal["all", "inference", "training"]


@dataclass(frozen=True)
class Config:
    """One model at one input shape: ``batch`` items of ``seq`` tokens (None: the size's
    default; images and audio have a fixed shape), inference or a training step."""

    model: str
    size: Size = "tiny"
    batch: int | None = None
    seq: int | None = None
    training: bool = False

    @property
    def label(self) -> str:
        """A name for tables and JSON keys: ``gpt2-1x128``, ``bert-train-2x128``, ``resnet-2``."""
        shape = "x".join(str(d) for d in (self.batch, self.seq) if d is not None)
        parts = [self.model, "train" if self.training else "", shape]
        return "-".join(part for part in parts if part)

    def as_dict(self) -> dict[str, Any]:
        """Plain data for JSON and for the measuring process's job."""
        return asdict(self)


def _base() -> tuple[Config, ...]:
    return (
        Config("gpt2", "base", 1, 128),
        Config("gpt2", "base", 2, 512),
        Config("bert", "base", 2, 256),
        Config("llama", "base", 1, 256),
        Config("t5", "base", 2, 128),
        Config("vit", "base", 2),
        Config("resnet", "base", 2),
        Config("whisper-tiny-encoder", "base", 1),
        Config("gpt2", "base", 2, 128, training=True),
        Config("bert", "base", 2, 128, training=True),
    )


def _tiny() -> tuple[Config, ...]:
    names = ("gpt2", "bert", "llama", "t5", "vit", "resnet", "whisper-tiny-encoder")
    return (*(Config(name) for name in names),
            Config("gpt2", training=True), Config("bert", training=True))


SUITES: dict[Size, tuple[Config, ...]] = {"tiny": _tiny(), "base": _base()}


def suite(size: Size, *, models: list[str] | None = None, mode: Mode = "all") -> list[Config]:
    """The configurations of ``size``, only of ``models`` (architecture names) if given and
    only inference or training ones if ``mode`` says so. An architecture the suite lacks is
    measured at its default shape."""
    configs = list(SUITES[size])
    if models:
        known = {config.model for config in configs}
        configs = [c for c in configs if c.model in models]
        configs += [Config(name, size) for name in models if name not in known]
        configs += [Config(name, size, training=True) for name in models
                    if name not in known]
    if mode != "all":
        configs = [c for c in configs if c.training == (mode == "training")]
    return configs
