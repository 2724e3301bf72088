"""The training loop: the trainer, its batches prefetched, every step's memory held to the
budget, and the plan made again when a step goes over."""
