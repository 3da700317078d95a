"""A byte-level GPT (decoder-only transformer) and its LightningModule.

Shapes use ``B`` = micro batch size (sequences per rank), ``T`` = sequence length in tokens
(bytes, ``<= block_size``), ``C`` = ``d_model``, ``V`` = 256 (byte vocabulary). Losses are
cross entropy in nats per token, which for bytes is nats per byte (divide by ln 2 for bits per
byte). A model that knows nothing scores ln 256 = 5.545 nats.

The architecture is GPT-2's: learned positions, pre-LayerNorm :class:`Block` s (the unit that
FSDP auto-wrapping targets), causal ``scaled_dot_product_attention``, a 4x GELU MLP, a final
LayerNorm and an output projection tied to the input embedding. Initialisation: normal with
std 0.02, residual output projections scaled by ``1 / sqrt(2 * n_layer)``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torch import nn

from jobgen.specs.training import TrainingSpec
from jobgen.train.speed import LogStepLoss, host_scalar

VOCAB_SIZE = 256
"""Byte-level vocabulary size."""


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: ``(B, T, C) -> (B, T, C)``."""

    def __init__(self, d_model: int, n_head: int, dropout: float):
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"d_model={d_model} is not divisible by n_head={n_head}")
        self.n_head = n_head
        self.dropout = dropout
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attend over earlier positions only; ``x`` has shape ``(B, T, C)``."""
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        # (B, T, C) -> (B, n_head, T, head_dim)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """Position-wise feed-forward network ``C -> 4C -> C`` with GELU: ``(B, T, C) -> (B, T, C)``."""

    def __init__(self, d_model: int, dropout: float):
        super().__init__()
        self.c_fc = nn.Linear(d_model, 4 * d_model)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the MLP to ``x`` of shape ``(B, T, C)``."""
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """One pre-LayerNorm transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``.

    ``(B, T, C) -> (B, T, C)``; ``12 C^2 + 13 C`` parameters. The unit FSDP wraps.
    """

    def __init__(self, d_model: int, n_head: int, dropout: float):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, dropout)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block to ``x`` of shape ``(B, T, C)``."""
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Byte-level GPT: token ids ``(B, T)`` -> next-byte logits ``(B, T, 256)``.

    Args:
        n_layer: number of transformer blocks.
        n_head: attention heads per block (must divide ``d_model``).
        d_model: residual width in features.
        block_size: maximum context length in tokens (bytes).
        dropout: dropout probability after attention/MLP projections and on the embeddings.
    """

    def __init__(self, n_layer: int, n_head: int, d_model: int, block_size: int, dropout: float = 0.0):
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(VOCAB_SIZE, d_model)
        self.wpe = nn.Embedding(block_size, d_model)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(d_model, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, VOCAB_SIZE, bias=False)
        self.lm_head.weight = self.wte.weight  # tied input/output embedding
        self.apply(self._init_weights)
        residual_std = 0.02 / math.sqrt(2 * n_layer)
        for block in self.h:
            nn.init.normal_(block.attn.c_proj.weight, mean=0.0, std=residual_std)
            nn.init.normal_(block.mlp.c_proj.weight, mean=0.0, std=residual_std)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits of the next byte.

        Args:
            idx: int64 token ids (bytes), shape ``(B, T)`` with ``T <= block_size``.

        Returns:
            logits, shape ``(B, T, 256)``.
        """
        t = idx.shape[1]
        if t > self.block_size:
            raise ValueError(f"sequence length {t} exceeds block_size {self.block_size}")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def lr_factor(step: int, warmup_steps: int, max_steps: int, min_ratio: float = 0.1,
              schedule: str = "cosine") -> float:
    """Learning-rate multiplier at optimizer step ``step`` (0-based).

    Linear warmup over ``warmup_steps`` (``(step + 1) / warmup_steps``), then for ``cosine``
    a cosine decay from 1 to ``min_ratio`` at ``max_steps`` (``min_ratio`` afterwards), for
    ``constant`` 1 (spec ``trainer.lr_schedule``).
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if step >= max_steps:
        return min_ratio
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


#: Checkpoint key of the learning-rate schedule a run started with (:meth:`LitGPT.on_save_checkpoint`).
SCHEDULE_KEY = "jobgen_lr_schedule"


def resume_schedule_note(kept: tuple[int, int | None], spec: tuple[int, int | None], schedule: str,
                         min_ratio: float, peak: float) -> str:
    """The log line of a resume whose spec asks for another ``(warmup_steps, max_steps)`` than the
    schedule the checkpoint's run started with (``kept``, which the resumed run keeps)."""
    (warmup, end), (new_warmup, new_end) = kept, spec
    changed = ", ".join(f"{name} {old} -> {new}" for name, old, new in
                        (("max_steps", end, new_end), ("warmup_steps", warmup, new_warmup)) if old != new)
    if schedule == "constant":
        return (f"resume: {changed}; the learning-rate schedule keeps the warmup of {warmup} step(s) "
                "it started with")
    return (f"resume: {changed}; the learning-rate schedule keeps the {warmup}-step warmup and its "
            f"cosine end at step {end} it started with: steps past {end} train at min_lr_ratio x "
            f"learning_rate = {min_ratio * peak:.2e} (a new schedule needs a new run directory)")


class LitGPT(LightningModule):
    """LightningModule that trains :class:`GPT` with AdamW and warmup + cosine decay.

    Logs ``train_loss`` and ``lr`` (per optimizer step) and ``val_loss`` (mean over the
    validation windows of all ranks), all in nats/token.

    Args:
        n_layer, n_head, d_model, block_size, dropout: the model shape (see :class:`GPT`).
        learning_rate: peak learning rate, reached after warmup.
        weight_decay: AdamW decoupled weight decay, applied to Linear weight matrices only
            (not to biases, LayerNorms or the embeddings).
        warmup_steps: linear warmup length in optimizer steps.
        max_steps: optimizer steps of the run (end of the cosine decay).
        lr_schedule: ``cosine`` or ``constant`` after warmup (see :func:`lr_factor`).
        min_lr_ratio: the cosine's final learning rate as a fraction of the peak.
        cpu_adam: use DeepSpeed's ``DeepSpeedCPUAdam`` (needed with DeepSpeed optimizer offload).

    The schedule belongs to the run: checkpoints record its ``warmup_steps`` and ``max_steps``
    (:meth:`on_save_checkpoint`), and a resume keeps them although the spec's changed (a finished
    run trained longer with a larger ``max_steps`` continues at the cosine's end, it does not
    re-stretch the cosine); see :meth:`on_load_checkpoint`.
    """

    kept_schedule: tuple[int, int | None] | None = None
    """``(warmup_steps, max_steps)`` of the schedule a resumed checkpoint's run started with, where
    it differs from the hyperparameters' (``None``: the hyperparameters' schedule)."""

    def __init__(
        self,
        n_layer: int,
        n_head: int,
        d_model: int,
        block_size: int,
        dropout: float = 0.0,
        learning_rate: float = 3e-3,
        weight_decay: float = 0.1,
        warmup_steps: int = 50,
        max_steps: int = 1000,
        cpu_adam: bool = False,
        lr_schedule: str = "cosine",
        min_lr_ratio: float = 0.1,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.model = GPT(n_layer, n_head, d_model, block_size, dropout)
        self.last_val_step: int | None = None
        """Global step of the latest completed validation (``None``: none yet in this process)."""
        self._init_levers()

    def _init_levers(self) -> None:
        """Read the speed levers this module applies itself (:mod:`jobgen.train.speed`) once."""
        from jobgen.train.speed import lever_on

        self.log_lr_on_host = lever_on("host_logging")
        """Log ``lr`` as a host tensor (:func:`jobgen.train.speed.host_scalar`)."""
        self.clip_without_scaler = lever_on("fused_clip")
        """Clip gradients itself under ``bf16-mixed`` (:meth:`configure_gradient_clipping`)."""
        self.log_step_loss = LogStepLoss() if lever_on("loss_read") else None
        """Where ``train_loss`` waits for its log step (:class:`jobgen.train.speed.LogStepLoss`;
        ``None``: logged from :meth:`training_step` as Lightning reads it)."""
        self._stepped_to: int | None = None
        """The global step the latest optimizer step made (set in :meth:`on_before_optimizer_step`)."""
        self._loss_logged_to: int | None = None
        """The global step whose ``train_loss`` was logged last."""

    @classmethod
    def from_spec(cls, spec: TrainingSpec) -> LitGPT:
        """Build the module for ``spec.model`` and ``spec.trainer``."""
        m, t = spec.model, spec.trainer
        return cls(
            n_layer=m.n_layer,
            n_head=m.n_head,
            d_model=m.d_model,
            block_size=m.block_size,
            dropout=m.dropout,
            learning_rate=t.learning_rate,
            weight_decay=t.weight_decay,
            warmup_steps=t.warmup_steps,
            max_steps=t.max_steps,
            cpu_adam=t.offload_optimizer != "none",
            lr_schedule=t.lr_schedule,
            min_lr_ratio=t.min_lr_ratio,
        )

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, T, 256)`` for token ids ``(B, T)``."""
        return self.model(idx)

    @staticmethod
    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross entropy in nats/token; ``logits`` ``(B, T, V)``, ``targets`` ``(B, T)``."""
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """One micro batch ``(x, y)``, each ``(B, T)``; returns the loss (nats/token)."""
        x, y = batch
        loss = self.loss(self(x), y)
        # Not prog_bar: Lightning converts progress-bar metrics to Python numbers after every batch
        # (a host-device sync per step on GPUs); the logger reads it at log intervals only, and
        # LineProgress / LogIntervalBar show it from there.
        if self.log_step_loss is None:
            self.log("train_loss", loss, on_step=True, on_epoch=False)
        else:  # logged in on_before_optimizer_step, from a copy started here
            last = 0 < self.trainer.max_steps <= self.trainer.global_step + 1  # a log step: _ValidationTracker stops
            self.log_step_loss.keep(loss, log_step=last or self._log_step())
        lr = self.optimizers().param_groups[0]["lr"]
        self.log("lr", host_scalar(lr) if self.log_lr_on_host else lr, on_step=True, on_epoch=False)
        return loss

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        """At a log step, log ``train_loss`` (:class:`jobgen.train.speed.LogStepLoss`): Lightning
        calls this once the step's last backward is queued, before the optimizer step, and before
        the callbacks' ``on_train_batch_end`` (the job-log line, the progress bar) read the step's
        metrics; between log steps nothing reads the loss."""
        reader = self.log_step_loss
        if reader is None:
            return
        self._stepped_to = self.trainer.global_step + 1
        if reader.at_log_step or self._log_step():
            self.log("train_loss", reader.read(), on_step=True, on_epoch=False)
            self._loss_logged_to = self._stepped_to

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Log ``train_loss`` where a callback made this step a log step after the optimizer step
        (``trainer.should_stop`` of a requeue): the device tensor, which Lightning reads once."""
        step = self.trainer.global_step
        if self.log_step_loss is not None and self._stepped_to == step != self._loss_logged_to and self._log_step():
            self.log("train_loss", self.log_step_loss.read(), on_step=True, on_epoch=False)
            self._loss_logged_to = step

    def _log_step(self) -> bool:
        """Whether Lightning hands this step's metrics to the loggers: its own
        ``_LoggerConnector.should_update_logs`` (private, Lightning 2.6; pinned by
        tests/entrypoint/test_lightning_api.py), the same answer from ``training_step`` to
        ``on_train_batch_end`` unless a callback sets ``trainer.should_stop`` in between."""
        return bool(self.trainer._logger_connector.should_update_logs)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """Loss of one validation micro batch; ``val_loss`` is averaged over batches and ranks."""
        x, y = batch
        loss = self.loss(self(x), y)
        self.log("val_loss", loss, on_step=False, on_epoch=True, prog_bar=True, sync_dist=True)
        return loss

    def on_validation_epoch_end(self) -> None:
        """Remember the global step of this validation (sanity checks do not count)."""
        if not self.trainer.sanity_checking:
            self.last_val_step = self.trainer.global_step

    def _under_deepspeed(self) -> bool:
        """Whether the trainer's strategy is DeepSpeed (``False`` without a trainer)."""
        from lightning.pytorch.strategies import DeepSpeedStrategy

        trainer = self._trainer
        return trainer is not None and isinstance(trainer.strategy, DeepSpeedStrategy)

    def parameter_groups(self) -> list[dict[str, Any]]:
        """AdamW groups: Linear weight matrices with ``weight_decay``, everything else without.

        The tied output projection is the token embedding, so it is not decayed.
        """
        embedding_ids = {id(m.weight) for m in self.modules() if isinstance(m, nn.Embedding)}
        decay_ids = {
            id(m.weight)
            for m in self.modules()
            if isinstance(m, nn.Linear) and id(m.weight) not in embedding_ids
        }
        decay, no_decay, seen = [], [], set()
        for p in self.parameters():
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            (decay if id(p) in decay_ids else no_decay).append(p)
        return [
            {"params": decay, "weight_decay": self.hparams.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]

    def _clips_itself(self, gradient_clip_val: float | None) -> bool:
        """Whether :meth:`configure_gradient_clipping` clips here instead of through Lightning:
        clipping is asked for and the precision plugin is Lightning's ``MixedPrecision`` without
        a loss scaler (``bf16-mixed``), and the ``fused_clip`` lever is on."""
        from lightning.pytorch.plugins.precision import MixedPrecision

        trainer = self._trainer
        plugin = None if trainer is None else trainer.precision_plugin
        return (self.clip_without_scaler and bool(gradient_clip_val) and isinstance(plugin, MixedPrecision)
                and plugin.scaler is None)

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """Clip the gradients before each optimizer step (Lightning's hook).

        Under ``bf16-mixed`` the gradients are not scaled (no GradScaler), so they are clipped
        here exactly as Lightning's base precision plugin would (``clip_grad_norm_`` /
        ``clip_grad_value_`` over the optimizer's parameters): Lightning's ``MixedPrecision``
        refuses to clip for an optimizer that unscales itself, fused AdamW included, although
        there is nothing to unscale (Lightning-AI/pytorch-lightning#21435). Everywhere else
        (``16-mixed`` with its scaler, FSDP, DeepSpeed, full precision) Lightning clips.
        """
        if not self._clips_itself(gradient_clip_val):
            super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
            return
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if gradient_clip_algorithm == "value":
            torch.nn.utils.clip_grad_value_(params, gradient_clip_val)
        else:
            torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)

    def schedule_steps(self) -> tuple[int, int | None]:
        """``(warmup_steps, max_steps)`` of the learning-rate schedule: the run's as it started
        (kept from the checkpoint a resume loaded), else the hyperparameters'."""
        if self.kept_schedule is not None:
            return self.kept_schedule
        return self.hparams.warmup_steps, self.hparams.max_steps

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Record the learning-rate schedule's ``warmup_steps`` and ``max_steps`` (:data:`SCHEDULE_KEY`),
        and key a plain optimizer state by parameter position, so that FSDP at a larger world
        size can continue it (:func:`jobgen.train.checkpoints.number_optimizer_state_by_parameter`)."""
        from jobgen.train.checkpoints import number_optimizer_state_by_parameter

        warmup, end = self.schedule_steps()
        checkpoint[SCHEDULE_KEY] = {"warmup_steps": warmup, "max_steps": end}
        if self._trainer is not None:
            number_optimizer_state_by_parameter(checkpoint, self, self.trainer.optimizers)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep the learning-rate schedule the checkpoint's run started with, and say so where the
        spec asks for another (a larger ``max_steps`` to train longer: the steps past the old end
        train at ``min_lr_ratio`` x ``learning_rate``, the cosine's end, instead of a re-stretched
        cosine whose learning rate jumps back up).

        The schedule comes from :data:`SCHEDULE_KEY`; a checkpoint of an older jobgen has none,
        and its hyperparameters at save time stand in. Works whether Lightning calls this before
        :meth:`configure_optimizers` (ddp) or after it (DeepSpeed, FSDP restore after setup): the
        scheduler reads :meth:`schedule_steps` at every step.
        """
        from lightning.pytorch.utilities import rank_zero_only

        recorded = checkpoint.get(SCHEDULE_KEY) or checkpoint.get("hyper_parameters") or {}
        if "max_steps" not in recorded or "warmup_steps" not in recorded:
            return
        hp = self.hparams
        kept = (int(recorded["warmup_steps"]), None if recorded["max_steps"] is None else int(recorded["max_steps"]))
        spec = (hp.warmup_steps, hp.max_steps)
        self.kept_schedule = None if kept == spec else kept
        if self.kept_schedule is not None and rank_zero_only.rank == 0:
            base_lrs = (checkpoint.get("lr_schedulers") or [{}])[0].get("base_lrs") or [hp.learning_rate]
            print(resume_schedule_note(kept, spec, hp.lr_schedule, hp.min_lr_ratio, float(base_lrs[0])), flush=True)

    def configure_optimizers(self) -> dict[str, Any]:
        """AdamW (betas 0.9/0.95) with a per-optimizer-step warmup + cosine (or constant) schedule
        over :meth:`schedule_steps`.

        Lightning calls this after moving the module to its device (and after FSDP wrapped it), so
        the parameters' device decides: torch's fused AdamW when they are all on CUDA outside
        DeepSpeed and clipping under a loss scaler (:func:`jobgen.train.speed.fused_adamw`),
        torch's default implementation otherwise (CPU ranks, FSDP CPU offload, DeepSpeed,
        clipping under ``16-mixed``),
        ``DeepSpeedCPUAdam`` with DeepSpeed's optimizer offload.
        """
        from jobgen.train.speed import fused_adamw

        hp = self.hparams
        groups = self.parameter_groups()
        if hp.cpu_adam:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            optimizer = DeepSpeedCPUAdam(groups, lr=hp.learning_rate, betas=(0.9, 0.95), adamw_mode=True)
        else:
            from lightning.pytorch.plugins.precision import MixedPrecision

            trainer = self._trainer
            clip = None if trainer is None else trainer.gradient_clip_val
            # clipping under a loss scaler (16-mixed) keeps Lightning's rule: no fused optimizer
            amp_clipping = (trainer is not None and isinstance(trainer.precision_plugin, MixedPrecision)
                            and (clip or 0) > 0 and not self._clips_itself(clip))
            fused = fused_adamw(groups, deepspeed=self._under_deepspeed(), amp_clipping=amp_clipping)
            # fused is passed only when on: the CPU path's optimizer is exactly what it was
            optimizer = torch.optim.AdamW(groups, lr=hp.learning_rate, betas=(0.9, 0.95), **({"fused": True} if fused else {}))
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            # the schedule's steps are read at every step: a resume may set them after this
            optimizer, lambda step: lr_factor(step, *self.schedule_steps(), hp.min_lr_ratio, hp.lr_schedule)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
