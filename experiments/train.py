"""Training one run (one method, one seed, one sweep variant): closure-based steps for every
optimizer of the suite, mixed precision, data parallelism, per-epoch checkpoints and logs.

The data order of epoch ``e`` is ``randperm(N)`` drawn from a generator seeded with the run's seed
(and augmentation from a second one), the model is initialised by ``model_factory(seed=seed)``,
the optimizer's own generator (bSAM, VSAM, SWAG, ...) is seeded with ``seed + 2000006``, the noise
generator of Bayesian layers (a method's ``bayesian`` table) with ``seed + 3000009``; the global
RNGs (dropout) are seeded with ``seed``. All of these states are checkpointed after every epoch and
at a signal, so a run that is stopped and resumed ends with bit-identical weights, optimizer state,
history (but the wall-clock ``seconds``) and logs (same device and software). Each step (batch and
augmentation draw, optimizer step, scaler and scheduler update, counters, loss record, step log)
runs inside one ``with interrupts_deferred:`` block (:mod:`landscape.cli_common`), so a SIGTERM
(:class:`~landscape.cli_common.Terminated`) surfaces only between two whole steps; there, as for a
Ctrl-C between steps, :meth:`Trainer.fit` writes a *mid-epoch checkpoint* (the steps done in the
epoch, the data generator's state before its permutation, its partial losses:
:mod:`experiments.checkpoint`) and re-raises, and the resumed run continues at the next step (on a
cluster, a preempted or timed-out task loses no step; see :meth:`Trainer.fit` for where it falls
back to the last epoch's checkpoint).

The closure of a step follows the optimizer's contract (:mod:`experiments.closures`): the usual
"backward and return the loss" (plus the KL term for Bayesian layers), or VOGN's per-example losses.
Under data parallelism ``distributed.sync_batchnorm`` synchronises BatchNorm
(:mod:`experiments.sync_batchnorm`).

The learning rate follows ``train.schedule`` per step: ``cosine`` (``0.5 (1 + cos(pi t / T))``,
Loshchilov & Hutter 2017, annealed to zero, or to ``train.min_lr``), ``step`` (times ``gamma`` at
each milestone epoch) or ``constant``, after an optional linear warm-up, through
:class:`experiments.schedules.FactorSchedule` (``LambdaLR``'s arithmetic) on the optimizer's param groups.

``train.compile`` (``"off"`` by default) runs the training forward and backward passes through
``torch.compile(model, mode=...)`` (``"default"``, ``"reduce-overhead"``: CUDA graphs for the static
shapes on a GPU, ``"max-autotune"``); the closure, the optimizer's two passes and its update are
unchanged, evaluation and checkpoints use the eager module (same weights). Updates equal the eager
ones within float32 rounding (``tests/test_compiled_step.py``). The batched m-sharpness path
(:mod:`optimizers.m_sharpness`) vectorises the eager module; the sub-batch loop
(``batched_m = false``) runs the compiled one.

A non-finite training loss, a non-finite gradient refused by the optimizer's step
(:class:`optimizers.step_protocol.NonFiniteGradient`), a training loss that grew by more than
``train.divergence_factor``, non-finite weights or non-finite test predictions stop the run with
:class:`experiments.divergence.Diverged` before the epoch's checkpoint is written (see that module).
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from experiments import divergence as dv
from experiments.amp import param_dtype, slow_autocast_warning
from experiments.budget import apply_budget
from experiments.checkpoint import load_checkpoint, save_checkpoint
from experiments.closures import ClosureFactory, check_sub_batches
from experiments.config import ConfigError
from experiments.data import RunData, data_fingerprints, prepare_data
from experiments.ensembles import predict_probs
from experiments.initial_weights import load_initial_weights
from experiments.logits import append_zero_logit
from experiments.logs import EpochLogger
from experiments.methods import build_optimizer, check_run, inner_optimizer
from experiments.model_checks import check_model_data
from experiments.parallel import DistContext
from experiments.schedules import FactorSchedule, NoSchedule, lr_factor
from experiments.sync_batchnorm import BatchNormSync, convert_batchnorm
from landscape import metrics
from landscape.cli_common import interrupts_deferred
from landscape.data import black_fill, input_stats, random_crop_flip, random_cutout, random_hflip
from landscape.data.autoaugment import standardised_autoaugment
from landscape.data.batching import inputs_to
from landscape.models import model_factory
from optimizers import SWAG, convert_to_bayesian
from optimizers.amp import LossScaler, ScaleUnderflow, SkipStep
from optimizers.bayes.mc_dropout import dropout_modules
from optimizers.bayes.sgvb import bayes_layers, kl_divergence
from optimizers.step_protocol import NonFiniteGradient

__all__ = ["STEP_HOOK", "Trainer", "build_model", "check_model"]

#: Test hook: ``STEP_HOOK(global_step)`` runs before every step (before its batch is drawn, outside
#: the step's deferral block: an exception it raises stops the run between two steps, e.g. a
#: simulated crash, or a ``Terminated`` that writes a mid-epoch checkpoint).
STEP_HOOK: Callable[[int], None] | None = None

AUG_SEED_OFFSET = 1_000_003
OPT_SEED_OFFSET = 2_000_006
BAYES_SEED_OFFSET = 3_000_009


def build_model(
    cfg: dict[str, Any],
    seed: int,
    dtype: torch.dtype,
    device: torch.device,
    *,
    initial_weights: bool = True,
    notes: dict[str, Any] | None = None,
) -> nn.Module:
    """The run's model: ``model_factory(name, seed=seed, **kwargs)``, with ``model.checkpoint`` its
    initial weights loaded from that file (:func:`experiments.initial_weights.load_initial_weights`;
    not with ``initial_weights=False``; the load's note goes to ``notes["initial_weights"]``), on
    ``device`` in ``dtype``; with a ``bayesian`` table on the method, its ``nn.Linear`` /
    ``nn.Conv2d`` layers converted to Bayesian layers (:func:`optimizers.convert_to_bayesian`) whose
    noise generator is seeded with ``seed + BAYES_SEED_OFFSET``; with ``model.logits = "c-1"`` the
    zero logit appended to its outputs (:func:`experiments.logits.append_zero_logit`)."""
    name = cfg["model"]["name"]  # a registered model: checked once, by experiments.runner.validate
    try:
        model = model_factory(name, seed=seed, **cfg["model"]["kwargs"])
    except TypeError as exc:
        raise ConfigError(f"model {name!r} rejects model.kwargs {cfg['model']['kwargs']}: {exc}") from None
    model = model.to(device=device, dtype=dtype)
    path = cfg["model"].get("checkpoint", "")
    if path and initial_weights:
        note = load_initial_weights(model, path, strict=cfg["model"].get("checkpoint_strict", True))
        if note["missing"] or note["unexpected"] or note["reshaped"]:
            warnings.warn(
                f"model.checkpoint {path}: loaded {note['loaded']} entries; kept the seeded "
                f"initialisation of {note['missing'] + note['reshaped']}; not used from the file: "
                f"{note['unexpected']}",
                UserWarning,
                stacklevel=2,
            )
        pinned = cfg["model"].get("checkpoint_sha256", "")
        if pinned and pinned != note["sha256"]:
            raise ConfigError(
                f"model.checkpoint {path} has SHA-256 {note['sha256']}, not model.checkpoint_sha256 = "
                f"{pinned}: the file changed; restore it, or clear checkpoint_sha256 to start a new run"
            )
        if notes is not None:
            notes["initial_weights"] = note
    bayes = cfg["methods"][0].get("bayesian") if cfg["methods"] else None
    if bayes:
        gen = torch.Generator(device=device).manual_seed(seed + BAYES_SEED_OFFSET)
        try:
            model = convert_to_bayesian(
                model,
                prior_std=bayes["prior_std"],
                init_std=bayes["init_std"],
                local_reparam=bayes["local_reparam"],
                generator=gen,
            )
        except ValueError as exc:
            raise ConfigError(f"method {cfg['methods'][0]['name']!r}, bayesian table: {exc}") from None
    if cfg["model"].get("logits", "c") == "c-1":
        append_zero_logit(model)
    return model


def check_model(cfg: dict[str, Any], model: nn.Module, contract: Any, data: RunData | None = None) -> None:
    """Checks of the method against the model (dropout for MC-Dropout, no BatchNorm for VOGN); the
    model may live on the ``meta`` device (the runner checks every run this way before training).
    With ``data``, the model's input and output sizes against the data's examples and classes
    (:func:`experiments.model_checks.check_model_data`, a forward pass on ``meta``)."""
    from torch.nn.modules.batchnorm import _BatchNorm

    if data is not None:
        check_model_data(cfg, data)
    method = cfg["methods"][0]
    if method["mc_dropout"] and not dropout_modules(model):
        raise ConfigError(
            f"method {method['name']!r}: mc_dropout needs a model with dropout layers; model "
            f"{cfg['model']['name']!r} has none with model.kwargs {cfg['model']['kwargs']}: set "
            "model.kwargs.dropout = 0.1 (mlp, lenet5, the ResNets and PreResNets take it)"
        )
    if contract.independent_examples and any(isinstance(m, _BatchNorm) for m in model.modules()):
        raise ConfigError(
            f"method {method['name']!r} ({method['optimizer']}) needs per-example losses that do not "
            "interact, but the model has BatchNorm layers (training-mode statistics mix the examples); "
            'use a model without BatchNorm (model.kwargs.norm = "group" or "none", or a "-frn" model)'
        )


class Trainer:
    """Train and checkpoint one run in ``run_dir`` (see the module docstring)."""

    step_log: Any = None  # train.log_every > 0, main rank: experiments.logs.StepLogger (set by fit)

    def __init__(
        self,
        cfg: dict[str, Any],
        run_dir: Path,
        *,
        seed: int,
        device: torch.device,
        ctx: DistContext,
        fingerprint: str,
        progress: bool = False,
        data: RunData | None = None,
    ) -> None:
        self.cfg = apply_budget(cfg)
        self.run_dir = Path(run_dir)
        # the perturbation option may differ between the runs of a sweep: this run's own value
        ctx = dataclasses.replace(ctx, perturbation=self.cfg["distributed"]["perturbation"])
        self.seed, self.device, self.ctx, self.fingerprint = seed, device, ctx, fingerprint
        self.progress = progress and ctx.is_main
        self.precision = self.cfg["precision"]
        self.dtype = param_dtype(self.precision)
        if (slow := slow_autocast_warning(self.precision, device)) is not None:
            warnings.warn(slow, RuntimeWarning, stacklevel=2)
        self.method = self.cfg["methods"][0]
        self.contract = check_run(self.cfg)
        self.data: RunData = prepare_data(self.cfg, seed) if data is None else data
        t = self.cfg["train"]
        self.n = len(self.data.y_train)
        bs = min(t["batch_size"], self.n)
        self.batch_size = bs
        self.steps_per_epoch = self.n // bs if t["drop_last"] else math.ceil(self.n / bs)
        self.x_train = inputs_to(self.data.x_train, device, self.dtype)
        self.y_train = self.data.y_train.to(device)
        self.fill = _crop_fill(self.cfg, self.x_train)
        self.autoaugment_stats = _autoaugment_stats(self.cfg, self.x_train)
        self.notes: dict[str, Any] = {}  # the initial weights' note (model.checkpoint)
        self.model = build_model(self.cfg, seed, self.dtype, device, notes=self.notes)
        check_model(self.cfg, self.model, self.contract, self.data)
        self.bn_sync = self._sync_batchnorm()
        self.loss_fn = nn.CrossEntropyLoss(label_smoothing=t["label_smoothing"])
        num_data = int(round(self.n * self.cfg["data"]["num_data_factor"]))
        self.opt, self.opt_args = build_optimizer(
            self.method,
            self.model,
            train_cfg=t,
            num_data=num_data,
            seed=seed + OPT_SEED_OFFSET,
            steps_per_epoch=self.steps_per_epoch,
        )
        self.inner = inner_optimizer(self.opt)
        world = ctx.world if ctx.data_parallel else 1
        check_sub_batches(
            int(getattr(self.inner, "m", 1)), self.n, bs, t["drop_last"], self.method["name"], world
        )
        if t["schedule"] == "none":  # the optimizer sets its own learning rate (e.g. F-SGLD's official one)
            self.scheduler: Any = NoSchedule()
        else:
            self.scheduler = FactorSchedule(self.inner, lambda s: lr_factor(s, self.steps_per_epoch, t))
        self.scaler = LossScaler(enabled=self.precision == "fp16")
        self.generators = {
            "data": torch.Generator().manual_seed(seed),
            "augment": torch.Generator().manual_seed(seed + AUG_SEED_OFFSET),
        }
        kl = None
        if self.method["bayesian"]:
            self.generators["bayes"] = bayes_layers(self.model)[0].generator
            weight = self.method["bayesian"]["kl_weight"]
            if not self.contract.adds_kl and weight > 0:
                kl = (kl_divergence, weight, num_data)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.create_graph = getattr(self.inner, "hvp", None) == "exact" and hasattr(self.inner, "fd_step")
        if self.create_graph and (ctx.data_parallel or self.scaler.enabled):
            raise ConfigError(
                f"method {self.method['name']!r}: hvp='exact' (double backward) cannot be combined with "
                'data parallelism or fp16 loss scaling; use hyperparameters.hvp = "finite_difference"'
            )
        if ctx.data_parallel and not self.contract.data_parallel:
            raise ConfigError(
                f"method {self.method['name']!r} ({self.method['optimizer']}) forms its gradient "
                "statistics inside its step, which the runner cannot all-reduce; use "
                'distributed.mode = "grid" (the torchrun ranks then run separate runs)'
            )
        self.forward = _compiled_forward(self.model, t["compile"], self.create_graph)
        self.closures = ClosureFactory(
            forward=self.forward,
            model=self.model,
            inner=self.inner,
            contract=self.contract,
            loss_fn=self.loss_fn,
            params=self.params,
            precision=self.precision,
            device=device,
            ctx=ctx,
            method_name=self.method["name"],
            create_graph=self.create_graph,
            kl=kl,
            bn_sync=self.bn_sync,
        )
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        random.seed(seed)
        self.counters = {"epoch": 0, "step": 0, "skipped": 0}
        self.history: list[dict[str, Any]] = []
        # divergence checks (experiments.divergence); with perturbation = "local" each rank's step
        # loss differs, so a rank's decision waits for the ranks' agreement at the end of the epoch
        self.monitor = dv.DivergenceMonitor(
            t.get("divergence_factor", 10.0), min(dv.WINDOW, self.steps_per_epoch)
        )
        self.defer_divergence = ctx.data_parallel and ctx.perturbation == "local"
        self.pending: Any = None
        # mid-epoch checkpoints: the loaded partial epoch to resume (restore), the progress of the
        # epoch a signal stopped between two steps (_epoch, written by fit)
        self.resume: dict[str, Any] | None = None
        self.interrupted: _EpochProgress | None = None

    # ------------------------------------------------------------------------------ epochs
    def _augment(self, x: torch.Tensor) -> torch.Tensor:
        """``data.augmentation``: ``flip`` or ``crop_flip`` (``landscape.data.random_hflip`` /
        ``random_crop_flip``, flip probability 1/2), then ``data.autoaugment`` (the policy on the
        un-standardised images, ``landscape.data.autoaugment``), then ``data.cutout``
        (``landscape.data.random_cutout``), all drawn from the run's augmentation generator, on the
        whole global batch (so data-parallel ranks see the same images as one process). Training
        batches only: evaluation reads the data sets directly."""
        d, gen = self.cfg["data"], self.generators["augment"]
        if d["augmentation"] == "flip":
            x = random_hflip(x, 0.5, generator=gen)
        elif d["augmentation"] == "crop_flip":
            x = random_crop_flip(x, d["crop_padding"], 0.5, generator=gen, fill=self.fill)
        if d["autoaugment"] != "none":  # after crop/flip, before Cutout (the SAM code's order)
            mean, std, fill = self.autoaugment_stats
            x = standardised_autoaugment(x, d["autoaugment"], mean, std, generator=gen, fill=fill)
        if d["cutout"] > 0:  # zeros after standardisation (DeVries & Taylor's code)
            x = random_cutout(x, d["cutout"], generator=gen)
        return x

    def _batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        idx = idx.to(self.device)
        x, y = self._augment(self.x_train[idx]), self.y_train[idx]
        if not self.ctx.data_parallel:
            return x, y
        n = idx.shape[0]
        lo, hi = self.ctx.shard(n)
        return (x, y) if (lo, hi) == (0, n) else (x[lo:hi], y[lo:hi])

    def _sync_batchnorm(self) -> Any:
        """``distributed.sync_batchnorm`` under data parallelism: BatchNorm layers replaced by
        :class:`experiments.sync_batchnorm.SyncedBatchNorm`; their shared state, or ``None``."""
        if not (self.cfg["distributed"]["sync_batchnorm"] and self.ctx.data_parallel):
            return None
        if self.ctx.perturbation == "local":
            raise ConfigError(
                'distributed.sync_batchnorm = true cannot be combined with perturbation = "local": '
                "per-device perturbations (m-sharpness) use per-device BatchNorm statistics; set "
                'perturbation = "global" or sync_batchnorm = false'
            )
        sync = BatchNormSync(self.ctx)
        return sync if convert_batchnorm(self.model, sync) else None

    def _train_epoch(self, epoch: int) -> dict[str, Any]:
        if self.bn_sync is None:
            return self._epoch(epoch)
        self.bn_sync.active = True
        try:
            return self._epoch(epoch)
        finally:
            self.bn_sync.active = False

    def _epoch(self, epoch: int) -> dict[str, Any]:
        """Train epoch ``epoch`` (from the step after a mid-epoch checkpoint's, if :meth:`restore`
        loaded one); its history row. Each step (batch and augmentation draw, optimizer step,
        scaler and scheduler update, counters, loss record, step log, divergence read) runs inside
        one ``with interrupts_deferred:`` block, so a SIGTERM surfaces only between two whole steps;
        there (or at a Ctrl-C between steps) :attr:`interrupted` keeps the epoch's progress for
        :meth:`fit`'s mid-epoch checkpoint."""
        t0 = time.perf_counter()
        self.model.train()
        resume, self.resume = self.resume, None
        if resume is not None:  # the order of the interrupted epoch, drawn again
            self.generators["data"].set_state(resume["data_generator"])
        lr = self.inner.param_groups[0]["lr"]
        progress = _EpochProgress(epoch, self.generators["data"].get_state(), lr)
        if resume is not None:
            progress.done, progress.skipped, progress.lr = resume["batch"], resume["skipped"], resume["lr"]
            progress.losses.load_state_dict(resume["losses"], self.device)
            t0 -= resume["seconds"]
        # the epoch's order, drawn on the CPU generator, moved to the device once (not per step)
        perm = torch.randperm(self.n, generator=self.generators["data"]).to(self.device)
        epochs = self.cfg["train"]["epochs"]
        losses = progress.losses
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(
                total=self.steps_per_epoch,
                initial=progress.done,
                leave=False,
                unit="step",
                desc=f"{self.method['name']} seed {self.seed} epoch {epoch + 1}/{epochs}",
            )
        try:
            for b in range(progress.done, self.steps_per_epoch):
                if STEP_HOOK is not None:
                    STEP_HOOK(self.counters["step"])
                with interrupts_deferred:  # a SIGTERM stops the run between steps, weights whole
                    progress.in_step = True
                    read = self._step(perm, b, progress)
                    progress.done, progress.in_step = b + 1, False
                if bar is not None and read:
                    bar.update(b + 1 - bar.n)
                    bar.set_postfix(loss=f"{losses.mean():.4g}")
        except KeyboardInterrupt:  # Terminated (SIGTERM) or Ctrl-C
            if not progress.in_step:  # between two whole steps: the state is exact
                progress.seconds = time.perf_counter() - t0
                self.interrupted = progress
            raise
        finally:
            if bar is not None:
                bar.close()
        self.counters["skipped"] += progress.skipped
        row = {
            "epoch": epoch + 1,
            "step": self.counters["step"],
            "lr": progress.lr,
            "train_loss": losses.mean(),
            "skipped_steps": progress.skipped,
        }
        if self.scaler.enabled:
            row["loss_scale"] = self.scaler.scale
        row["seconds"] = time.perf_counter() - t0
        return row

    def _step(self, perm: torch.Tensor, b: int, progress: _EpochProgress) -> bool:
        """Step ``b`` of the epoch (its batch ``perm[b * batch_size : (b + 1) * batch_size]``);
        whether the losses were read (every ``READ_EVERY`` / window steps and at the epoch's end)."""
        losses, epoch, steps = progress.losses, progress.epoch, self.steps_per_epoch
        idx = perm[b * self.batch_size : (b + 1) * self.batch_size]
        n_idx = idx.shape[0]
        x, y = self._batch(idx)
        try:
            loss = self.opt.step(self.closures(x, y, n_idx, self.scaler))
            self.scaler.update(False)
        except SkipStep:
            try:
                self.scaler.update(True)
            except ScaleUnderflow as exc:  # non-finite at every scale: not an fp16 overflow
                self._stop_at_nonfinite_gradient(exc, losses, n_idx, epoch)
            progress.skipped += 1
            loss = None
        except NonFiniteGradient as exc:
            self._stop_at_nonfinite_gradient(exc, losses, n_idx, epoch)
            loss = None  # deferred (data parallel, local perturbation): this rank skipped the step
        self.scheduler.step()
        self.counters["step"] += 1
        if loss is not None:
            losses.add(loss, self.counters["step"], n_idx)
            if self.step_log is not None:
                self.step_log.record(self.counters["step"], self.opt)
        every = dv.READ_EVERY or self.monitor.window
        if (b + 1) % every and b + 1 < steps:
            return False
        # one host read of the losses since the last one (not one per step)
        found = losses.read(self.monitor if self.pending is None else None, epoch + 1)
        if found is not None:
            self.pending = found
            if not self.defer_divergence:
                raise dv.Diverged(found, self.run_dir)
        return True

    def _stop_at_nonfinite_gradient(
        self, exc: NonFiniteGradient | ScaleUnderflow, losses: dv.StepLosses, size: int, epoch: int
    ) -> None:
        """The step refused a NaN / inf gradient (the weights are those before it), or the loss
        scaler found it non-finite at every scale down to its ``min_scale``: the run stops as
        diverged. The step's loss is read with the losses kept since the last read, so a NaN / inf
        loss (or an earlier step's) is recorded as a loss check would record it; otherwise the
        record is ``"non-finite gradient"`` with the optimizer's message."""
        step = self.counters["step"] + 1
        loss = getattr(exc, "loss", None)  # ScaleUnderflow: the skipped step returned no loss
        if loss is not None:
            losses.add(torch.tensor(loss), step, size)
        found = self.pending or losses.read(self.monitor, epoch + 1)
        if found is None:
            found = self.monitor.record(dv.NONFINITE_GRADIENT, step=step, epoch=epoch + 1, detail=str(exc))
        if self.defer_divergence:
            # data parallel with per-rank perturbations: the first pass's gradient is this rank's
            # own, so another rank may have taken the step; stopping here would leave it waiting at
            # the next all-reduce. The rank keeps its weights, trains the rest of the epoch and the
            # ranks agree at its end (experiments.divergence.agree), as for a non-finite loss
            self.pending = found
            return
        raise dv.Diverged(found, self.run_dir) from exc

    def _test_metrics(self) -> dict[str, float]:
        probs = predict_probs(self.model, self.data.x_test, self.cfg["evaluation"]["batch_size"], self.device)
        dv.check_predictions(probs, "test set, per-epoch metrics")
        return {
            "test_accuracy": metrics.accuracy(probs, self.data.y_test),
            "test_nll": metrics.nll(probs, self.data.y_test),
        }

    def _state(self) -> dict[str, Any]:
        return dict(
            model=self.model,
            optimizer=self.opt,
            scheduler=self.scheduler,
            scaler=self.scaler,
            generators=self.generators,
            data_fingerprint=data_fingerprints(self.data),  # a resume on other data is refused
        )

    def restore(self) -> bool:
        """Load the run's last checkpoint (weights, optimizer, schedule, scaler, generators,
        counters, history) if there is one; return whether there was. A mid-epoch checkpoint's
        partial epoch is kept in :attr:`resume`: the next :meth:`_epoch` continues it at the step
        after the checkpoint's."""
        ckpt = self.run_dir / "checkpoint.pt"
        if not ckpt.is_file():
            return False
        partial: dict[str, Any] = {}
        counters, self.history = load_checkpoint(
            ckpt, fingerprint=self.fingerprint, partial_epoch=partial, **self._state()
        )
        self.counters = dict(counters)
        batch = int(self.counters.pop("batch", 0))  # the older, epoch-only format has none
        self.resume = {**partial, "batch": batch} if partial else None
        self.monitor.load_state_dict(self.counters.get("divergence"), self.history)
        _swag_to(self.opt, self.device)
        return True

    def fit(self) -> None:
        """Train from the last checkpoint (if any) to the last epoch, checkpointing every epoch and
        at a signal.

        A ``KeyboardInterrupt`` (:class:`landscape.cli_common.Terminated` for a SIGTERM, or Ctrl-C)
        that surfaces between two steps of an epoch writes a mid-epoch checkpoint (same file, see
        :mod:`experiments.checkpoint`), appends the step log's records up to that step and is
        re-raised; the resumed run continues at the next step and ends bit-identically (weights,
        optimizer, history except ``seconds``, logs). The mid-epoch write is skipped, so the run
        resumes from the last epoch's checkpoint as before, when it cannot be exact: a Ctrl-C that
        lands inside a step (a SIGTERM there is deferred to the step's end), an interrupt outside the
        loop over the steps (the end-of-epoch checks and evaluation, the epoch's checkpoint write),
        data parallelism (``distributed.mode = "data_parallel"`` with more than one rank: the ranks
        would have to agree on the step), and a divergence record held for the ranks' agreement at
        the epoch's end (:attr:`pending`).
        """
        ckpt = self.run_dir / "checkpoint.pt"
        state = self._state()
        self.restore()
        epochs = self.cfg["train"]["epochs"]
        every = self.cfg["evaluation"]["every"]
        kw = {"start_epoch": self.counters["epoch"], "start_step": self.counters["step"]}
        kw["log_every"] = self.cfg["train"].get("log_every", 0)  # per-step optimizer diagnostics
        logger = EpochLogger(self.run_dir, **kw) if self.ctx.is_main else None
        self.step_log = logger.steps if logger is not None else None
        try:
            for epoch in range(self.counters["epoch"], epochs):
                row = self._train_epoch(epoch)
                self._end_of_epoch_checks(
                    row, epoch, bool(every) and ((epoch + 1) % every == 0 or epoch + 1 == epochs)
                )
                self.history.append(row)
                self.counters["epoch"] = epoch + 1
                self.counters["divergence"] = self.monitor.state_dict()
                if self.ctx.is_main:
                    save_checkpoint(
                        ckpt,
                        history=self.history,
                        counters=self.counters,
                        fingerprint=self.fingerprint,
                        **state,
                    )
                    logger.write(self.history)
                self.ctx.barrier()
        except KeyboardInterrupt:
            self._save_interrupted(ckpt, state, logger)
            raise
        finally:
            if logger is not None:
                logger.close()

    def _save_interrupted(self, ckpt: Path, state: dict[str, Any], logger: EpochLogger | None) -> None:
        """The mid-epoch checkpoint of :meth:`fit` (where it can be exact; see there), then the step
        log's records up to its step. A failed write is a warning: the interrupt goes on, and the
        previous checkpoint is intact."""
        progress, self.interrupted = self.interrupted, None
        if progress is None or not self.ctx.is_main or self.ctx.data_parallel or self.pending is not None:
            return
        counters = {**self.counters, "divergence": self.monitor.state_dict(), "batch": progress.done}
        try:
            save_checkpoint(
                ckpt,
                history=self.history,
                counters=counters,
                fingerprint=self.fingerprint,
                partial_epoch=progress.state_dict(),
                **state,
            )
        except OSError as exc:
            warnings.warn(f"no mid-epoch checkpoint: {exc}", RuntimeWarning, stacklevel=2)
            return
        if logger is not None and logger.steps is not None:
            logger.steps.flush()

    def _end_of_epoch_checks(self, row: dict[str, Any], epoch: int, evaluate: bool) -> None:
        """Weights finite, the per-epoch test metrics (main rank) finite, the ranks agreeing on a
        deferred loss check; raises :class:`Diverged` before the epoch's checkpoint is written."""
        found, step = self.pending, self.counters["step"]
        bad = dv.nonfinite_weights(self.model) if found is None else []
        if bad:
            found = self.monitor.record(
                dv.NONFINITE_WEIGHTS, step=step, epoch=epoch + 1, detail=", ".join(bad[:5])
            )
        if found is None and self.ctx.is_main and evaluate:
            try:
                row.update(self._test_metrics())
            except dv.Diverged as exc:
                found = exc.record
        found = dv.agree(self.ctx, found, self.device)
        if found is not None:
            raise dv.Diverged(
                found.complete(self.monitor.record(found.reason, step=step, epoch=epoch + 1)), self.run_dir
            )


@dataclasses.dataclass
class _EpochProgress:
    """An epoch in progress: its index, the data generator's state before its ``randperm``, its
    first learning rate, the steps done, its step losses, skipped steps and seconds run, and
    whether a step is under way (the state is then not that of a step boundary)."""

    epoch: int
    data_generator: torch.Tensor
    lr: Any
    done: int = 0
    losses: dv.StepLosses = dataclasses.field(default_factory=dv.StepLosses)
    skipped: int = 0
    seconds: float = 0.0
    in_step: bool = False

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's ``partial_epoch`` (``done`` goes to ``counters["batch"]``)."""
        lr = self.lr  # as the history row keeps it; numpy numbers would not load with weights_only
        if isinstance(lr, torch.Tensor):
            lr = lr.detach().cpu().clone()
        elif type(lr) not in (int, float):
            lr = float(lr)
        return {
            "epoch": self.epoch,
            "data_generator": self.data_generator,
            "lr": lr,
            "losses": self.losses.state_dict(),
            "skipped": self.skipped,
            "seconds": self.seconds,
        }


def _compiled_forward(model: nn.Module, mode: str, create_graph: bool) -> Callable[..., Any]:
    """The module itself (``train.compile = "off"``) or ``torch.compile(model, mode=...)``."""
    if mode == "off":
        return model
    if create_graph:
        raise ConfigError(
            f'train.compile = "{mode}" cannot differentiate twice (the method uses hvp = "exact"); use '
            'hyperparameters.hvp = "finite_difference" or train.compile = "off"'
        )
    return torch.compile(model, mode=None if mode == "default" else mode)


def _crop_fill(cfg: dict[str, Any], x: torch.Tensor) -> Any:
    """Checks the augmentation against the inputs; the padding value of ``crop_flip``: ``0`` (the
    mean colour of standardised inputs) or, with ``crop_fill = "black"``, ``-mean / std`` of the data
    set's channel statistics (torchvision pads raw images with black)."""
    d = cfg["data"]
    if d["augmentation"] == "none":
        return 0.0
    if x.dim() != 4:
        raise ConfigError(
            f"data.augmentation = {d['augmentation']!r} needs image inputs [N, C, H, W], but {d['name']!r} "
            f'gives {tuple(x.shape)}; use augmentation = "none" or an image data set (e.g. digits-image)'
        )
    if d["crop_fill"] == "mean":
        return 0.0
    stats = _input_stats(d)
    if stats is None:
        raise ConfigError(
            f'data.crop_fill = "black" needs the channel statistics that standardised the inputs; '
            f"{d['name']!r} with normalize = {d['kwargs'].get('normalize', True)!r} has none; use "
            'crop_fill = "mean"'
        )
    return black_fill(stats)


def _input_stats(d: dict[str, Any]) -> Any:
    """The ``(mean, std)`` the data were standardised with (:func:`landscape.data.input_stats`)."""
    try:
        return input_stats(d["name"], d["kwargs"].get("normalize", True))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"data.kwargs.normalize: {exc}") from None


def _autoaugment_stats(cfg: dict[str, Any], x: torch.Tensor) -> Any:
    """Checks ``data.autoaugment`` / ``data.cutout`` against the inputs; for AutoAugment the
    ``(mean, std, fill)`` that map the loaded inputs back to ``[0, 1]``: the data set's channel
    statistics (``kwargs.normalize`` true or a statistics name), ``0`` / ``1`` for raw inputs
    (``normalize = false``) or the ``(mean, std)`` pair given; ``fill`` (what the geometric
    operations leave outside the image) is the mean colour with ``crop_fill = "mean"`` (the
    authors' code: 0 after standardisation) and black with ``"black"``."""
    d = cfg["data"]
    if d["autoaugment"] == "none" and d["cutout"] == 0:
        return None
    if x.dim() != 4:
        raise ConfigError(
            f"data.autoaugment / data.cutout need image inputs [N, C, H, W], but {d['name']!r} gives "
            f'{tuple(x.shape)}; use autoaugment = "none" and cutout = 0, or an image data set'
        )
    if d["autoaugment"] == "none":
        return None
    channels = x.shape[1]
    if d["kwargs"].get("normalize", True) is False:
        mean, std = (0.0,) * channels, (1.0,) * channels
    else:
        stats = _input_stats(d)
        if stats is None:
            raise ConfigError(
                f"data.autoaugment = {d['autoaugment']!r} works on images in [0, 1] and needs the "
                f"channel statistics that standardised them; {d['name']!r} has none; load raw images "
                "with data.kwargs.normalize = false"
            )
        mean, std = stats
    if len(mean) != channels:
        raise ConfigError(f"data.autoaugment: {len(mean)} channel means for images with {channels} channels")
    fill = tuple(float(m) for m in mean) if d["crop_fill"] == "mean" else 0.0
    return mean, std, fill


def _swag_to(opt: Any, device: torch.device) -> None:
    """Move a loaded SWAG's moment vectors to the parameters' device."""
    if isinstance(opt, SWAG):
        if opt._mean is not None:
            opt._mean, opt._sq_mean = opt._mean.to(device), opt._sq_mean.to(device)
        opt._devs.extend([d.to(device) for d in [opt._devs.popleft() for _ in range(len(opt._devs))]])
