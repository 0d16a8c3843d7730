"""Hydra sweeper plugin: one job per named row (heterogeneous overrides), skipping finished rows."""
