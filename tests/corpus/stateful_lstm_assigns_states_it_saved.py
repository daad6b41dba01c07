# A stateful LSTM as Keras 3 runs it on the torch backend (keras issue 20875): the states live in
# non-trainable Variables, each step reads them (`h_tm1 @ recurrent_kernel`, `f * c_tm1` save them),
# and after the sequence the layer assigns the final states back with an in-place `copy_` under
# no_grad. The saved initial states were overwritten, so the batch's backward fails.
# expect: saved-tensor-modified
# outcome: raises RuntimeError
import torch
from torch import nn


class Variable:
    def __init__(self, value, trainable=True):
        self.trainable = trainable
        self._value = nn.Parameter(value, requires_grad=trainable)

    @property
    def value(self):
        return self._value

    def assign(self, value):
        with torch.no_grad():
            self.value.copy_(value)  # @culprit


class LSTMCell(nn.Module):
    def __init__(self, input_dim, units):
        super().__init__()
        self.units = units
        self.kernel = nn.Parameter(torch.randn(input_dim, 4 * units) * 0.3)
        self.recurrent_kernel = nn.Parameter(torch.randn(units, 4 * units) * 0.3)
        self.bias = nn.Parameter(torch.zeros(4 * units))

    def forward(self, inputs, states):
        h_tm1, c_tm1 = states
        z = inputs @ self.kernel + h_tm1 @ self.recurrent_kernel + self.bias  # @saved
        z0, z1, z2, z3 = z.split(self.units, dim=1)
        i, f, o = torch.sigmoid(z0), torch.sigmoid(z1), torch.sigmoid(z3)
        c = f * c_tm1 + i * torch.tanh(z2)  # @saved
        h = o * torch.tanh(c)
        return h, [h, c]


class RNN(nn.Module):
    def __init__(self, cell, batch_size, stateful=True):
        super().__init__()
        self.cell, self.stateful = cell, stateful
        self.states = [Variable(torch.zeros(batch_size, cell.units), trainable=False) for _ in range(2)]

    def inner_loop(self, sequences, initial_state):
        def step(inputs, states):
            return self.cell(inputs, states)

        states = initial_state
        for t in range(sequences.shape[1]):
            output, states = step(sequences[:, t], states)
        return output, states

    def forward(self, sequences):
        initial_state = [v.value for v in self.states]
        last_output, states = self.inner_loop(sequences, initial_state)
        if self.stateful:
            for self_state, state in zip(self.states, states):
                self_state.assign(state)
        return last_output


torch.manual_seed(0)
batch_size, time_steps, num_features, units = 4, 3, 2, 5
model = nn.Sequential(RNN(LSTMCell(num_features, units), batch_size), nn.Linear(units, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for _ in range(2):
    x, y = torch.randn(batch_size, time_steps, num_features), torch.randn(batch_size, 1)
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
