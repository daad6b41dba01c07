"""The outputs in a real browser (Chromium, Playwright) when things go wrong: a widget whose
analysis failed in part says so; in JupyterLab, "Run All" runs the cell after a failing
%%autograd cell of a fresh kernel."""
import pytest

from .test_browser import browser_type_launch_args  # noqa: F401  (Debian's Chromium)

pytestmark = pytest.mark.browser


def test_the_widget_says_its_analysis_is_incomplete(page, tmp_path, monkeypatch):
    import torch

    import jupyter_autograd as ja
    from jupyter_autograd.diagnose import flow
    from jupyter_autograd.widget import save_html

    def fails(trace):
        raise RuntimeError("injected fault in the NaN rule")

    monkeypatch.setattr(flow, "nan_gradient", fails)
    x = torch.ones(3, requires_grad=True)
    with ja.capture() as trace:
        y = x.exp()
        y += 1
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(save_html(trace, tmp_path / "report.html").as_uri())
    page.wait_for_selector("body[data-ready='1'] .ja-root", timeout=30_000)
    root = page.locator(".ja-root")
    lost = root.locator(".ja-warnings")
    assert lost.is_visible()
    said = " ".join(lost.inner_text().split())
    assert said.startswith("The analysis is incomplete:") and "injected fault in the NaN rule" in said, said
    verdict = root.locator(".ja-diagnoses").inner_text()
    assert "No problems found." not in verdict  # never the all-clear next to a failed analysis
    assert root.locator(".ja-diagnosis").count() or "in what was analysed" in verdict, verdict
    assert not errors, errors
