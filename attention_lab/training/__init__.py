"""training: the config schema (config.py), optimizers and schedules (optim.py), the evaluation callbacks and the
training film (callbacks.py), TrainState (state.py), the loop's parts (loop.py), what a run starts from
(start.py), one run's objects and its ends (run.py: Run, wrap_model, finish), the whole-split evaluation
(evaluate.py). train.py strings them together.

May import: every room below it (model/, data/, runtime/, store/, interp/, viewer/, interop/).
"""
