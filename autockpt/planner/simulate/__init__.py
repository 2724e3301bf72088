"""Stage between runtime and measure, simulate: what a measured step reports (its profile), the
record of every storage's life beside it, and the profile of a plan worked out from that record
in plain Python instead of another step on fake tensors (NOTE [One record, many plans]).
"""
