"""Seconds: a step's measured profile in, what each option adds to the step's time out;
estimated from FLOPs and bytes, or timed on the real model (the stopwatch).
"""
