"""What a trained model learned: the evaluate stage, and `pretrain generate`."""
