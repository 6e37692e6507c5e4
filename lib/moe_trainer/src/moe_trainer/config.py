"""The model configuration: one frozen, draccus-parsable dataclass describing a decoder-only MoE transformer.

Every architectural switch of the trainer lives here, each with its "off" setting reducing to the plain
Qwen3-MoE architecture (full RoPE, no NoPE layers, no latent, no shared experts, softmax router), which is
what `hf.py` can export. Validation happens in `__post_init__` and names the field and the fix.

Layer schedule (0-based layer index `i`):
- MoE layers: `i >= first_k_dense` and `(i - first_k_dense + 1) % moe_every == 0` (so `moe_every=2` makes
  layers 1, 3, 5... MoE, like Hugging Face's `decoder_sparse_step`); every other layer has a dense SwiGLU MLP.
- Global layers (when `nope_every` is set): `(i + 1) % nope_every == 0`, plus the last layer always. They use
  no positional encoding (NoPE) and full causal attention; the other ("local") layers use RoPE and, when
  `sliding_window` is set, a sliding window. With `nope_every=None` every layer is local.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

ScoreFn = Literal["softmax", "sigmoid"]
Balance = Literal["aux_loss", "aux_free"]
DispatchName = Literal["dense", "ragged", "ep_allgather", "ep_alltoall"]
ComputeDtype = Literal["float32", "bfloat16", "auto"]

GroupedMatmul = Literal["auto", "ragged_dot", "blocked", "slots"]
AttentionImpl = Literal["auto", "reference", "xla", "cudnn"]
RematPolicy = Literal["full", "dots", "dots_no_batch"]

ATTENTION_IMPLS: tuple[str, ...] = ("auto", "reference", "xla", "cudnn")

DISPATCH_BACKENDS: tuple[str, ...] = ("dense", "ragged", "ep_allgather", "ep_alltoall")


def _fail(field: str, value: object, fix: str) -> None:
    raise ValueError(f"ModelConfig.{field}={value!r} is invalid: {fix}")


@dataclass(frozen=True)
class ModelConfig:
    """Shape and features of a decoder-only Mixture-of-Experts transformer."""

    # ---- trunk -------------------------------------------------------------------------------------------
    vocab_size: int = 256
    """Vocabulary size (rows of the embedding table, columns of the output head)."""
    d_model: int = 64
    """Residual stream width."""
    n_layers: int = 2
    """Number of transformer blocks."""
    n_heads: int = 4
    """Query heads per attention layer."""
    n_kv_heads: int = 2
    """Key/value heads (grouped-query attention); must divide n_heads."""
    head_dim: int = 16
    """Width of one attention head (need not equal d_model / n_heads)."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""
    rope_fraction: float = 1.0
    """Fraction of each head's dims that RoPE rotates (0.5 = "half-RoPE"); rotated dims come first."""
    qk_norm: bool = True
    """RMS-normalise queries and keys per head (learned gain on head_dim), as Qwen3 does."""
    nope_every: int | None = None
    """Every k-th layer (and always the last) is a global NoPE layer: no RoPE, no sliding window. None:
    off."""
    sliding_window: int | None = None
    """Attention window (in tokens, the query included) of local layers. None: full causal attention."""
    d_ff: int = 128
    """Hidden width of the dense SwiGLU MLP used by non-MoE layers."""
    tie_embeddings: bool = False
    """Use the transposed embedding table as the output head."""
    norm_eps: float = 1e-6
    """Epsilon of every RMSNorm."""
    init_std: float = 0.02
    """Standard deviation of the normal initialiser of every matrix (norm gains start at 1, biases at 0)."""
    attention_impl: AttentionImpl = "auto"
    """Attention core: "xla" / "cudnn" (jax.nn.dot_product_attention; cudnn needs a GPU and bf16),
    "reference" (the einsum core tuned for XLA:CPU) or "auto" (cudnn on GPU in bf16, reference on CPU, xla
    elsewhere; attention.py)."""
    max_seq_len: int = 4096
    """Longest sequence the model is meant for (recorded in exports; RoPE itself has no table)."""

    # ---- mixture of experts -----------------------------------------------------------------------------
    n_experts: int = 0
    """Routed experts per MoE layer; 0 makes every layer dense."""
    moe_every: int = 1
    """Make every n-th layer (after the first_k_dense) a MoE layer."""
    first_k_dense: int = 0
    """The first k layers always use the dense MLP."""
    top_k: int = 2
    """Experts each token is routed to."""
    expert_d_ff: int = 64
    """Hidden width of one routed SwiGLU expert."""
    score_fn: ScoreFn = "softmax"
    """Router score function: "softmax" over experts or per-expert "sigmoid"."""
    renormalize: bool = True
    """Rescale the top-k combine weights of each token to sum to 1."""
    n_shared_experts: int = 0
    """Always-on SwiGLU experts added to the routed output (stored fused as one MLP of n*shared_d_ff)."""
    shared_d_ff: int | None = None
    """Hidden width of one shared expert; None means expert_d_ff."""
    latent_dim: int | None = None
    """Project routed tokens d_model -> latent_dim (then RMSNorm) before dispatch and back after. None:
    off."""
    capacity_factor: float | None = None
    """Per-expert capacity = ceil(cf * tokens_per_group * top_k / n_experts); extra assignments are dropped.
    None: dropless."""
    balance: Balance = "aux_loss"
    """Load balancing: "aux_loss" (Switch-style loss) or "aux_free" (DeepSeek-V3 per-expert selection bias,
    updated by the trainer with `update_router_bias`; the aux loss is then logged but not added)."""
    aux_loss_coef: float = 1e-2
    """Weight of the load-balancing loss in `MoEStats.weighted_loss` (only with balance="aux_loss")."""
    router_z_loss_coef: float = 1e-3
    """Weight of the router z-loss mean(logsumexp(router_logits)^2) in `MoEStats.weighted_loss`."""
    logit_z_loss_coef: float = 0.0
    """Weight of the output logit z-loss mean(logsumexp(logits)^2); the trainer applies it."""
    dispatch: DispatchName = "ragged"
    """Default dispatch backend: "dense" (oracle), "ragged", "ep_allgather", "ep_alltoall" (these two need a
    mesh with an "expert" axis)."""
    grouped_matmul: GroupedMatmul = "auto"
    """Grouped matmul of "ragged"/"ep_allgather": "ragged_dot" (jax.lax.ragged_dot), "blocked" (padded blocks
    + batched matmul), "slots" (per-expert slot tensors + batched GEMMs, the fastest on XLA:CPU) or "auto"
    (slots on CPU, ragged_dot elsewhere)."""

    # ---- numerics and memory -----------------------------------------------------------------------------
    compute_dtype: ComputeDtype = "float32"
    """Matmul dtype; the router, norms, softmaxes and logits always run in float32. "auto": bfloat16 on an
    accelerator (GPU/TPU), float32 on CPU (`resolved_compute_dtype`)."""
    loss_chunk_tokens: int | None = None
    """Tokens per chunk of the training loss's fused output head + cross-entropy (chunked_loss.py: the full
    [tokens, vocab] logits are never materialised and their gradient is formed in the forward pass). None:
    automatic (512 on CPU, 8192 elsewhere); 0: off (plain logits, then cross-entropy). Evaluation and
    `Model.logits` always use the plain head."""
    loss_vocab_block: int | None = None
    """Vocabulary columns per block of the fused loss (chunked_loss.py blocks the head over the vocabulary
    too, with an online logsumexp: no [chunk, vocab] row of logits exists). None: automatic (loss.py, chosen
    from measurements); 0: off (whole rows per chunk)."""
    remat: bool = False
    """Recompute each block's activations during the backward pass (jax.checkpoint): less memory, ~1/3 more
    compute (not counted in the model FLOPs)."""
    remat_policy: RematPolicy = "full"
    """What a rematerialised block keeps for the backward pass (with remat on): "full" nothing (recompute
    the block), "dots" every matmul output, "dots_no_batch" matmul outputs without batch dims
    (layer_stack.py)."""
    scan_layers: bool = True
    """Run runs of identical layers with jax.lax.scan over weights stacked inside the step (compile time flat
    in depth; the stored tree stays per layer); False: an unrolled Python loop (layer_stack.py)."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff",
                     "max_seq_len", "moe_every", "top_k", "expert_d_ff"):
            if getattr(self, name) < 1:
                _fail(name, getattr(self, name), "must be a positive integer")
        if self.n_heads % self.n_kv_heads:
            _fail("n_kv_heads", self.n_kv_heads, f"must divide n_heads={self.n_heads}")
        if not 0.0 <= self.rope_fraction <= 1.0:
            _fail("rope_fraction", self.rope_fraction, "must lie in [0, 1]")
        if self.rope_dims % 2:
            _fail("rope_fraction", self.rope_fraction,
                  f"rope_fraction * head_dim = {self.rope_fraction * self.head_dim} must be an even integer")
        if self.nope_every is not None and self.nope_every < 1:
            _fail("nope_every", self.nope_every, "use a positive layer period, or None to turn NoPE off")
        if self.sliding_window is not None and self.sliding_window < 1:
            _fail("sliding_window", self.sliding_window, "use a positive window, or None for full attention")
        if self.n_experts < 0:
            _fail("n_experts", self.n_experts, "must be >= 0 (0 = dense model)")
        if self.first_k_dense < 0:
            _fail("first_k_dense", self.first_k_dense, "must be >= 0")
        if self.n_experts and self.top_k > self.n_experts:
            _fail("top_k", self.top_k, f"cannot exceed n_experts={self.n_experts}")
        if self.n_shared_experts < 0:
            _fail("n_shared_experts", self.n_shared_experts, "must be >= 0")
        if self.shared_d_ff is not None and self.shared_d_ff < 1:
            _fail("shared_d_ff", self.shared_d_ff, "must be positive, or None to reuse expert_d_ff")
        if self.latent_dim is not None and self.latent_dim < 1:
            _fail("latent_dim", self.latent_dim,
                  "must be positive, or None to turn the latent projection off")
        if self.capacity_factor is not None and self.capacity_factor <= 0:
            _fail("capacity_factor", self.capacity_factor, "must be > 0, or None for dropless routing")
        if self.score_fn not in ("softmax", "sigmoid"):
            _fail("score_fn", self.score_fn, 'choose "softmax" or "sigmoid"')
        if self.balance not in ("aux_loss", "aux_free"):
            _fail("balance", self.balance, 'choose "aux_loss" or "aux_free"')
        if self.dispatch not in DISPATCH_BACKENDS:
            _fail("dispatch", self.dispatch, f"choose one of {list(DISPATCH_BACKENDS)}")
        if self.grouped_matmul not in ("auto", "ragged_dot", "blocked", "slots"):
            _fail("grouped_matmul", self.grouped_matmul, 'choose "auto", "ragged_dot", "blocked" or "slots"')
        if self.attention_impl not in ATTENTION_IMPLS:
            _fail("attention_impl", self.attention_impl, f"choose one of {list(ATTENTION_IMPLS)}")
        if self.loss_vocab_block is not None and self.loss_vocab_block < 0:
            _fail("loss_vocab_block", self.loss_vocab_block,
                  "use a positive block width, 0 (off) or None (auto)")
        if self.remat_policy not in ("full", "dots", "dots_no_batch"):
            _fail("remat_policy", self.remat_policy, 'choose "full", "dots" or "dots_no_batch"')
        if self.compute_dtype not in ("float32", "bfloat16", "auto"):
            _fail("compute_dtype", self.compute_dtype, 'choose "float32", "bfloat16" or "auto"')
        if self.loss_chunk_tokens is not None and self.loss_chunk_tokens < 0:
            _fail(
                "loss_chunk_tokens",
                self.loss_chunk_tokens,
                "use a positive chunk size, 0 (off) or None (auto)",
            )
        for name in ("aux_loss_coef", "router_z_loss_coef", "logit_z_loss_coef", "norm_eps", "init_std"):
            if getattr(self, name) < 0:
                _fail(name, getattr(self, name), "must be >= 0")

    # ---- derived shape helpers (pure functions of the fields) -------------------------------------------
    @property
    def rope_dims(self) -> int:
        """Number of leading head dims rotated by RoPE on local layers."""
        return int(round(self.rope_fraction * self.head_dim))

    @property
    def moe_dim(self) -> int:
        """Width the routed experts read and write: latent_dim when the latent projection is on."""
        return self.latent_dim if self.latent_dim is not None else self.d_model

    @property
    def shared_width(self) -> int:
        """Hidden width of the fused shared-expert MLP (0 when there are no shared experts)."""
        return self.n_shared_experts * (self.shared_d_ff or self.expert_d_ff)

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer i routes through experts (see the module docstring for the schedule)."""
        after_dense = i - self.first_k_dense + 1
        return self.n_experts > 0 and i >= self.first_k_dense and after_dense % self.moe_every == 0

    def is_global_layer(self, i: int) -> bool:
        """Whether layer i is a global NoPE layer (no RoPE, no sliding window)."""
        if self.nope_every is None:
            return False
        return (i + 1) % self.nope_every == 0 or i == self.n_layers - 1

    @property
    def moe_layers(self) -> tuple[int, ...]:
        """Indices of the MoE layers, in order (row i of `MoEStats.expert_load` is moe_layers[i])."""
        return tuple(i for i in range(self.n_layers) if self.is_moe_layer(i))

    def capacity(self, tokens_per_group: int, capacity_factor: float | None) -> int:
        """Slots per expert per token group; dropless (None) means every token of the group fits."""
        if capacity_factor is None:
            return tokens_per_group
        c = math.ceil(capacity_factor * tokens_per_group * self.top_k / self.n_experts)
        return max(1, min(tokens_per_group, c))

    def resolved_compute_dtype(self, platform: str | None = None) -> str:
        """compute_dtype with "auto" resolved for `platform` (default: JAX's default backend)."""
        if self.compute_dtype != "auto":
            return self.compute_dtype
        if platform is None:
            import jax  # deferred: the config module stays importable without initialising a backend

            platform = jax.default_backend()
        return "float32" if platform == "cpu" else "bfloat16"

    def loss_chunk(self) -> int:
        """The effective `loss_chunk_tokens` on the default JAX backend (0 = plain, unfused loss)."""
        if self.loss_chunk_tokens is not None:
            return self.loss_chunk_tokens
        import jax  # deferred: the config module stays importable without initialising a backend

        return 512 if jax.default_backend() == "cpu" else 8192

    def replace(self, **changes: object) -> ModelConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]
