"""Tiny transformers models and their eager loops, shared by the tests of ``learned()``."""

from __future__ import annotations

from typing import Any

import torch
import transformers


def gpt2() -> Any:
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128,
                                     n_positions=32, bos_token_id=0, eos_token_id=0,
                                     attn_implementation="eager")
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def bert() -> Any:
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=2,
                                     intermediate_size=128, vocab_size=128,
                                     max_position_embeddings=32, attn_implementation="eager")
    torch.manual_seed(0)
    return transformers.BertForMaskedLM(config)


def llama() -> Any:
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=2,
                                      num_key_value_heads=2, intermediate_size=128,
                                      vocab_size=128, max_position_embeddings=64,
                                      bos_token_id=0, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def batch(seed: int = 1) -> Any:
    return torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(seed))
