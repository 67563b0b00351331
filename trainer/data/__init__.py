"""Data: the VERL parquet schema, its validator, the prompt loader and the synthetic math generator."""
