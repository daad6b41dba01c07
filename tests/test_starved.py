"""A cut that starves what the step trains (issue 29, principle 2): a `.detach()`, `.data`, `.item()` or
NumPy round trip, or an op run with grad off on a tensor that had a graph, that leaves a term of the
loss giving the optimizer step after its backward nothing, though the term's value was computed from
the parameters that step updates. graph-cut, reason "starved", named at the cut.

The oracle is PyTorch's alone: the gradients each optimizer step finds, read by a step pre-hook on a
plain run of the program, as it is, with the cut taken away, and with the term dropped from the loss.
For a starving cut, the step's gradients with the cut equal those without the term (the term gives
the step nothing), and without the cut they differ (it would train the step). For a correct
look-alike, either the cut changes nothing the step trains (a GAN's fake batch in the
discriminator's step, a target network), or the term, cut as it is, still trains the step (a
detached baseline, a stop-gradient target)."""
import inspect
import os
import pathlib
import tempfile
import textwrap

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.optim.optimizer import register_optimizer_step_pre_hook

import jupyter_autograd as ja

from . import scenario_runner as runner

CORPUS = pathlib.Path(__file__).parent / "corpus"

# file -> (the step's line, the cut taken away, the term dropped, what else both of those need to run:
# a step moved before the backward that would otherwise run into its in-place update).
ORACLE = {
    "sac_actor_loss_detaches_the_critic_value.py": (
        "self.actor_optim.step()", [("q_actions_.detach()).mean()", "q_actions_).mean()")],
        [("(alpha * log_prob - q_actions_.detach()).mean()", "(alpha * log_prob).mean()")],
        [("self.qf1_optim.step()", "pass"), ("self.qf2_optim.step()", "pass")]),
    "image2reverb_generator_step_detaches_the_fake_spectrogram.py": (
        ("opts[optimizer_idx].step()", 1),  # the generator's step, the second at that line (the encoder's first)
        [("d_fake2 = self.d(fake_spec.detach(), f)", "d_fake2 = self.d(fake_spec.detach() if optimizer_idx == 0 else fake_spec, f)")],
        [("G_loss = G_loss1 + (LAMBDA * G_loss2)", "G_loss = (G_loss1 if optimizer_idx == 0 else 0) + (LAMBDA * G_loss2)")], []),
    "csa_cdgan_generator_loss_adds_a_detached_discriminator_score.py": (
        "optimizer_g.step()", [("pred_fake = netd(fake).detach()", "pred_fake = netd(fake)")],
        [("G_WEIGHT * err_g + D_WEIGHT * err_d_fake", "G_WEIGHT * err_g")], []),
    "deep_cage_regularizer_on_detached_mvc_weights.py": (
        "optimizer.step()", [("    weights = weights.detach()  # @culprit\n", "")],
        [("train(net, AllLosses(), batches)", "train(net, AllLosses(mvc_weight=0), batches)")], []),
    "nad_attention_losses_detached_before_backward.py": (
        "optimizer.step()", [(".detach() * opt.beta", " * opt.beta")],
        [("at_loss = at1_loss + at2_loss + at3_loss + cls_loss", "at_loss = cls_loss")], []),
    "streamvc_feature_loss_detaches_the_feature_difference.py": (
        "optimizer_generator.step()", [("real[i][j]).detach(), mask_ratio)", "real[i][j]), mask_ratio)")],
        [("lambda_feature=100,", "lambda_feature=0,")], []),
    "fl_mrcm_adversarial_loss_taken_out_with_item.py": (
        "optimizer.step()", [("loss_adv_g = loss_adv_g.detach().item()  # @culprit", "pass")],
        [("loss = L1_loss + loss_adv_g", "loss = L1_loss")], []),
    "papo_aug_entropy_from_log_probs_computed_without_grad.py": (
        "self.actor_optimizer.step()",
        [('batch["aug_log_probs"] = actor.compute_log_prob(', 'batch["aug_log_probs"] = actor._forward_micro_batch(')],
        [("            pg_loss = pg_loss + self.aug_entropy_loss_coef * aug_entropy_loss\n", "")], []),
    # correct look-alikes
    "ppo_advantages_from_detached_state_values_is_fine.py": (
        "self.optimizer.step()", [("advantages = rewards - state_values.detach()", "advantages = rewards - state_values")],
        [("loss = -torch.min(surr1, surr2) + 0.5", "loss = 0.5")], []),
    "a2c_returns_minus_detached_values_two_backwards_is_fine.py": (
        "optimizer.step()", [("advantages = (returns - values).detach()", "advantages = (returns - values)")],
        [("    policy_loss.backward()\n", "")], [("policy_loss.backward()", "policy_loss.backward(retain_graph=True)")]),
    "sac_critic_loss_against_a_detached_target_is_fine.py": (
        "self.soft_q_optimizer1.step()", [("q_value_loss1 = self.soft_q_criterion1(predicted_q_value1, target_q_value.detach())",
                                           "q_value_loss1 = self.soft_q_criterion1(predicted_q_value1, target_q_value)")],
        [("q_value_loss1 = self.soft_q_criterion1(predicted_q_value1, target_q_value.detach())",
          "q_value_loss1 = 0 * predicted_q_value1.sum()")],
        [("q_value_loss1.backward()", "q_value_loss1.backward(retain_graph=True)")]),
    "pix2pixhd_feature_matching_detaches_the_real_features_is_fine.py": (
        "optimizer_G.step()", [("pred_real[i][j].detach())", "pred_real[i][j])")],
        [("loss_G = loss_dict['G_GAN'] + loss_dict['G_GAN_Feat']", "loss_G = loss_dict['G_GAN']")],
        [("loss_G.backward()", "loss_G.backward(retain_graph=True)")]),
    "streamvc_feature_loss_detaches_only_the_real_features_is_fine.py": (
        "optimizer_generator.step()", [("real[i][j].detach()), mask_ratio)", "real[i][j]), mask_ratio)")],
        [("lambda_feature=100,", "lambda_feature=0,")], []),
    "nad_attention_losses_kept_in_the_graph_is_fine.py": (
        "optimizer.step()", [],
        [("at_loss = at1_loss + at2_loss + at3_loss + cls_loss", "at_loss = cls_loss")], []),
    "grpo_ratio_of_logp_to_its_detached_self_is_fine.py": (
        "optimizer.step()", [("torch.exp(logp - logp.detach())", "torch.exp(logp - logp)")],
        [("per_token_loss = torch.exp(logp - logp.detach()) * advantages.unsqueeze(1)", "per_token_loss = 0 * logp")], []),
    "advsemiseg_adversarial_loss_through_the_frozen_discriminator_is_fine.py": (
        "optimizer_D.step()", [("pred = pred.detach()", "pred = pred")],
        [("        loss_D = bce_loss(D_out, make_D_label(pred_label, D_out.shape)) / 2\n        loss_D.backward()\n", "")],
        [("loss.backward()", "loss.backward(retain_graph=True)")]),
    "mean_teacher_consistency_to_detached_ema_logits_is_fine.py": (
        "optimizer.step()", [("ema_logit = Variable(ema_logit.detach().data, requires_grad=False)", "pass")],
        [("loss = class_loss + consistency_loss", "loss = class_loss")], []),
    "simsiam_stop_gradient_on_the_projections_is_fine.py": (
        "optimizer.step()", [("return p1, p2, z1.detach(), z2.detach()", "return p1, p2, z1, z2")],
        [("loss = -(criterion(p1, z2).mean() + criterion(p2, z1).mean()) * 0.5", "loss = 0 * p1.sum()")], []),
}


def _step_grads(path, rewrites, step):
    """The gradients an optimizer step finds (`step`: its line, or (its line, which of the steps run at
    it)), read by a step pre-hook, running the program plain with the rewrites made: a list with each
    parameter's grad or None."""
    src = path.read_text()
    for old, new in rewrites:
        assert old in src, (path.name, old)
        src = src.replace(old, new)
    lines = src.splitlines()
    text, which = step if isinstance(step, tuple) else (step, 0)
    found = []

    def hook(optimizer, args, kwargs):
        frame = inspect.currentframe()
        while frame is not None and frame.f_code.co_filename != str(path):
            frame = frame.f_back
        if frame is not None and lines[frame.f_lineno - 1].strip() == text:
            found.append([None if p.grad is None else p.grad.detach().clone()
                          for group in optimizer.param_groups for p in group["params"]])

    handle = register_optimizer_step_pre_hook(hook)
    try:
        torch.manual_seed(1234)
        exec(compile(src, str(path), "exec"), {"__name__": "__main__", "__file__": str(path)})
    finally:
        handle.remove()
    return found[which]


def _same(a, b):
    """The same gradients, a None taken as zeros."""
    def zero(g):
        return g is None or not g.any()
    return len(a) == len(b) and all(zero(x) and zero(y) if x is None or y is None else torch.allclose(x, y, atol=1e-7)
                                    for x, y in zip(a, b))


@pytest.mark.parametrize("name", sorted(ORACLE))
def test_the_oracle_says_which_cuts_starve_the_step(name):
    path = CORPUS / name
    step, uncut, dropped, also = ORACLE[name]
    bug = runner.load(str(path)).kind == "graph-cut"
    with_cut = _step_grads(path, [], step)
    without_term = _step_grads(path, dropped, step)
    if bug:
        assert _same(with_cut, without_term), "the cut term still trains the step"
        assert not _same(_step_grads(path, uncut + also, step), _step_grads(path, dropped + also, step)), \
            "without the cut the term would not train the step either"
    else:
        unchanged = _same(with_cut, _step_grads(path, uncut + also, step))
        assert unchanged or not _same(with_cut, without_term), "the cut starves the step"


# -- the rule on small programs ------------------------------------------------------------------

def _run(source):
    """Run a program (from a file of its own, so that its lines can be read) plain and captured: the
    trace, and the line of `# CULPRIT`."""
    source = textwrap.dedent(source)
    handle, filename = tempfile.mkstemp(suffix=".py", prefix="starved_")
    with os.fdopen(handle, "w") as f:
        f.write(source)
    code = compile(source, filename, "exec")
    torch.manual_seed(0)
    exec(code, {"__name__": "__main__"})
    torch.manual_seed(0)
    with ja.capture() as trace:
        exec(code, {"__name__": "__main__"})
    culprit = next((i for i, line in enumerate(source.splitlines(), 1) if "# CULPRIT" in line), None)
    assert not trace.warnings, trace.warnings
    return trace, culprit


def _found(trace):
    return [(d.kind, d.line) for d in trace.diagnoses]


HEADS = """
import torch
from torch import nn
from torch.distributions import Normal
torch.manual_seed(0)
actor, critic = nn.Linear(3, 2), nn.Linear(3 + 1, 1)
actor_opt = torch.optim.Adam(actor.parameters(), lr=1e-2)
s = torch.randn(5, 3)
"""


def test_a_detached_term_added_to_the_loss_is_named_at_the_detach():
    trace, culprit = _run(HEADS + """
    for _ in range(2):
        mu, log_std = actor(s).chunk(2, dim=-1)
        dist = Normal(mu, log_std.exp())
        a = dist.rsample()
        q = critic(torch.cat([s, a], dim=1)).squeeze(1)
        loss = (0.1 * dist.log_prob(a).squeeze(1) - q.detach()).mean()  # CULPRIT
        actor_opt.zero_grad()
        loss.backward()
        actor_opt.step()
    """.replace("\n    ", "\n"))
    assert _found(trace) == [("graph-cut", culprit)]
    d = trace.diagnoses[0]
    assert d.tensor == "q" and "actor.weight" in d.message and "constant" in d.message
    assert "q)" in d.fix.split("\n")[1] and ".detach()" not in d.fix.split("\n")[1]


def test_a_term_whose_graph_reaches_only_what_the_step_does_not_update():
    trace, culprit = _run(HEADS + """
    critic_opt = torch.optim.Adam(critic.parameters(), lr=1e-2)
    for _ in range(2):
        a = torch.tanh(actor(s)[:, :1])
        actor_loss = -critic(torch.cat([s, a.detach()], dim=1)).mean() + 0.01 * a.pow(2).mean()  # CULPRIT
        actor_opt.zero_grad()
        actor_loss.backward()
        actor_opt.step()
    """.replace("\n    ", "\n"))
    assert _found(trace) == [("graph-cut", culprit)]
    assert "critic.weight" in trace.diagnoses[0].message


def test_sample_instead_of_rsample_is_named_at_the_sample_with_rsample_as_the_fix():
    trace, culprit = _run(HEADS + """
    for _ in range(2):
        mu, log_std = actor(s).chunk(2, dim=-1)
        dist = Normal(mu, log_std.exp())
        a = dist.sample()  # CULPRIT
        loss = (0.1 * dist.log_prob(a) - critic(torch.cat([s, a], dim=1))).mean()
        actor_opt.zero_grad()
        loss.backward()
        actor_opt.step()
    """.replace("\n    ", "\n"))
    assert _found(trace) == [("graph-cut", culprit)]
    assert "a = dist.rsample()" in trace.diagnoses[0].fix


def test_a_numpy_round_trip_of_a_term_is_a_cut_too():
    trace, culprit = _run("""
    import numpy as np
    import torch
    from torch import nn
    torch.manual_seed(0)
    net = nn.Linear(4, 3)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(2):
        out = net(torch.randn(6, 4))
        penalty = torch.from_numpy(np.abs(out.detach().numpy()))  # CULPRIT
        loss = (out - 1).pow(2).mean() + 0.1 * penalty.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    """)
    assert _found(trace) == [("graph-cut", culprit)]


def test_no_one_line_fix_when_a_step_moved_what_the_cut_value_was_computed_with():
    trace, culprit = _run(HEADS + """
    critic_opt = torch.optim.Adam(critic.parameters(), lr=1e-2)
    for _ in range(2):
        a = torch.tanh(actor(s)[:, :1])
        q = critic(torch.cat([s, a], dim=1))
        actor_loss = (a.pow(2) - q.detach()).mean()  # CULPRIT
        critic_loss = (critic(torch.cat([s, torch.rand(5, 1)], dim=1)) - 1).pow(2).mean()
        critic_opt.zero_grad()
        critic_loss.backward()
        critic_opt.step()
        actor_opt.zero_grad()
        actor_loss.backward()
        actor_opt.step()
    """.replace("\n    ", "\n"))
    assert _found(trace) == [("graph-cut", culprit)]
    fix = trace.diagnoses[0].fix
    assert fix.startswith("There is no one-line fix") and "critic_opt.step()" in fix


def test_a_python_number_taken_out_of_a_term_and_added_to_the_loss():
    trace, culprit = _run(HEADS + """
    for _ in range(2):
        out = actor(s)
        penalty = out.pow(2).mean()
        penalty = penalty.detach().item()  # CULPRIT
        loss = (out - 1).abs().mean() + 0.1 * penalty
        actor_opt.zero_grad()
        loss.backward()
        actor_opt.step()
    """.replace("\n    ", "\n"))
    assert _found(trace) == [("graph-cut", culprit)]
    assert trace.diagnoses[0].fix.startswith("There is no one-line fix")


# -- correct look-alikes ---------------------------------------------------------------------------

FINE = {
    "a detached baseline that multiplies the log-probability": """
        value = nn.Linear(3, 1)
        opt = torch.optim.Adam(list(actor.parameters()) + list(value.parameters()), lr=1e-2)
        for _ in range(2):
            dist = Normal(actor(s)[:, 0], 1.0)
            a = dist.sample()
            v = value(s).squeeze(1)
            ret = torch.randn(5)
            loss = -(dist.log_prob(a) * (ret - v).detach()).mean() + (ret - v).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        """,
    "a semi-gradient TD target from the same network": """
        q_net = nn.Linear(3, 2)
        opt = torch.optim.SGD(q_net.parameters(), lr=0.1)
        for _ in range(2):
            s2, r = torch.randn(5, 3), torch.randn(5)
            target = r + 0.9 * q_net(s2).max(1)[0].detach()
            loss = (q_net(s).gather(1, torch.zeros(5, 1, dtype=torch.long)).squeeze(1) - target).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        """,
    "a GAN's detached fake batch in the discriminator's step": """
        G, D = nn.Linear(2, 3), nn.Linear(3, 1)
        opt_d, opt_g = torch.optim.Adam(D.parameters()), torch.optim.Adam(G.parameters())
        for _ in range(2):
            fake = G(torch.randn(4, 2))
            d_loss = F.softplus(-D(torch.randn(4, 3))).mean() + F.softplus(D(fake.detach())).mean()
            opt_d.zero_grad()
            d_loss.backward()
            opt_d.step()
            g_loss = F.softplus(-D(fake)).mean()
            opt_g.zero_grad()
            g_loss.backward()
            opt_g.step()
        """,
    "truncated BPTT: the carried state detached at each chunk": """
        cell = nn.RNNCell(3, 4)
        opt = torch.optim.SGD(cell.parameters(), lr=0.1)
        h = torch.zeros(2, 4)
        for chunk in range(3):
            h = h.detach()
            for t in range(2):
                h = cell(torch.randn(2, 3), h)
            loss = h.pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        """,
    "a target network's value added to the loss": """
        import copy
        target = copy.deepcopy(actor)
        for _ in range(2):
            loss = (actor(s) - target(s).detach()).pow(2).mean() + target(s).detach().mean()
            actor_opt.zero_grad()
            loss.backward()
            actor_opt.step()
        """,
    "a detached value of the previous step kept in the loss": """
        prev = None
        for _ in range(3):
            out = actor(s).pow(2).mean()
            loss = out + (prev.detach() if prev is not None else 0)
            actor_opt.zero_grad()
            loss.backward()
            actor_opt.step()
            prev = out
        """,
    "numbers taken out for a coefficient, a count and a report": """
        scale = torch.rand(()).item()
        for _ in range(2):
            out = actor(s)
            n = (out > 0).sum().item()
            report = out.pow(2).mean().item()
            loss = out.abs().sum() / max(n, 1) * scale + 1.0
            actor_opt.zero_grad()
            loss.backward()
            actor_opt.step()
        """,
    "a detached term of what another optimizer updates, stepped after another backward": """
        critic_opt = torch.optim.Adam(critic.parameters(), lr=1e-2)
        for _ in range(2):
            a = torch.tanh(actor(s)[:, :1])
            critic_loss = critic(torch.cat([s, a.detach()], dim=1)).pow(2).mean()
            critic_opt.zero_grad()
            critic_loss.backward()
            critic_opt.step()
            actor_loss = -critic(torch.cat([s, a], dim=1)).mean()
            actor_opt.zero_grad()
            actor_loss.backward()
            actor_opt.step()
        """,
}


@pytest.mark.parametrize("case", sorted(FINE))
def test_correct_look_alikes_stay_quiet(case):
    trace, _ = _run(HEADS + "import torch.nn.functional as F\n" + textwrap.dedent(FINE[case]))
    assert _found(trace) == []
