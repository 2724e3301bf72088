"""Where bars come from beyond one Parquet file: a folder of them read as one table."""
