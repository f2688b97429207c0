"""Compiler passes, one per file, each `Graph -> Graph`; `pipeline.py` lists the phases."""
