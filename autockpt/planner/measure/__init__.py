"""Stage 2, measure: a chain and the actions chosen per segment in, the bytes of one training
step out (on fake tensors, NOTE [Step accounting]), with which segments and whether the whole
step can be split along the batch, and what one of several ranks holds.
"""
