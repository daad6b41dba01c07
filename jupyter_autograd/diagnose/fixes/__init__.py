"""The fixes a diagnosis suggests, and the wording shared by messages and fixes.

Plain text from plain data. A fix is prose with code in it, by one convention that
tests/test_fixes.py checks on every scenario (and that every new kind of diagnosis follows):

* Code blocks. A line of a fix indented by four spaces (or more) is code; a run of such lines
  is one block which, dedented by four, compiles on its own (`compile(block, "", "exec")`).
  It uses only the user's own names, `torch`, `nn` and `F`, and every method and attribute
  it names exists (on torch.Tensor, nn.Module, the optimizer, or the module it is read from).
* Drop-in replacements. A block right after a prose line that ends with
  "Replace the culprit line with:" replaces the diagnosis's culprit line (`Diagnosis.line`
  in `Diagnosis.filename`), re-indented to that line's indentation. That is the whole fix: the
  test applies it and checks that the diagnosis is gone and that backward then gives the
  gradients of the clean program. Use it only when that is true.
* A line other than the culprit. A block right after a prose line that ends with
  "Replace line N of FILE with:" (`REPLACE_LINE`; FILE as `Trace.file_label` names it, N its line
  number there) replaces that line, re-indented to its indentation: the same whole fix, for a
  mistake made where something was built (`nn.ReLU(inplace=True)` in a model's `__init__`).
  "Replace lines N to M of FILE with:" (`REPLACE_LINES`) replaces those lines, the culprit's first,
  for a change that the lines right after the culprit make too (two edits of one weight).
* The program's meaning stays. A replacement computes what the program meant: it may stop a
  write that broke backward, never drop it (rebinding a name that is only an alias of a module's
  buffer leaves the buffer as it was) or stop a change that other code reads.
* No guessing. When no single change is right (the cause is elsewhere, or it depends on what the
  user meant), the fix starts with "There is no one-line fix:" and says what to change where;
  its code blocks are then examples, still valid code.
* Names in backticks in the prose are real too: a method written `.item()` or `x.detach()`
  exists on a tensor, a module or an optimizer; `torch.a.b()` can be looked up from `torch`.
"""
from .errors import (backward_error_fix, ddp_ready_twice_fix, ddp_unused_fix, invalid_gradient_fix,
                     nonleaf_requires_grad_fix, nonscalar_fix, not_differentiable_fix, second_order_fix, starved_fix)
from .raised import (applied_function_fix, checkpoint_under_transform_fix, fp16_fix, needs_grad_fix, no_grad_cut_fix, nonleaf_copied_fix,
                     nonleaf_optimized_fix, not_a_parameter_fix, numpy_fix, reentrant_fix, setup_context_fix)
from .words import (NO_ONE_LINE_FIX, REPLACE, REPLACE_LINE, REPLACE_LINES, SAVED_COPY_REMEDY, also_changed,
                    backward_outcome, code, counted, cut_spelling, describe_write, line_ref, where)
from .writes import (accumulation_fix, data_fix, data_swap_fix, inference_tensor_fix, inplace_fix, kept_fix, leaf_fix,
                     view_write_fix)

__all__ = ["backward_error_fix", "ddp_ready_twice_fix", "ddp_unused_fix", "invalid_gradient_fix",
           "nonleaf_requires_grad_fix", "nonscalar_fix", "not_differentiable_fix", "second_order_fix", "starved_fix",
           "NO_ONE_LINE_FIX", "REPLACE", "REPLACE_LINE", "REPLACE_LINES", "SAVED_COPY_REMEDY", "also_changed",
           "backward_outcome", "code", "counted", "cut_spelling", "describe_write", "line_ref", "where",
           "accumulation_fix", "data_fix", "data_swap_fix", "inference_tensor_fix", "inplace_fix", "kept_fix",
           "leaf_fix", "view_write_fix", "applied_function_fix", "fp16_fix", "needs_grad_fix", "no_grad_cut_fix",
           "nonleaf_copied_fix", "nonleaf_optimized_fix", "not_a_parameter_fix", "numpy_fix", "reentrant_fix", "setup_context_fix", "checkpoint_under_transform_fix"]
