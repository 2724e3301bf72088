"""Stage 1, trace: a model and example inputs in, a chain of candidate segments out.

torch.fx where the forward traces (cut where few bytes cross, in-place writes and opaque
submodules found); whole submodules found with forward hooks where it does not.
"""
