"""Synthetic futures bars for demos and tests, with a planted signal whose truth is known."""
