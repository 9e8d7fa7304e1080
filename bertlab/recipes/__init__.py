"""Recipes that train with `bertlab.training` and judge with `bertlab.analysis`: the offline default's heads."""
