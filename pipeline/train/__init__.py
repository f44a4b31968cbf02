"""Distributed training: the torchrun entrypoint and the components its trainer composes."""
