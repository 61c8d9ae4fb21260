"""Planning problems from real transformer architectures, for benchmarks and tests.

Each architecture is built from a ``transformers`` config with random weights (never downloaded),
then traced two ways: *inference* with ``torch.export`` (eval mode) and *training* with
:func:`~tensorarena.planning.torch_frontend.trace_training` (train mode: forward, loss and every
gradient in one ``make_fx`` graph). Two sizes:

``"tiny"``
    Test-sized: two layers, hidden size 64, short sequences, small images; seconds for all.
``"base"``
    The published base configurations (GPT-2 small, BERT-base, ViT-B/16, ResNet-50, ...) at
    sequence length 128 / 224×224 images and batch 4: what a runtime would plan. Tracing one takes
    seconds to a minute; weights are initialised on the CPU (hundreds of MB each).

``batch`` and, for the language models, ``seq`` (tokens per sequence) choose other input shapes
of the same model.

An architecture that fails to build or trace on the installed torch/transformers is skipped with a
:class:`ModelSkippedWarning` (or re-raised with ``errors="raise"``), so one broken model never
stops a benchmark.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from tensorarena._optional import require
from tensorarena.errors import InvalidArgumentError, ModelSkippedWarning, UnknownNameError
from tensorarena.planning.graph_problem import GraphProblem
from tensorarena.planning.torch_frontend import (
    problem_from_exported,
    problem_from_fx,
    trace_training,
)

__all__ = ["ARCHITECTURES", "VARIANTS", "ModelSkippedWarning", "build_model", "model_graph",
           "model_problem", "model_problems"]

Size = Literal["tiny", "base"]


@dataclass(frozen=True)
class _Inputs:
    """Example inputs: positional and keyword."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


# Each builder returns (model, inputs) for a size, batch and sequence length (None: the size's
# default; only builders in _SEQUENCE take one); transformers is imported inside.
_Builder = Callable[[Any, Any, Size, int, int | None], tuple[Any, _Inputs]]


def _tokens(torch: Any, batch: int, seq: int, vocab: int) -> Any:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (batch, seq), generator=generator)


def _length(seq: int | None, default: int, limit: int, name: str) -> int:
    """``seq`` or the default, refused past the model's position embeddings."""
    if seq is None:
        return default
    if seq > limit:
        raise InvalidArgumentError(f"seq={seq} is longer than {name}'s {limit} positions")
    return seq


def _images(torch: Any, batch: int, side: int, channels: int = 3) -> Any:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(batch, channels, side, side, generator=generator)


def _gpt2(
    torch: Any, tf: Any, size: Size, batch: int, seq: int | None
) -> tuple[Any, _Inputs]:
    if size == "tiny":
        config = tf.GPT2Config(
            n_layer=2,
            n_embd=64,
            n_head=4,
            vocab_size=128,
            n_positions=64,
            bos_token_id=0,
            eos_token_id=0,
        )
        default = 16
    else:  # GPT-2 small (124M)
        config = tf.GPT2Config()
        default = 128
    seq = _length(seq, default, config.n_positions, "GPT-2")
    config.use_cache = False
    return tf.GPT2LMHeadModel(config), _Inputs((_tokens(torch, batch, seq, config.vocab_size),), {})


def _bert(
    torch: Any, tf: Any, size: Size, batch: int, seq: int | None
) -> tuple[Any, _Inputs]:
    if size == "tiny":
        config = tf.BertConfig(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            intermediate_size=128,
            vocab_size=128,
            max_position_embeddings=64,
        )
        default = 16
    else:  # bert-base-uncased (110M)
        config = tf.BertConfig()
        default = 128
    seq = _length(seq, default, config.max_position_embeddings, "BERT")
    return tf.BertModel(config), _Inputs((_tokens(torch, batch, seq, config.vocab_size),), {})


def _distilbert(
    torch: Any, tf: Any, size: Size, batch: int, seq: int | None
) -> tuple[Any, _Inputs]:
    if size == "tiny":
        config = tf.DistilBertConfig(
            n_layers=2,
            dim=64,
            n_heads=4,
            hidden_dim=128,
            vocab_size=128,
            max_position_embeddings=64,
        )
        default = 16
    else:  # distilbert-base-uncased (66M)
        config = tf.DistilBertConfig()
        default = 128
    seq = _length(seq, default, config.max_position_embeddings, "DistilBERT")
    tokens = _tokens(torch, batch, seq, config.vocab_size)
    return tf.DistilBertModel(config), _Inputs((tokens,), {})


def _vit(
    torch: Any, tf: Any, size: Size, batch: int, seq: int | None
) -> tuple[Any, _Inputs]:
    if size == "tiny":
        config = tf.ViTConfig(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            intermediate_size=128,
            image_size=32,
            patch_size=8,
        )
    else:  # ViT-B/16 at 224×224 (86M)
        config = tf.ViTConfig()
    return tf.ViTModel(config), _Inputs((_images(torch, batch, config.image_size),), {})


def _resnet(
    torch: Any, tf: Any, size: Size, batch: int, seq: int | None
) -> tuple[Any, _Inputs]:
    if size == "tiny":
        config = tf.ResNetConfig(
            embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic"
        )
        side = 32
    else:  # ResNet-50 at 224×224 (25M)
        config = tf.ResNetConfig()
        side = 224
    return tf.ResNetModel(config), _Inputs((_images(torch, batch, side),), {})


def _convnext(
    torch: Any, tf: Any, size: Size, batch: int, seq: int | None
) -> tuple[Any, _Inputs]:
    if size == "tiny":
        config = tf.ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2)
        side = 32
    else:  # ConvNeXt-T at 224×224 (28M)
        config = tf.ConvNextConfig()
        side = 224
    return tf.ConvNextModel(config), _Inputs((_images(torch, batch, side),), {})


def _llama(
    torch: Any, tf: Any, size: Size, batch: int, seq: int | None
) -> tuple[Any, _Inputs]:
    if size == "tiny":
        config = tf.LlamaConfig(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            vocab_size=128,
            max_position_embeddings=64,
            bos_token_id=0,
            eos_token_id=0,
        )
        default = 16
    else:  # the SmolLM-135M shape: a real Llama with grouped-query attention
        config = tf.LlamaConfig(
            num_hidden_layers=30,
            hidden_size=576,
            num_attention_heads=9,
            num_key_value_heads=3,
            intermediate_size=1536,
            vocab_size=49152,
            max_position_embeddings=2048,
            tie_word_embeddings=True,
        )
        default = 128
    seq = _length(seq, default, config.max_position_embeddings, "Llama")
    config.use_cache = False
    tokens = _tokens(torch, batch, seq, config.vocab_size)
    return tf.LlamaForCausalLM(config), _Inputs((tokens,), {})


def _t5(
    torch: Any, tf: Any, size: Size, batch: int, seq: int | None
) -> tuple[Any, _Inputs]:
    if size == "tiny":
        config = tf.T5Config(
            num_layers=2,
            num_decoder_layers=2,
            d_model=64,
            d_kv=16,
            num_heads=4,
            d_ff=128,
            vocab_size=128,
        )
        default, target = 16, 8
    else:  # t5-small (60M)
        config = tf.T5Config()
        default, target = 128, 32
    if seq is not None:  # relative positions: any length; the decoder gets a quarter of it
        target = max(1, seq // 4)
    seq = seq or default
    config.use_cache = False
    tokens = _tokens(torch, batch, seq, config.vocab_size)
    decoder = _tokens(torch, batch, target, config.vocab_size)
    return tf.T5Model(config), _Inputs((tokens,), {"decoder_input_ids": decoder})


def _whisper_encoder(
    torch: Any, tf: Any, size: Size, batch: int, seq: int | None
) -> tuple[Any, _Inputs]:
    # whisper-base's encoder (20M), 30 s of audio
    base = {"d_model": 512, "layers": 6, "heads": 8, "ffn": 2048}
    return _whisper(torch, tf, size, batch, base)


def _whisper_tiny_encoder(
    torch: Any, tf: Any, size: Size, batch: int, seq: int | None
) -> tuple[Any, _Inputs]:
    # whisper-tiny's encoder (8M), 30 s of audio
    base = {"d_model": 384, "layers": 4, "heads": 6, "ffn": 1536}
    return _whisper(torch, tf, size, batch, base)


def _whisper(torch: Any, tf: Any, size: Size, batch: int,
             base: dict[str, int]) -> tuple[Any, _Inputs]:
    if size == "tiny":
        config = tf.WhisperConfig(
            encoder_layers=2,
            decoder_layers=2,
            d_model=64,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            num_mel_bins=16,
            max_source_positions=32,
            vocab_size=128,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=1,
        )
    else:
        config = tf.WhisperConfig(
            d_model=base["d_model"],
            encoder_layers=base["layers"],
            decoder_layers=base["layers"],
            encoder_attention_heads=base["heads"],
            decoder_attention_heads=base["heads"],
            encoder_ffn_dim=base["ffn"],
            decoder_ffn_dim=base["ffn"],
        )
    encoder = tf.WhisperModel(config).get_encoder()
    frames = 2 * config.max_source_positions  # the encoder insists on exactly this many
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(batch, config.num_mel_bins, frames, generator=generator)
    return encoder, _Inputs((features,), {})


_BUILDERS: dict[str, _Builder] = {
    "gpt2": _gpt2,
    "bert": _bert,
    "distilbert": _distilbert,
    "vit": _vit,
    "resnet": _resnet,
    "convnext": _convnext,
    "llama": _llama,
    "t5": _t5,
    "whisper-encoder": _whisper_encoder,
}

#: The architectures :func:`model_problems` knows, in the order it yields them.
ARCHITECTURES: tuple[str, ...] = tuple(_BUILDERS)

#: Other published sizes of an architecture above, built by name like it (``tiny`` is the
#: architecture's tiny config) but yielded by :func:`model_problems` only when named.
VARIANTS: dict[str, str] = {"whisper-tiny-encoder": "whisper-encoder"}
_BUILDERS["whisper-tiny-encoder"] = _whisper_tiny_encoder

#: Models that take token sequences: ``seq`` chooses their length.
_SEQUENCE: frozenset[str] = frozenset({"gpt2", "bert", "distilbert", "llama", "t5"})

_DEFAULT_BATCH: dict[Size, int] = {"tiny": 2, "base": 4}


def _check(
    names: Iterable[str], size: object, batch: object, training: object = False,
    seq: object = None,
) -> None:
    """Refuse bad arguments before torch is imported or anything is built.

    A model *size* is a name, not a byte count: a bad one is an
    :class:`~tensorarena.errors.InvalidArgumentError`, not an ``InvalidSizeError``.
    """
    for name in names:
        if not isinstance(name, str) or name not in _BUILDERS:
            raise UnknownNameError(
                f"unknown architecture {name!r}; known: {', '.join(_BUILDERS)}",
                kind="architecture", name=name, known=tuple(_BUILDERS),
            )
        if seq is not None and name not in _SEQUENCE:
            raise InvalidArgumentError(
                f"{name} takes no token sequence, so no seq (those that do: "
                f"{', '.join(sorted(_SEQUENCE))})"
            )
    if not isinstance(size, str) or size not in _DEFAULT_BATCH:
        raise InvalidArgumentError(
            f"size must be one of {', '.join(map(repr, _DEFAULT_BATCH))}, got {size!r}"
        )
    if batch is not None and (type(batch) is not int or batch <= 0):
        raise InvalidArgumentError(f"batch must be a positive int or None, got {batch!r}")
    if seq is not None and (type(seq) is not int or seq <= 0):
        raise InvalidArgumentError(f"seq must be a positive int or None, got {seq!r}")
    if not isinstance(training, bool):
        raise InvalidArgumentError(f"training must be a bool, got {training!r}")


def build_model(
    name: str, *, size: Size = "tiny", batch: int | None = None, seq: int | None = None
) -> tuple[Any, Any]:
    """``(model, (args, kwargs))`` for one architecture (or one of :data:`VARIANTS`): random
    weights, example inputs of ``batch`` items of ``seq`` tokens (None: the size's default).

    An unknown ``name`` raises :class:`~tensorarena.errors.UnknownNameError` naming the
    known ones; a bad ``size``, ``batch`` or ``seq`` (or a ``seq`` for a model of images or
    audio, or past its positions), :class:`~tensorarena.errors.InvalidArgumentError`.
    """
    _check((name,), size, batch, seq=seq)
    torch = require("torch", extra="models", feature="real-model planning problems")
    tf = require("transformers", extra="models", feature="real-model planning problems")
    torch.manual_seed(0)  # the same random weights every time
    model, inputs = _BUILDERS[name](torch, tf, size, batch or _DEFAULT_BATCH[size], seq)
    return model, (inputs.args, inputs.kwargs)


def model_graph(
    name: str, *, size: Size = "tiny", training: bool = False, batch: int | None = None
) -> Any:
    """The traced graph of one architecture: a ``torch.export`` ``ExportedProgram`` for
    inference, a ``make_fx`` ``GraphModule`` of forward, loss and gradients for training (what
    :func:`model_problem` plans, and what :func:`~tensorarena.planning.reorder` reorders)."""
    _check((name,), size, batch, training)
    torch = require("torch", extra="models", feature="real-model planning problems")
    model, (args, kwargs) = build_model(name, size=size, batch=batch)
    if training:
        model.train()
        return trace_training(model, args, kwargs)
    model.eval()
    with torch.no_grad():
        return torch.export.export(model, args, kwargs, strict=False)


def model_problem(
    name: str, *, size: Size = "tiny", training: bool = False, batch: int | None = None
) -> GraphProblem:
    """The planning problem of one architecture (errors propagate; see :func:`model_problems`)."""
    graph = model_graph(name, size=size, training=training, batch=batch)
    label = f"{name}-{size}-{'train' if training else 'infer'}"
    if training:
        return problem_from_fx(graph, name=label)
    return problem_from_exported(graph, name=label)


def model_problems(
    *,
    size: Size = "tiny",
    training: bool = False,
    names: Iterable[str] | None = None,
    batch: int | None = None,
    errors: Literal["warn", "raise"] = "warn",
) -> Iterator[tuple[str, GraphProblem]]:
    """Yield ``(name, problem)`` for every architecture (or those in ``names``).

    Inference graphs come from ``torch.export``, training graphs (``training=True``) from
    ``make_fx`` over forward, loss and gradients. An architecture that fails is skipped with a
    :class:`ModelSkippedWarning` naming it and the error, unless ``errors="raise"``.
    """
    # Checked here, at the call, not at the first next() of a generator.
    if isinstance(names, str):  # one name would otherwise be read letter by letter
        raise InvalidArgumentError(f"names must be a list of names, got the string {names!r}")
    try:
        chosen = ARCHITECTURES if names is None else tuple(names)
    except TypeError:
        raise InvalidArgumentError(
            f"names must be a list of names, got {type(names).__name__}"
        ) from None
    _check(chosen, size, batch, training)
    if errors not in ("warn", "raise"):
        raise InvalidArgumentError(f"errors must be 'warn' or 'raise', got {errors!r}")
    require("torch", extra="models", feature="real-model planning problems")
    require("transformers", extra="models", feature="real-model planning problems")
    return _problems(chosen, size=size, training=training, batch=batch, errors=errors)


def _problems(
    names: tuple[str, ...], *, size: Size, training: bool, batch: int | None, errors: str
) -> Iterator[tuple[str, GraphProblem]]:
    for name in names:
        try:
            problem = model_problem(name, size=size, training=training, batch=batch)
        except Exception as exc:
            if errors == "raise":
                raise
            mode = "training" if training else "inference"
            warnings.warn(
                f"skipped {name} ({size}, {mode}): {type(exc).__name__}: {exc}",
                ModelSkippedWarning,
                stacklevel=3,
            )
            continue
        yield name, problem
