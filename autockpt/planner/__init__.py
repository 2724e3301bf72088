"""The planner: a library that fits one training step of any ``nn.Module`` under a budget.

trace -> measure -> solve -> apply -> verify, and the memory accounting they share. It does no
I/O (no printing, no files) and imports nothing from :mod:`autockpt.training`, the command
line or ``tft``; the public entry points are re-exported by :mod:`autockpt`.
"""
