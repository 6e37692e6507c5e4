"""exp3: does halving the tokenizer's vocabulary (4,096 -> 2,048) cost the tutorial model bits per byte?

Issue: #3 of the repository named by MARIN_ISSUE_REPO (the file name `exp3_<slug>.py` is the link).

Hypothesis: at the tutorial's fixed budget of training steps, the 2,048-entry tokenizer turns the same bytes
into about 15% more tokens, so the model sees fewer bytes of text and ends 0.05 bits per byte or more above
the 4,096-entry model on held-out python (with MARIN_TUTORIAL_SMALL=1 the tutorial's tokenizer has 1,024
entries, so there the comparison runs the other way). Bits per byte, unlike loss per token, compares models
with different tokenizers on the same footing.

Criterion: eval/tiny_moe-bpe2048:domains.python.bpb higher than eval/tiny_moe by at least 0.05
Tags: tokenizer, moe

(`higher` is the direction the hypothesis predicts: here that the change costs bits per byte.)

Only what depends on the tokenizer is new: ingest and decontaminate are the tutorial's steps (same hashes, so
`skip` once the tutorial ran); the tokenizer, the token caches, the model and its evaluation get new steps.
The tutorial's own evaluation is part of this experiment, so one run lines both models up.
"""

from __future__ import annotations

import dataclasses

from experiments.tutorials.tiny_moe import TINY_MOE, tiny_moe, tiny_moe_eval, tokenized, tokenizer
from marin import Step, executor_main, output_path_of
from marin.status.console import ConsoleProgress
from operators.evaluate import evaluate
from operators.tokenize import tokenize
from operators.train import train
from operators.train_tokenizer import train_tokenizer

VOCAB_SIZE = 2048

tokenizer_bpe2048 = Step(
    name="tokenizer/stdlib-bpe2048", fn=train_tokenizer,
    description="the tutorial's tokenizer, half the vocabulary",
    config=dataclasses.replace(tokenizer.config, vocab_size=VOCAB_SIZE),
)

tokenized_bpe2048 = Step(
    name="tokenized/stdlib-bpe2048", fn=tokenize,
    description="the tutorial's documents, 2,048-entry tokenizer",
    config=dataclasses.replace(tokenized.config, tokenizer_path=output_path_of(tokenizer_bpe2048)),
)

tiny_moe_bpe2048 = Step(
    name="train/tiny_moe-bpe2048", fn=train, description="the tutorial model on the 2,048-entry token caches",
    config=dataclasses.replace(tiny_moe.config, train_cache=output_path_of(tokenized_bpe2048, "train"),
                               model={**TINY_MOE, "vocab_size": VOCAB_SIZE}),
)

tiny_moe_bpe2048_eval = Step(
    name="eval/tiny_moe-bpe2048", fn=evaluate,
    description="per-domain bits per byte of the 2,048-vocab model",
    config=dataclasses.replace(tiny_moe_eval.config, checkpoint=output_path_of(tiny_moe_bpe2048),
                               tokenized=output_path_of(tokenized_bpe2048)),
)

if __name__ == "__main__":
    executor_main(steps=[tiny_moe_eval, tiny_moe_bpe2048_eval],
                  description="exp3: tokenizer vocabulary 2,048 vs the tutorial's 4,096, in bits per byte",
                  publishers=[ConsoleProgress()])
