"""The callbacks for Lightning and the Hugging Face Trainer, in a real `Trainer.fit` / `Trainer.train`
on tiny models: a training run gives bitwise the same losses and weights with and without the
callback; a planted in-place bug is named at its line, on the exception too; the steps not recorded
run with nothing of jupyter_autograd installed; the traces stay on the callback."""
import gc
import inspect
import logging
import sys
import traceback
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module

import lightning.pytorch as pl
import pytorch_lightning
from transformers import Trainer, TrainingArguments

from jupyter_autograd.capture import state as capture_state
from jupyter_autograd.integrations import lightning as ja_lightning
from jupyter_autograd.integrations import pytorch_lightning as ja_pytorch_lightning
from jupyter_autograd.integrations import transformers as ja_transformers
from jupyter_autograd.integrations._steps import StepCapture

pytestmark = pytest.mark.filterwarnings("ignore:.*does not have many workers:UserWarning")


def installed():
    """What of the capture is in place now (torch's global hooks, mode stack, patched functions)."""
    return dict(
        mode_stack=torch._C._len_torch_function_stack(),
        apply=torch.autograd.function.Function.__dict__["apply"],
        forward_pre_hooks=len(nn_module._global_forward_pre_hooks),
        forward_hooks=len(nn_module._global_forward_hooks),
        optimizer_pre_hooks=len(optim_module._global_optimizer_pre_hooks),
        optimizer_post_hooks=len(optim_module._global_optimizer_post_hooks),
        has_any_global_hook=nn_module._has_any_global_hook,
        has_torch_function=torch.overrides.has_torch_function,
        recorder=getattr(capture_state.thread_state, "recorder", None),
    )


def data(n=24):
    generator = torch.Generator().manual_seed(3)
    return torch.randn(n, 4, generator=generator), torch.randn(n, 3, generator=generator)


def line_of(function, text):
    lines, start = inspect.getsourcelines(function)
    return start + next(i for i, line in enumerate(lines) if text in line)


def adam_updates(trace):
    """Parameter updates of Adam(W) in the trace: the frameworks' optimizer steps (a closure, a
    scheduler's wrapper) are recorded call by call, one addcdiv_ per parameter."""
    return sum(op.name == "Tensor.addcdiv_" for op in trace.ops)


def frames(exc):
    return [(f.filename, f.lineno, f.name) for f in traceback.extract_tb(exc.__traceback__)]


# -- Lightning -------------------------------------------------------------------------------------

class RegressorSteps:
    """The LightningModule of the tests, for either package (lightning.pytorch, pytorch_lightning)."""

    def __init__(self, bug_at=None, manual=False):
        super().__init__()
        self.layer = nn.Linear(4, 3)
        self.bug_at = bug_at
        self.automatic_optimization = not manual
        self.losses = []
        self.seen = []  # what of ours was installed in each training_step
        self.made = []  # a weak reference to a tensor each training_step made

    def training_step(self, batch, batch_idx):
        self.seen.append(installed())
        x, y = batch
        h = torch.sigmoid(self.layer(x))
        self.made.append(weakref.ref(h))
        if batch_idx == self.bug_at:
            h.mul_(2)
        loss = F.mse_loss(h, y)
        self.losses.append(loss.detach().clone())
        if not self.automatic_optimization:
            optimizer = self.optimizers()
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.05)


class LitRegressor(RegressorSteps, pl.LightningModule):
    pass


class PLRegressor(RegressorSteps, pytorch_lightning.LightningModule):
    pass


def fit(callbacks, module_package=pl, steps=5, bug_at=None, manual=False, root=None, logger=False, **trainer_args):
    torch.manual_seed(0)
    module = (LitRegressor if module_package is pl else PLRegressor)(bug_at=bug_at, manual=manual)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*data()), batch_size=4)
    trainer = module_package.Trainer(max_steps=steps, callbacks=callbacks, logger=logger, enable_checkpointing=False,
                                     enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                                     devices=1, default_root_dir=root, **trainer_args)
    trainer.fit(module, loader)
    return module


def fit_raising(callbacks, **kwargs):
    with pytest.raises(RuntimeError) as info:
        fit(callbacks, **kwargs)
    return info.value


@pytest.mark.parametrize("manual", [False, True], ids=["automatic", "manual"])
def test_lightning_fit_is_bitwise_the_same_with_the_callback(manual):
    plain = fit([], manual=manual)
    callback = ja_lightning.AutogradCallback(steps=[0, 3])
    recorded = fit([callback], manual=manual)
    assert len(plain.losses) == 5
    assert all(torch.equal(a, b) for a, b in zip(plain.losses, recorded.losses))
    for (name, a), b in zip(plain.state_dict().items(), recorded.state_dict().values()):
        assert torch.equal(a, b), name
    assert list(callback.traces) == [0, 3] and callback.last_trace is callback.traces[3]
    for trace in callback.traces.values():
        assert trace.diagnoses == [] and trace.warnings == []
        assert len(trace.backward_calls()) == 1
        assert adam_updates(trace) == 2  # weight and bias


def test_lightning_steps_not_recorded_run_with_nothing_installed():
    before = installed()
    module = fit([ja_lightning.AutogradCallback(steps=[0, 3])])
    assert installed() == before
    recorded = [i for i, seen in enumerate(module.seen) if seen != before]
    assert recorded == [0, 3]
    assert all(seen["mode_stack"] == 1 and seen["recorder"] is not None for seen in (module.seen[0], module.seen[3]))


def test_lightning_callback_keeps_no_tensor_of_the_step_alive():
    plain = fit([])
    recorded = fit([ja_lightning.AutogradCallback(steps=[0, 3])])
    gc.collect()
    assert [r() is None for r in recorded.made] == [r() is None for r in plain.made] == [True] * 5


def test_lightning_records_every_batch_of_an_accumulated_step():
    plain = fit([], steps=2, accumulate_grad_batches=3)
    callback = ja_lightning.AutogradCallback(steps=[1])
    recorded = fit([callback], steps=2, accumulate_grad_batches=3)
    assert all(torch.equal(a, b) for a, b in zip(plain.losses, recorded.losses)) and len(plain.losses) == 6
    assert [seen["mode_stack"] for seen in recorded.seen] == [0, 0, 0, 1, 1, 1]
    trace = callback.traces[1]
    assert len(trace.backward_calls()) == 3 and adam_updates(trace) == 2


def test_lightning_every_n_steps():
    callback = ja_lightning.AutogradCallback(every_n_steps=2)
    fit([callback], steps=5)
    assert list(callback.traces) == [0, 2, 4]


def test_lightning_planted_inplace_bug_is_named_at_its_line_and_on_the_exception():
    before = installed()
    plain = fit_raising([], bug_at=0)  # the oracle: PyTorch itself raises in backward
    callback = ja_lightning.AutogradCallback()
    with pytest.warns(UserWarning, match=r"training step 0: jupyter-autograd: 1 problem found"):
        raised = fit_raising([callback], bug_at=0)
    assert str(raised) == str(plain) and "modified by an inplace operation" in str(raised)
    assert frames(raised) == frames(plain)
    culprit = line_of(RegressorSteps.training_step, "h.mul_(2)")
    saved = line_of(RegressorSteps.training_step, "h = torch.sigmoid")
    (diagnosis,) = callback.last_trace.diagnoses
    assert (diagnosis.kind, diagnosis.tensor, diagnosis.line, diagnosis.saved_line) == (
        "saved-tensor-modified", "h", culprit, saved)
    (note,) = raised.__notes__
    assert "(`h`)" in note and "line %d: h.mul_(2)" % culprit in note
    assert installed() == before


def test_lightning_step_that_raises_unrecorded_says_which_step_to_record():
    raised = fit_raising([ja_lightning.AutogradCallback()], bug_at=2)
    assert raised.__notes__ == ["jupyter-autograd: training step 2 raised and was not recorded; to see why, run "
                                "again from the same seed with AutogradCallback(steps=[2])"]
    callback = ja_lightning.AutogradCallback(steps=[2])
    with pytest.warns(UserWarning):
        raised = fit_raising([callback], bug_at=2)
    assert [d.kind for d in callback.traces[2].diagnoses] == ["saved-tensor-modified"]
    assert "(`h`)" in raised.__notes__[0]


def test_lightning_on_exception_false_adds_no_note_but_closes_the_capture():
    before = installed()
    callback = ja_lightning.AutogradCallback(steps=[0], on_exception=False)
    with pytest.warns(UserWarning):
        raised = fit_raising([callback], bug_at=0)
    assert not hasattr(raised, "__notes__")
    assert installed() == before
    assert [d.kind for d in callback.last_trace.diagnoses] == ["saved-tensor-modified"]
    assert not hasattr(fit_raising([ja_lightning.AutogradCallback(on_exception=False)], bug_at=2), "__notes__")


def test_lightning_logs_the_count_to_the_trainers_loggers(tmp_path, caplog):
    from lightning.pytorch.loggers import CSVLogger

    caplog.set_level(logging.INFO)
    fit([ja_lightning.AutogradCallback(steps=[1])], logger=CSVLogger(tmp_path), root=tmp_path)
    (metrics,) = tmp_path.glob("**/metrics.csv")
    rows = metrics.read_text().splitlines()
    column = rows[0].split(",").index("autograd/problems")
    assert [(r.split(",")[column], r.split(",")[rows[0].split(",").index("step")]) for r in rows[1:]
            if r.split(",")[column]] == [("0", "1")]
    assert any("training step 1: jupyter-autograd: no problems found" in r.getMessage() for r in caplog.records)


def test_pytorch_lightning_package_has_its_own_callback():
    assert issubclass(ja_pytorch_lightning.AutogradCallback, pytorch_lightning.Callback)
    assert not issubclass(ja_pytorch_lightning.AutogradCallback, pl.Callback)
    callback = ja_pytorch_lightning.AutogradCallback(steps=[1])
    module = fit([callback], module_package=pytorch_lightning, steps=3)
    assert list(callback.traces) == [1] and [s["mode_stack"] for s in module.seen] == [0, 1, 0]
    with pytest.warns(UserWarning):
        raised = fit_raising([ja_pytorch_lightning.AutogradCallback()], module_package=pytorch_lightning, bug_at=0)
    assert "(`h`)" in raised.__notes__[0]


# -- Hugging Face Trainer ----------------------------------------------------------------------------

class TinyRegressor(nn.Module):
    def __init__(self, bug_at=None):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.bug_at = bug_at  # the forward call (micro-batch) that writes in place
        self.losses = []
        self.seen = []
        self.made = []

    def forward(self, x, labels):
        self.seen.append(installed())
        h = torch.sigmoid(self.lin(x))
        self.made.append(weakref.ref(h))
        if len(self.losses) == self.bug_at:
            h.mul_(2)
        loss = F.mse_loss(h, labels)
        self.losses.append(loss.detach().clone())
        return {"loss": loss}


def train(tmp_path, callbacks, steps=5, bug_at=None, accumulate=1, add_callback=False):
    torch.manual_seed(0)
    model = TinyRegressor(bug_at)
    x, y = data()
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=steps, per_device_train_batch_size=4,
                             gradient_accumulation_steps=accumulate, learning_rate=0.05, report_to=[], use_cpu=True,
                             save_strategy="no", disable_tqdm=True, logging_steps=1, seed=7, optim="adamw_torch")
    trainer = Trainer(model=model, args=args, train_dataset=[{"x": a, "labels": b} for a, b in zip(x, y)],
                      callbacks=None if add_callback else callbacks)
    if add_callback:
        for callback in callbacks:
            trainer.add_callback(callback)
    trainer.train()
    return model, trainer


def train_raising(tmp_path, callbacks, **kwargs):
    with pytest.raises(RuntimeError) as info:
        train(tmp_path, callbacks, **kwargs)
    return info.value


@pytest.mark.parametrize("accumulate", [1, 2])
def test_hf_train_is_bitwise_the_same_with_the_callback(tmp_path, accumulate):
    plain, plain_trainer = train(tmp_path, [], accumulate=accumulate)
    callback = ja_transformers.AutogradCallback(steps=[0, 3])
    recorded, trainer = train(tmp_path, [callback], accumulate=accumulate)
    assert len(plain.losses) == 5 * accumulate
    assert all(torch.equal(a, b) for a, b in zip(plain.losses, recorded.losses))
    for (name, a), b in zip(plain.state_dict().items(), recorded.state_dict().values()):
        assert torch.equal(a, b), name
    assert [e["loss"] for e in trainer.state.log_history if "loss" in e] == [
        e["loss"] for e in plain_trainer.state.log_history if "loss" in e]
    assert list(callback.traces) == [0, 3] and callback.last_trace is callback.traces[3]
    for trace in callback.traces.values():
        assert trace.diagnoses == [] and trace.warnings == []
        assert len(trace.backward_calls()) == accumulate
        assert adam_updates(trace) == 2
    assert [e for e in trainer.state.log_history if "autograd_problems" in e] == [
        {"autograd_problems": 0, "step": 0}, {"autograd_problems": 0, "step": 3}]


def test_hf_steps_not_recorded_run_with_nothing_installed(tmp_path):
    before = installed()
    model, _ = train(tmp_path, [ja_transformers.AutogradCallback(steps=[0, 3])], accumulate=2)
    assert installed() == before
    assert [i for i, seen in enumerate(model.seen) if seen != before] == [0, 1, 6, 7]


def test_hf_callback_keeps_no_tensor_of_the_step_alive(tmp_path):
    plain, _ = train(tmp_path, [])
    recorded, _ = train(tmp_path, [ja_transformers.AutogradCallback(steps=[0, 3])])
    gc.collect()
    assert [r() is None for r in recorded.made] == [r() is None for r in plain.made] == [True] * 5


def test_hf_planted_inplace_bug_is_named_at_its_line_and_on_the_exception(tmp_path, caplog):
    before = installed()
    plain = train_raising(tmp_path, [], bug_at=0)  # the oracle: PyTorch itself raises in backward
    callback = ja_transformers.AutogradCallback()
    raised = train_raising(tmp_path, [callback], bug_at=0)
    assert str(raised) == str(plain) and "modified by an inplace operation" in str(raised)
    assert frames(raised) == frames(plain)  # the callback's wrapper of train() is not in the traceback
    culprit = line_of(TinyRegressor.forward, "h.mul_(2)")
    (diagnosis,) = callback.last_trace.diagnoses
    assert (diagnosis.kind, diagnosis.tensor, diagnosis.line, diagnosis.saved_line) == (
        "saved-tensor-modified", "h", culprit, line_of(TinyRegressor.forward, "h = torch.sigmoid"))
    (note,) = raised.__notes__
    assert "(`h`)" in note and "line %d: h.mul_(2)" % culprit in note
    assert installed() == before
    assert any(r.levelno == logging.WARNING and "training step 0: jupyter-autograd: 1 problem found" in r.getMessage()
               for r in caplog.records)


def test_hf_bug_in_a_later_micro_batch_of_an_accumulated_step(tmp_path):
    callback = ja_transformers.AutogradCallback(steps=[1])
    raised = train_raising(tmp_path, [callback], bug_at=3, accumulate=2)
    trace = callback.traces[1]
    assert len(trace.backward_calls()) == 2  # the first micro-batch's, and the one that raised
    assert [d.kind for d in trace.diagnoses] == ["saved-tensor-modified"] and "(`h`)" in raised.__notes__[0]


def test_hf_step_that_raises_unrecorded_says_which_step_to_record(tmp_path):
    raised = train_raising(tmp_path, [ja_transformers.AutogradCallback()], bug_at=2)
    assert raised.__notes__ == ["jupyter-autograd: training step 2 raised and was not recorded; to see why, run "
                                "again from the same seed with AutogradCallback(steps=[2])"]


def test_hf_exception_outside_the_model_still_ends_the_capture(tmp_path):
    """An exception raised by another callback in the middle of a recorded step (no model code, no
    torch call on its way out) still takes the capture off the stack."""
    from transformers import TrainerCallback

    class Failing(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            raise ValueError("a callback of the user's failed")

    before = installed()
    callback = ja_transformers.AutogradCallback()
    with pytest.raises(ValueError, match="a callback of the user's failed") as info:
        train(tmp_path, [callback, Failing()])
    assert installed() == before
    assert not hasattr(info.value, "__notes__")  # no diagnosis explains it
    assert list(callback.traces) == [0] and len(callback.traces[0].backward_calls()) == 1


def test_hf_callback_added_after_the_trainer_was_made_records_nothing_and_says_so(tmp_path, caplog):
    callback = ja_transformers.AutogradCallback()
    model, _ = train(tmp_path, [callback], add_callback=True)
    assert callback.traces == {} and all(seen["mode_stack"] == 0 for seen in model.seen)
    assert any("was added after the Trainer was made" in r.getMessage() for r in caplog.records)


# -- the choice of steps -----------------------------------------------------------------------------

def test_step_choice_is_checked():
    assert StepCapture().steps == {0}
    assert StepCapture(every_n_steps=10).steps == frozenset()
    assert StepCapture(steps=[5], every_n_steps=10).wanted(5) and StepCapture(every_n_steps=10).wanted(20)
    for bad in ({"steps": [-1]}, {"steps": [1.0]}, {"every_n_steps": 0}, {"every_n_steps": True}):
        with pytest.raises(ValueError):
            StepCapture(**bad)
    with pytest.raises(TypeError):
        StepCapture(on_exception="yes")


def test_the_package_imports_no_framework():
    """The frameworks are optional: jupyter_autograd and its integrations package import neither."""
    import subprocess

    code = ("import sys, jupyter_autograd, jupyter_autograd.integrations; "
            "print(sorted(m for m in ('lightning', 'pytorch_lightning', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
