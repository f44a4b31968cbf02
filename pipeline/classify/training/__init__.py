"""Training a quality classifier (fastText, or logistic regression over sentence embeddings): the
train_classifier stage."""
