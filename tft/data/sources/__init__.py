"""Where bars come from beyond one Parquet file: the data paths of a run as one source
(:mod:`.data_source`), and a folder, a pattern or several paths of files read as one table
(:mod:`.parquet_folder`)."""
