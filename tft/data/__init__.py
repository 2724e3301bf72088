"""Intraday bars from Parquet as the model's windows: the file's columns and their roles,
categories and scales, the row cache a file larger than memory is streamed through, the splits
and the batches."""
