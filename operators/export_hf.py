"""export_hf: a training checkpoint plus its tokenizer -> a Hugging Face model directory transformers loads.

Writes under ``output_path`` what ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` read (and therefore lm-evaluation-harness's ``hf`` model):

    config.json, model.safetensors     Qwen3-MoE, float32 (moe_trainer.hf.save_hf; features it cannot
                                       express are refused with the list of fields)
    tokenizer.json                     the byte-level BPE exactly as train_tokenizer wrote it
    tokenizer_config.json              PreTrainedTokenizerFast, the EOS token, no BOS, model_max_length

No BOS token is declared: the trainer's documents start without one (EOS is only placed after each
document), so a scorer conditioning on a BOS the model never saw would not measure the trained model.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import fsspec

from moe_trainer.checkpoint import load_checkpoint
from moe_trainer.hf import save_hf
from moe_trainer.jsonio import write_bytes_atomic, write_json_atomic


@dataclasses.dataclass(frozen=True)
class ExportHfConfig:
    output_path: str
    """The Hugging Face directory to write (local: transformers reads local directories)."""
    checkpoint: str
    """A train step's output path (newest complete checkpoint), its checkpoints/ directory or one step's."""
    tokenizer: str
    """A train_tokenizer step's output path (tokenizer.json + tokenizer_info.json)."""


def export_hf(config: ExportHfConfig) -> dict[str, Any]:
    """Write the model and tokenizer files; return what was written."""
    model = load_checkpoint(config.checkpoint)
    out = config.output_path.rstrip("/")
    save_hf(model, out)
    root = config.tokenizer.rstrip("/")
    with fsspec.open(f"{root}/tokenizer.json", "rb") as f:
        write_bytes_atomic(f"{out}/tokenizer.json", f.read())
    with fsspec.open(f"{root}/tokenizer_info.json", "r") as f:
        info = json.load(f)
    if info["vocab_size"] > model.config.vocab_size:
        raise ValueError(f"export_hf: tokenizer {root} has {info['vocab_size']} tokens but the model "
                         f"{config.checkpoint} only {model.config.vocab_size}: they do not belong together")
    tok_cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": info["eos_token"],
               "bos_token": None, "pad_token": info["eos_token"], "add_bos_token": False,
               "model_max_length": model.config.max_seq_len, "clean_up_tokenization_spaces": False}
    write_json_atomic(f"{out}/tokenizer_config.json", tok_cfg)
    return {"output_path": out, "files": ["config.json", "model.safetensors", "tokenizer.json",
                                          "tokenizer_config.json"], "max_seq_len": model.config.max_seq_len}


__all__ = ["ExportHfConfig", "export_hf"]
