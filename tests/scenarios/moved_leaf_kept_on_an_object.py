# SAC's temperature: log_alpha is made with requires_grad=True and then moved to float64 to
# match the critic, and kept on the agent. The moved copy is not a leaf: its .grad stays None,
# and the hand-written update below silently never runs. Diagnosed although the tensor only
# lives on the object while it trains.
# expect: missing-grad tensor=self.log_alpha
# outcome: ok
import torch


class Agent:
    def __init__(self, target_entropy=-2.0):
        self.log_alpha = torch.zeros(1, requires_grad=True).to(torch.float64)  # @culprit
        self.target_entropy = target_entropy

    def update_alpha(self, log_probs, lr=0.01):
        alpha_loss = -(self.log_alpha * (log_probs + self.target_entropy).detach()).mean()
        alpha_loss.backward()
        with torch.no_grad():
            if self.log_alpha.grad is not None:
                self.log_alpha -= lr * self.log_alpha.grad
        return alpha_loss.item()


torch.manual_seed(0)
agent = Agent()
for _ in range(2):
    agent.update_alpha(torch.randn(8, dtype=torch.float64))
log_alpha = agent.log_alpha
