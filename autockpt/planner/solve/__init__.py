"""Stage 3, solve: measured profiles and their seconds in, a decision out (one action per
segment and a micro-batch count) with the least extra time under the budget, or a refusal
naming the minimum.
"""
