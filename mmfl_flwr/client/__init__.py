"""Client side: local training and evaluation of the models."""
