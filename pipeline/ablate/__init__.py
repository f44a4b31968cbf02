"""Data ablations: does this recipe, or this one change to it, give a better model? (docs/ablations.md)"""
